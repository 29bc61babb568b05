"""l4lab.py: l4lab's own XDP balancer as a device under test, loaded by lbctl in a lab's LB node.

Changes go through `lbctl apply`; with health checks, or once its control plane was restarted,
the daemon `lbctl run` owns the instance and a change is the config file rewritten and a SIGHUP
(waited for until the daemon logs it applied). `restart_control_plane()` SIGKILLs the daemon and
starts another, which adopts the pinned datapath. In a fleet (lab/dut/fleet.py) each member is
the balancer of one LB node; the lab's health hook announces its VIPs by BGP while it is loaded.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from balancer import config as cfg
from balancer import encaps
from lab.dut.base import Capability, Dut, HealthCheck, LabLike, LbLink
from lab.errors import LabError
from lab.harness.labs import REPO
from lab.lbconf import balancer_config, lb_link
from lab.poll import poll
from reports.schema import current_commit

DAEMON_DEADLINE_S = 30.0


class LbctlDaemon:
    """`lbctl run --config FILE` for one instance in a lab node; its JSON log lines in a file."""

    def __init__(self, lab: LabLike, node: str, instance: str, config: str, log: Path) -> None:
        self.log_path = log
        self.offset = log.stat().st_size if log.exists() else 0
        with log.open("a") as sink:
            argv = lab.python_argv(node, "balancer.cli", "--instance", instance, "run", "--config", config)
            self.proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                         stderr=sink)

    def events(self) -> list[dict[str, Any]]:
        with self.log_path.open() as f:
            f.seek(self.offset)
            return [json.loads(line) for line in f if line.startswith("{")]

    def wait(self, event: str, after: int = 0, **fields: object) -> dict[str, Any]:
        """The first `event` (with `fields`) logged after the `after`-th event; LabError at the deadline."""
        def found() -> dict[str, Any] | None:
            if self.proc.poll() is not None:
                raise LabError(f"lbctl run exited {self.proc.returncode}: {self.log_path.read_text()[-1500:]}")
            return next((e for e in self.events()[after:] if e.get("event") == event
                         and all(e.get(k) == v for k, v in fields.items())), None)

        got = poll(DAEMON_DEADLINE_S, found, f"lbctl run logging {event}", check=False, interval_s=0.02)
        if got is None:
            raise LabError(f"lbctl run logged no {event} {fields or ''} within {DAEMON_DEADLINE_S:g} s: "
                           f"{self.log_path.read_text()[-1500:]}")
        return got

    def send(self, signum: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def stop(self, signum: int = signal.SIGTERM) -> None:
        self.send(signum)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class L4labDut(Dut):
    """l4lab's XDP balancer, loaded by lbctl in the lab's `node` (native XDP on its link)."""

    name = "l4lab"

    def __init__(self, lab: LabLike, workdir: Path, options: Mapping[str, str] | None = None,
                 node: str = "lb") -> None:
        super().__init__(lab, workdir, options)
        self.node = node
        self._loaded = False
        self.daemon: LbctlDaemon | None = None

    @classmethod
    def capabilities_for(cls, options: Mapping[str, str]) -> frozenset[str]:
        return super().capabilities_for(options) | frozenset(Capability)  # its internals too

    @property
    def instance(self) -> str:
        return f"{self.lab.name}-{self.node}"

    def build_info(self) -> str:
        return f"l4lab {current_commit()}"

    def lbctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.lab.python(self.node, "balancer.cli", "--instance", self.instance, *args, check=check)

    def start(self) -> None:
        self._loaded = False

    def stop(self) -> None:
        self._stop_daemon()
        if self._loaded:
            self.lbctl("unload", check=False)
            self._loaded = False

    def _stop_daemon(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()  # SIGTERM: the daemon leaves the datapath loaded
            self.daemon = None

    def _write(self) -> str:
        assert self.encap_id is not None
        case = encaps.by_id(self.encap_id)
        fam, mode = case.vip_family, case.config_name
        # A --target lab names the LB's interface and its next hop's MAC (its peer is no local netns).
        overrides = self.lab.link_overrides(self.node) if hasattr(self.lab, "link_overrides") else {}
        config = balancer_config(self.lab.topology, self.lab.name, encaps={fam: mode}, lb=self.node,
                                 weights=self.weights, reals=set(self.weights), **overrides)
        first = {v.address: v for v in reversed(config.vips)}
        extra = tuple(dataclasses.replace(v, port=port, proto=proto)  # type: ignore[arg-type]
                      for v in first.values() for port, proto in self.extra_ports)
        vips = tuple(self._shaped(v) for v in config.vips + extra)
        config = dataclasses.replace(config, vips=vips)
        path = self.workdir / f"{self.instance}.toml"
        self.workdir.mkdir(parents=True, exist_ok=True)
        path.write_text(cfg.dump(config))
        # On a --target host the node reads its config from its own /tmp (as suites.conftest.Balancer).
        where = f"/tmp/{self.instance}.toml" if getattr(self.lab, "target", None) is not None else str(path)
        self.lab.write(self.node, where, path.read_text())
        return where

    def _shaped(self, vip: Any) -> Any:
        """A VIP with its reals in `order` and the health check, if any."""
        by_addr = {str(r.address): r for r in vip.reals}
        reals = tuple(by_addr[self.reals()[n]] for n in self.ordered(self.weights) if self.reals()[n] in by_addr)
        check = None
        if self.healthcheck is not None:
            hc = self.healthcheck
            check = cfg.HealthCheck(port=hc.port, type=hc.kind, interval_s=hc.interval_s,  # type: ignore[arg-type]
                                    timeout_s=hc.timeout_s, rise=hc.rise, fall=hc.fall)
        return dataclasses.replace(vip, reals=reals, healthcheck=check)

    def configure(self, encap_id: str, weights: Mapping[str, int] | None = None,
                  extra_ports: Sequence[tuple[int, str]] = (), healthcheck: HealthCheck | None = None) -> None:
        self._remember(encap_id, weights, extra_ports, healthcheck)
        self._stop_daemon()
        path = self._write()
        if not self._loaded:
            ifname = lb_link(self.lab.topology, self.node)[0]
            if hasattr(self.lab, "ifname"):  # a --target host's name for the topology's interface
                ifname = self.lab.ifname(self.node, ifname)
            self.lbctl("load", "--interface", ifname, "--mode", "native", "--config", path)
            self._loaded = True
        else:
            self.lbctl("apply", path)
        if healthcheck is not None:
            self._start_daemon(path)

    def _start_daemon(self, path: str) -> LbctlDaemon:
        daemon = LbctlDaemon(self.lab, self.node, self.instance, path, self.workdir / f"{self.instance}-run.log")
        try:
            daemon.wait("running")
        except BaseException:
            daemon.stop(signal.SIGKILL)
            raise
        self.daemon = daemon
        return daemon

    def _change(self) -> None:
        """Apply the recorded state: by lbctl apply, or through the daemon when one runs."""
        path = self._write()
        if self.daemon is None:
            self.lbctl("apply", path)
            return
        seen = len(self.daemon.events())
        self.daemon.send(signal.SIGHUP)
        self.daemon.wait("applied", after=seen, trigger="reload")

    def set_weight(self, real: str, weight: int) -> None:
        self.weights[real] = weight
        self._change()

    def remove_real(self, real: str) -> None:
        self.weights.pop(real, None)
        self._change()

    def add_real(self, real: str, weight: int = 1) -> None:
        self.weights[real] = weight
        self._change()

    def restart_control_plane(self, how: str = "crash") -> float:
        """Stop `lbctl run` (started first if none runs; crash: SIGKILL, graceful: SIGTERM, which
        leaves the datapath forwarding) and start another: it adopts the pinned datapath and applies
        the same config (0 writes). Returns the seconds without a daemon."""
        path = self._write()
        first = self.daemon or self._start_daemon(path)
        self.daemon = None
        killed = time.monotonic()
        first.stop(signal.SIGKILL if how == "crash" else signal.SIGTERM)
        second = self._start_daemon(path)
        applied = second.wait("applied", trigger="start")
        if applied.get("writes") != 0:
            raise LabError(f"the restarted lbctl run wrote {applied.get('writes')} entries to the datapath: {applied}")
        return time.monotonic() - killed

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.lbctl("stats", "--json").stdout)
        return result

    def forwarded(self) -> dict[str, int]:
        by_addr = {a: n for n, a in self.reals().items()}
        out = {n: 0 for n in self.reals()}
        for addr, real in self.stats().get("reals", {}).items():
            node = by_addr.get(addr)
            if node is not None:
                out[node] += int(real["packets"])
        return out

    def link(self) -> LbLink:
        lb_if, router, router_if = lb_link(self.lab.topology, self.node)
        return LbLink(router, router_if, self.lab.mac(self.node, lb_if).lower())

    def announce(self, present: bool) -> None:
        """The lab's health hook announces the node's VIPs while the instance is loaded (lab/frr.py):
        in, nothing to do; out, `lbctl unload`, which the hook sees."""
        if present:
            return
        self._stop_daemon()
        self.lbctl("unload")
        self._loaded = False

    def evidence(self) -> str:
        try:
            return json.dumps(self.stats().get("reasons", {}), indent=1)[:4000]
        except (LabError, subprocess.CalledProcessError, json.JSONDecodeError) as exc:
            return f"lbctl stats failed: {exc}"
