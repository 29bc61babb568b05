"""daemon.py: `lbctl run`, the controller daemon — keep a balancer instance matching a config file.

At start it loads the instance, or adopts the one already loaded (after a restart or a crash the
program is never reloaded, so forwarding and sessions carry on), and applies the config. Then it
waits for three kinds of event:

* a real changes health (``fall`` failed probes in a row: down; ``rise`` good ones: up): the config
  is applied again with the down reals passed to ``Instance.apply(down=...)``, so their weight is 0
  (no new flows) while their existing sessions continue through the session tables;
* SIGHUP: the file is read again and applied through the same transactional apply; a file that
  does not validate, or an apply the datapath refuses, is logged and the running state is kept;
* SIGTERM or SIGINT: health checks and the metrics endpoint stop and the process exits 0, leaving
  the datapath loaded and forwarding (``lbctl unload`` removes it);
* a neighbour or route change (``nexthop_mac = "auto"``): the next hop is resolved again and, when
  its MAC moved, the config applied again, which rewrites the datapath's setting;
* a request on its control socket (balancer/control.py), from an `lbctl` that found the instance
  owned: ``upgrade`` swaps the program behind the links (maps, sessions and health state stay),
  ``reload`` does what SIGHUP does and answers how it went.

When the config names an object (``datapath.object``) that is not the one running (another path, or
the same file rebuilt), a start that adopts the instance and a reload both upgrade to it.

Reals of a VIP with a health check start healthy, except those the instance's state recorded as
down (a restarted daemon keeps draining them until they pass ``rise`` probes). Health checks with
``via = "tunnel"`` load ``healthcheck.o`` (beside the balancer object) and attach its ``hc_encap``
program to tc egress of the instance's interfaces while the daemon runs; those links are not
pinned, so they go with the process. Logs are JSON lines on stderr (``balancer/logs.py``); metrics
are served at ``metrics.listen`` (``balancer/metrics.py``).

Under systemd (``Type=notify``, ``packaging/lbctl.service``) the daemon sends ``READY=1`` once the
datapath is loaded or adopted and the config applied, ``RELOADING=1`` then ``READY=1`` around a
SIGHUP reload, ``STOPPING=1`` on SIGTERM, and ``WATCHDOG=1`` from its event loop when the unit sets
``WatchdogSec=`` (``balancer/sdnotify.py``).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import os
import platform
import queue
import signal
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from balancer import _abi, control, controller, health, nexthop, objects, preflight
from balancer import config as cfg
from balancer.controller import DEFAULT_OBJECT, Instance
from balancer.errors import ConfigError, LbError, crash_report
from balancer.logs import Logger
from balancer.metrics import MetricsServer, Snapshot, registry_for
from balancer.sdnotify import Notifier

__all__ = ["Daemon", "run"]

_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
FOLLOW_RESOLVE_S = 1.0  # how long a re-resolution after a routing change may solicit the neighbour


@dataclass(frozen=True)
class _Signal:
    signum: int


@dataclass(frozen=True)
class _RoutingChanged:
    """A neighbour or route changed in the kernel (balancer/nexthop.py Watch)."""


Event = _Signal | health.Transition | control.Request | _RoutingChanged


def _version() -> str:
    try:
        return importlib.metadata.version("l4lab")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed as a package)"


class Daemon:
    """One running controller: the instance, its config, the health monitor and the metrics server."""

    def __init__(self, config_path: str, name: str, log: Logger, notifier: Notifier | None = None) -> None:
        self.config_path = config_path
        self.name = name
        self.log = log
        self.notifier = notifier or Notifier(None)
        self.events: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self.lock = threading.Lock()  # apply (main thread) against scrapes (metrics thread)
        self.applies: dict[tuple[str, bool], int] = {}
        self.instance: Instance | None = None
        self.config = cfg.Config()
        self.monitor = health.Monitor(self.events.put)
        self.metrics: MetricsServer | None = None
        self.registry = registry_for(self.scrape)
        self.last_reload: tuple[bool, float] = (False, 0.0)  # the last start/SIGHUP apply: ok, when it last was
        self.tunnel: health.TunnelEncap | None = None
        self.loaded = False  # whether this start loaded the instance (rather than adopting it)
        self.control: control.Server | None = None
        self.watch = nexthop.Watch(self._routing_changed)
        self._routing_pending = threading.Event()
        self._lost: str | None = None  # the MAC kept while the next hop could not be resolved (logged once)

    # -- start ---------------------------------------------------------------------------------

    def start(self, interfaces: Sequence[str], mode: str | None, obj: str = "", force_reload: bool = False) -> None:
        """Read the config, check the host, bind metrics, load or adopt the instance, apply, then
        start probes and metrics. Everything that can be refused is checked before the datapath is
        touched; a datapath this start loaded itself is unloaded again if a later step fails."""
        self.config = self._read_config()
        m = self.config.metrics
        self.metrics = MetricsServer(m.host, m.port, self.registry, self._scrape_failed)  # a taken port: refused here
        inst = self._load_or_adopt(interfaces, mode, obj, force_reload)
        self.instance = inst
        try:
            down = {(vip, addr) for vip, addrs in inst.state.down.items() for addr in addrs}
            targets = self._targets(self.config)
            self.monitor.set_targets(targets, down)
            self._apply("start", self.config, raise_errors=True, targets=targets)
            if not self.loaded:
                self._upgrade_if_named(self.config, "start")
            self.control = control.Server(control.socket_path(controller.STATE_ROOT, self.name), self.events.put)
            self.control.start()
            self.watch.start()
        except BaseException:
            if self.loaded:
                self.close()
                Instance.open(self.name).unload()
                self.log.info("unloaded", instance=self.name, detail="this start loaded it and then failed")
            raise
        self.metrics.start()
        self.monitor.start()
        self.log.info("running", instance=self.name, config=self.config_path,
                      vips=len(self.config.vips), health_targets=len(targets),
                      tunnel_probes=sum(1 for t in targets if t.mark), metrics=self.metrics.listen)

    def _read_config(self) -> cfg.Config:
        c = cfg.load(self.config_path)
        health.require_supported(c, self.config_path)
        if health.uses_tunnel(c):
            preflight.require_tcx(f'{self.config_path}: via = "tunnel" (hc_encap on tc egress)')
        return c

    def _load_or_adopt(self, interfaces: Sequence[str], mode: str | None, obj: str,
                       force_reload: bool = False) -> Instance:
        state = Instance.state_path(self.name)
        pins = Path(Instance.pin_dir(self.name))
        if state.exists() and not (pins / "lb_vips").exists():
            # Not stale: the datapath may run behind a bpffs this process cannot see. Only the
            # operator's --force-reload, with no XDP program on the interfaces, lets us load.
            ifaces = list(interfaces) or list(self.config.datapath.interfaces)
            if not force_reload:
                preflight.check_pins_visible(self.name, state, str(pins), ifaces)
            preflight.forget_unseen_state(self.name, state, ifaces)
            self.log.warning("state_forgotten", instance=self.name, state=str(state),
                             detail="--force-reload: its pins were gone and no XDP program was attached")
        if state.exists():
            inst = Instance.open(self.name)
            self.log.info("adopted", instance=self.name, interfaces=inst.state.interfaces,
                          object=inst.state.object, pins=str(pins),
                          down={k: v for k, v in inst.state.down.items()})
            wanted = list(interfaces) or list(self.config.datapath.interfaces)
            if sorted(wanted) != sorted(inst.state.interfaces):
                self.log.warning("interfaces_differ", instance=self.name,
                                 running=sorted(inst.state.interfaces),
                                 configured=sorted(wanted),
                                 detail="the running datapath keeps its attachments; run `lbctl unload` "
                                        "and restart the daemon to change them")
            return inst
        ifaces = list(interfaces) or list(self.config.datapath.interfaces)
        attach_mode = mode or self.config.datapath.mode
        obj = obj or self.config.datapath.object or DEFAULT_OBJECT
        inst = Instance.load(self.name, ifaces, attach_mode, self.config, obj)
        self.loaded = True
        self.log.info("loaded", instance=self.name, interfaces=inst.attach_modes(), object=obj,
                      pins=str(pins))
        return inst

    def _targets(self, config: cfg.Config) -> list[health.Target]:
        """The probe targets of config; loads and attaches hc_encap the first time a VIP needs it."""
        if not health.uses_tunnel(config):
            return health.targets_of(config)
        if self.tunnel is None:
            inst = self.instance
            assert inst is not None
            obj = str(Path(inst.state.object).with_name("healthcheck.o"))
            self.tunnel = health.TunnelEncap(obj, inst.state.interfaces, config.encap.gue_port)
            self.log.info("tunnel_probes", program="hc_encap", object=obj,
                          interfaces=sorted(inst.state.interfaces), direction="tc egress")
        self.tunnel.set_gue_port(config.encap.gue_port)
        return health.targets_of(config, self.tunnel.mark)

    def _serve_metrics(self, m: cfg.MetricsConfig) -> MetricsServer:
        server = MetricsServer(m.host, m.port, self.registry, self._scrape_failed)
        server.start()
        return server

    def _scrape_failed(self, exc: BaseException) -> None:
        self.log.error("scrape_failed", error=str(exc) or repr(exc))

    # -- events --------------------------------------------------------------------------------

    def notify(self, **fields: object) -> None:
        """Tell systemd (when it asked, through NOTIFY_SOCKET); a failure is logged, never fatal."""
        try:
            self.notifier.send(**fields)
        except LbError as exc:
            self.log.error("notify_failed", fields=sorted(fields), error=str(exc))

    def serve(self) -> int:
        """Handle events until SIGTERM or SIGINT; returns the exit status (0). With a systemd
        watchdog, WATCHDOG=1 goes out from this loop at least every half watchdog period."""
        period = self.notifier.watchdog_s / 2 if self.notifier.watchdog_s else None
        pinged = time.monotonic()
        while True:
            if period is not None and time.monotonic() - pinged >= period:
                self.notify(WATCHDOG=1)
                pinged = time.monotonic()
            try:
                ev = self.events.get(timeout=None if period is None else max(0.0, pinged + period - time.monotonic()))
            except queue.Empty:
                continue
            if isinstance(ev, health.Transition):
                t = ev.target
                self.log.log("info" if ev.healthy else "warning", "real_up" if ev.healthy else "real_down",
                             vip=t.vip, real=t.address, detail=ev.detail,
                             check=t.check.type, port=t.check.port)
                self._apply("health", self.config, raise_errors=False)
            elif isinstance(ev, control.Request):
                self._on_request(ev)
            elif isinstance(ev, _RoutingChanged):
                self._follow_nexthop()
            elif ev.signum == signal.SIGHUP:
                self._reload_notified()
            else:
                self.notify(STOPPING=1, STATUS="stopping; the datapath stays loaded")
                self.log.info("stopping", signal=signal.Signals(ev.signum).name,
                              detail="the datapath stays loaded and forwarding; `lbctl unload` removes it")
                return 0

    def _reload_notified(self) -> tuple[bool, str]:
        """reload() between RELOADING=1 and READY=1 to systemd."""
        self.notify(RELOADING=1, MONOTONIC_USEC=time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000)
        try:
            return self.reload()
        finally:
            self.notify(READY=1, STATUS=self.status_line())

    def _keepalive(self) -> None:
        """WATCHDOG=1 now, before a long step, when the unit has a watchdog (serve() pings between events)."""
        if self.notifier.watchdog_s:
            self.notify(WATCHDOG=1)

    def _routing_changed(self) -> None:
        """From the watch's thread: queue one re-resolution (never more than one pending)."""
        if not self._routing_pending.is_set():
            self._routing_pending.set()
            self.events.put(_RoutingChanged())

    def _follow_nexthop(self) -> None:
        """Resolve the next hop again; when its MAC moved, apply (which rewrites the setting)."""
        self._routing_pending.clear()
        inst = self.instance
        assert inst is not None
        encap = self.config.encap
        if encap.nexthop_mac != nexthop.AUTO:
            return
        was = inst.state.nexthop.get("mac")
        try:
            hop = nexthop.resolve(encap.nexthop_mac, str(encap.nexthop) if encap.nexthop else None,
                                  list(inst.state.interfaces), timeout=FOLLOW_RESOLVE_S)
        except LbError as exc:
            if was != self._lost:
                self.log.warning("nexthop_lost", error=str(exc), detail=f"frames keep going to {was}")
                self._lost = was
            return
        self._lost = None
        if hop.mac != was:
            self.log.info("nexthop_changed", mac=hop.mac, previous=was, address=hop.address,
                          interface=hop.interface, source=hop.source)
            self._apply("nexthop", self.config, raise_errors=False)

    def _on_request(self, req: control.Request) -> None:
        """Carry out a request from the control socket and answer it (never raises: a failure is the answer)."""
        self.log.info("request", verb=req.verb, client_pid=req.peer_pid,
                      **{k: str(v) for k, v in req.args.items() if k == "object"})
        try:
            if req.verb == "describe":
                inst = self.instance
                req.answer(True, f"lbctl run (pid {os.getpid()})", pid=os.getpid(),
                           config=os.path.abspath(self.config_path),
                           object=inst.state.object if inst else "")
            elif req.verb == "upgrade":
                req.answer(True, self.upgrade(str(req.args.get("object") or DEFAULT_OBJECT), "request"))
            else:
                ok, message = self._reload_notified()
                req.answer(ok, message)
        except LbError as exc:
            req.answer(False, str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug: answered and logged, the daemon keeps running
            req.answer(False, crash_report("lbctl run", exc, (controller.STATE_ROOT,)))

    def upgrade(self, obj: str, trigger: str) -> str:
        """Swap the program behind the instance's links for obj (maps, sessions and health state
        stay); logged as upgraded or upgrade_failed, and the LbError re-raised."""
        inst = self.instance
        assert inst is not None
        previous = inst.state.object
        self._keepalive()  # loading and verifying a program takes a while on a slow machine
        try:
            with self.lock:
                done = inst.upgrade(obj)
        except LbError as exc:
            self.log.error("upgrade_failed", trigger=trigger, object=obj, error=str(exc),
                           detail=f"the links keep running {previous}")
            raise
        self.log.info("upgraded", trigger=trigger, object=inst.state.object, previous=previous,
                      sha256=inst.state.object_sha256, links=done["links"])
        return (f"replaced the program behind {done['links']} link(s) with {inst.state.object} (was {previous}); "
                "maps, sessions and health state kept")

    def _upgrade_if_named(self, config: cfg.Config, trigger: str) -> str:
        """Upgrade to the config's datapath.object when it names one that is not running; "" if none."""
        inst = self.instance
        assert inst is not None
        if not config.datapath.object or inst.runs(config.datapath.object):
            return ""
        return self.upgrade(objects.find(config.datapath.object), trigger)

    def reload(self) -> tuple[bool, str]:
        """Read the file again and apply it (and upgrade to its object if it names another); on any
        error log it and keep the running state. Returns (applied, what happened)."""
        self.log.info("reload", config=self.config_path)
        self._keepalive()
        metrics = self.metrics
        try:
            new = self._read_config()
            if _restart_keys(new.datapath) != _restart_keys(self.config.datapath):
                self.log.warning("restart_needed", keys="datapath",
                                 detail="datapath settings (interfaces, mode, map sizes, frags) take effect "
                                        "only when the instance is loaded again (`lbctl unload`, then restart)")
            if new.metrics != self.config.metrics:
                metrics = self._serve_metrics(new.metrics)
            targets = self._targets(new)
        except LbError as exc:  # ConfigError included
            self._count("reload", False)
            self._reload_failed(str(exc), metrics)
            return False, str(exc)
        if not self._apply("reload", new, raise_errors=False, targets=targets):  # counted there
            why = "the datapath refused the new configuration (see apply_failed)"
            self._reload_failed(why, metrics)
            return False, f"{self.config_path}: {why}; the running configuration is kept"
        self.config = new
        if metrics is not self.metrics:
            old, self.metrics = self.metrics, metrics
            if old is not None:
                old.stop()
            self.log.info("metrics_moved", metrics=metrics.listen if metrics else "")
        try:
            upgraded = self._upgrade_if_named(new, "reload")
        except LbError as exc:
            return False, f"applied {self.config_path}, but the upgrade to its object failed: {exc}"
        return True, f"applied {self.config_path}" + (f"; {upgraded}" if upgraded else "")

    def status_line(self) -> str:
        return f"forwarding {len(self.config.vips)} VIPs; metrics at {self.metrics.listen if self.metrics else '-'}"

    def _reload_failed(self, error: str, metrics: MetricsServer | None) -> None:
        """Log a refused reload and undo what it started (a new metrics listener, an unneeded tunnel)."""
        self.log.error("reload_failed", config=self.config_path, error=error,
                       detail="keeping the running configuration")
        if metrics is not None and metrics is not self.metrics:
            metrics.stop()
        if self.tunnel is not None and not health.uses_tunnel(self.config):
            self.tunnel.close()
            self.tunnel = None

    def _apply(self, trigger: str, config: cfg.Config, *, raise_errors: bool,
               targets: list[health.Target] | None = None) -> bool:
        """Apply config minus the reals down now; with targets, switch the monitor to them on success
        (and forget the tunnel marks of reals no longer probed through the tunnel)."""
        inst = self.instance
        assert inst is not None
        keys = {(v.name, str(r.address)) for v in config.vips if v.healthcheck is not None for r in v.reals}
        down = {vip: [a for a in addrs if (vip, a) in keys] for vip, addrs in self.monitor.down().items()}
        down = {vip: addrs for vip, addrs in down.items() if addrs}
        try:
            with self.lock:
                report = inst.apply(config, down=down)
                if targets is not None:
                    self.monitor.set_targets(targets)
                    if self.tunnel is not None:
                        self.tunnel.keep_only({(t.address, t.encap) for t in targets if t.mark})
        except LbError as exc:
            self._count(trigger, False)
            self.log.error("apply_failed", trigger=trigger, error=str(exc),
                           detail="the datapath keeps its previous state")
            if raise_errors:
                raise
            return False
        self._count(trigger, True)
        self.log.info("applied", trigger=trigger, writes=report.writes,
                      **{k: v for k, v in report.__dict__.items() if v}, down=down)
        return True

    def _count(self, trigger: str, ok: bool) -> None:
        with self.lock:
            self.applies[(trigger, ok)] = self.applies.get((trigger, ok), 0) + 1
            if trigger in ("start", "reload"):  # loads of the config file (health applies are not)
                self.last_reload = (ok, time.time() if ok else self.last_reload[1])

    # -- metrics -------------------------------------------------------------------------------

    def scrape(self) -> Snapshot:
        """What the metrics show: counters read from the maps now, health and weights as applied."""
        inst = self.instance
        assert inst is not None
        status = {(s.target.vip, s.target.address): s for s in self.monitor.snapshot()}
        with self.lock:
            stats = inst.stats()
            config = self.config
            applied_down = {vip: set(addrs) for vip, addrs in inst.state.down.items()}
            applies = dict(self.applies)
            last_reload = self.last_reload
        reals: list[dict[str, Any]] = []
        for vip in config.vips:
            for r in vip.reals:
                addr = str(r.address)
                st = status.get((vip.name, addr))
                reals.append({
                    "vip": vip.name, "real": addr, "up": st.healthy if st else True,
                    "weight": 0 if addr in applied_down.get(vip.name, set()) else r.weight,
                    "configured_weight": r.weight, "checked": st is not None,
                    "checks_ok": st.checks_ok if st else 0, "checks_failed": st.checks_failed if st else 0,
                })
        build = {"version": _version(), "abi_digest": _abi.DIGESTS.get("balancer", ""),
                 "python": platform.python_version(), "lb_instance": self.name}
        return Snapshot(stats, reals, applies, last_reload, build)

    # -- stop ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop probes and metrics and close our file descriptors; pins keep the datapath loaded."""
        if self.control is not None:
            self.control.stop()
            self.control = None
        self.watch.stop()
        self.monitor.stop()
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None
        if self.tunnel is not None:
            self.tunnel.close()
            self.tunnel = None
        if self.instance is not None:
            self.instance.close()
            self.instance = None


def _restart_keys(d: cfg.DatapathConfig) -> cfg.DatapathConfig:
    """The datapath settings a reload cannot change (all but the object, which it upgrades to)."""
    return dataclasses.replace(d, object="")


def _forget_lock(lock: Path, instance: str) -> None:
    """Remove the lock file (still held) when no instance stays behind: a start that failed."""
    if not Instance.state_path(instance).exists():
        lock.unlink(missing_ok=True)


def run(config_path: str, instance: str, *, interfaces: Sequence[str] = (), mode: str | None = None,
        obj: str = "", log: Logger | None = None, force_reload: bool = False) -> int:
    """Run the daemon until SIGTERM/SIGINT. Exit status: 0 stopped, 2 bad config at start, 1 other errors.

    The daemon owns the instance while it runs (preflight.instance_lock): a second daemon is refused,
    and a command that writes to the instance hands its write over on the control socket or is
    refused naming the command that works (balancer/handover.py). obj "" loads the config's
    datapath.object, else balancer.o. An unexpected exception is logged as one
    line naming the file that holds its traceback."""
    log = log or Logger()
    daemon = Daemon(config_path, instance, log, Notifier.from_environment())

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        daemon.events.put(_Signal(signum))  # SimpleQueue.put is safe inside a signal handler

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGHUP, *_STOP_SIGNALS)}
    try:
        with ExitStack() as owned:
            try:
                preflight.require_caps("run", preflight.LOAD_CAPS)  # before the lock: a refusal leaves nothing
                preflight.require_bpffs(controller.PIN_ROOT)
                lock = owned.enter_context(preflight.instance_lock(controller.STATE_ROOT, instance, "lbctl run"))
                owned.callback(_forget_lock, lock, instance)
                daemon.start(interfaces, mode, obj, force_reload)
            except ConfigError as exc:
                log.error("start_failed", instance=instance, config=config_path, error=str(exc))
                return 2
            except LbError as exc:
                log.error("start_failed", instance=instance, config=config_path, error=str(exc))
                return 1
            except Exception as exc:  # noqa: BLE001 - a bug: one line, the traceback in a file
                log.error("start_failed", instance=instance, config=config_path,
                          error=crash_report("lbctl run", exc, (controller.STATE_ROOT,)))
                return 1
            daemon.notify(READY=1, STATUS=daemon.status_line(), MAINPID=os.getpid())
            try:
                status = daemon.serve()
            except Exception as exc:  # noqa: BLE001 - as above; the datapath keeps forwarding
                log.error("crashed", instance=instance, error=crash_report("lbctl run", exc, (controller.STATE_ROOT,)))
                return 1
            log.info("stopped", instance=instance)
            return status
    finally:
        daemon.close()
        for s, handler in previous.items():
            signal.signal(s, handler)
