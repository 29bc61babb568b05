"""health.py: health checks of reals — TCP, HTTP and UDP probes, rise/fall state, a concurrent monitor.

A :class:`Monitor` probes every (VIP, real) :class:`Target` every ``interval_s`` on a thread pool
(each probe bounded by ``timeout_s``) and tracks consecutive results: a healthy real turns down
after ``fall`` failures in a row, a down real turns up after ``rise`` successes in a row. Only
changes of state are reported, through the callback given to the monitor; counts are kept for
the metrics endpoint.

A "direct" probe goes from this host's stack to the real's own address. A "tunnel" probe checks
the real the way clients reach it (Katran's healthcheck forwarding): the probe socket connects to
the VIP with ``SO_MARK`` set to a mark chosen for the (real, encapsulation) pair, and
:class:`TunnelEncap` — the tc egress program ``hc_encap`` of ``bpf/healthcheck.bpf.c`` on the
balancer's interfaces — wraps every packet carrying that mark the way the VIP's traffic is wrapped:
IPIP (4in4 or 6in6) or GUE variant 1 / 0 to the configured GUE port, outer source = the probe's
source. The real decapsulates it and answers from the VIP, directly. This needs a route to the VIP
out of a balancer interface (normally the default route to the router) and a real that
decapsulates what its VIP sends; a 4in6 tunnel probe (IPv4 VIP, IPv6 real) is refused by
:func:`require_supported`.
"""

from __future__ import annotations

import errno as _errno
import functools
import ipaddress
import os
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from balancer import _abi, encaps
from balancer import config as cfg
from balancer.datapath import verify_abi
from balancer.errors import ConfigError, DatapathError
from balancer.libbpf import BpfObject, Link, Map
from balancer.maplayout import real_bytes

__all__ = [
    "Monitor",
    "Outcome",
    "Target",
    "TargetStatus",
    "Transition",
    "TunnelEncap",
    "hc_target_bytes",
    "probe",
    "probe_http",
    "probe_tcp",
    "probe_udp",
    "require_supported",
    "targets_of",
    "uses_tunnel",
]

UDP_PAYLOAD = b"l4lab-healthcheck\n"
MARK_BASE = 0x4C48_0000  # tunnel probe marks are MARK_BASE + n, clear of small marks other tools use


@dataclass(frozen=True)
class Outcome:
    """The result of one probe: success or not, why, and how long it took."""

    ok: bool
    detail: str
    seconds: float


@dataclass(frozen=True)
class Target:
    """One real behind one VIP, and how to check it."""

    vip: str
    address: str
    check: cfg.HealthCheck
    vip_address: str = ""   # where a tunnel probe is addressed
    mark: int = 0           # SO_MARK of a tunnel probe: hc_encap sends it to `address`
    encap: cfg.EncapName = "ipip"  # how a tunnel probe is wrapped: as its VIP's traffic

    @property
    def key(self) -> tuple[str, str]:
        return self.vip, self.address


@dataclass(frozen=True)
class Transition:
    """A real changed state: it went down (``healthy`` False) or came back up."""

    target: Target
    healthy: bool
    detail: str


@dataclass
class TargetStatus:
    """What the monitor knows about one target: state, streaks, totals and the last result."""

    target: Target
    healthy: bool = True
    successes: int = 0   # consecutive
    failures: int = 0    # consecutive
    checks_ok: int = 0
    checks_failed: int = 0
    last_detail: str = ""
    due: float = 0.0
    inflight: bool = False
    probe_seq: int = 0   # which probe's result is awaited (results of replaced probes are ignored)


# ------------------------------------------------------------------------------------------ probes


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ipaddress.ip_address(address).version == 6 else socket.AF_INET


def _failure(exc: OSError, what: str, timeout: float) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return f"{what}: no answer within {timeout:g} s"
    if isinstance(exc, ConnectionRefusedError):
        return f"{what}: connection refused"
    return f"{what}: {exc.strerror or exc}"


def _socket(address: str, kind: socket.SocketKind, mark: int) -> socket.socket:
    s = socket.socket(_family(address), kind)
    if mark:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
    return s


def probe_tcp(address: str, port: int, timeout: float, mark: int = 0) -> Outcome:
    """Success when a TCP connection to address:port completes within timeout."""
    t0 = time.monotonic()
    try:
        with _socket(address, socket.SOCK_STREAM, mark) as s:
            s.settimeout(timeout)
            s.connect((address, port))
    except OSError as exc:
        detail = _failure(exc, f"tcp connect {address} port {port}", timeout)
        return Outcome(False, detail, time.monotonic() - t0)
    return Outcome(True, "connected", time.monotonic() - t0)


def probe_http(address: str, port: int, path: str, timeout: float, mark: int = 0) -> Outcome:
    """Success when GET path answers with a 2xx or 3xx status line within timeout (whole exchange)."""
    t0 = time.monotonic()
    deadline = t0 + timeout
    host = f"[{address}]" if ":" in address else address
    what = f"http GET {host}:{port}{path}"
    request = (f"GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nUser-Agent: lbctl-healthcheck\r\n"
               "Connection: close\r\n\r\n").encode()
    data = b""
    try:
        with _socket(address, socket.SOCK_STREAM, mark) as s:
            s.settimeout(timeout)
            s.connect((address, port))
            s.sendall(request)
            while b"\r\n" not in data and len(data) < 4096:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                s.settimeout(left)
                chunk = s.recv(4096)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        return Outcome(False, _failure(exc, what, timeout), time.monotonic() - t0)
    elapsed = time.monotonic() - t0
    line = data.split(b"\r\n", 1)[0].decode("latin-1")
    parts = line.split()
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        return Outcome(False, f"{what}: not an HTTP status line: {line[:80]!r}", elapsed)
    status = int(parts[1])
    if 200 <= status < 400:
        return Outcome(True, f"status {status}", elapsed)
    return Outcome(False, f"{what}: status {status} (expected 2xx or 3xx)", elapsed)


def probe_udp(address: str, port: int, timeout: float, mark: int = 0) -> Outcome:
    """Success when a datagram sent to address:port gets any reply within timeout."""
    t0 = time.monotonic()
    what = f"udp probe {address} port {port}"
    try:
        with _socket(address, socket.SOCK_DGRAM, mark) as s:
            s.settimeout(timeout)
            s.connect((address, port))
            s.send(UDP_PAYLOAD)
            s.recv(2048)
    except ConnectionRefusedError:
        return Outcome(False, f"{what}: port unreachable", time.monotonic() - t0)
    except OSError as exc:
        return Outcome(False, _failure(exc, what, timeout), time.monotonic() - t0)
    return Outcome(True, "reply received", time.monotonic() - t0)


def probe(target: Target) -> Outcome:
    """Run the probe the target's check asks for: to the real itself, or to the VIP through the tunnel."""
    c = target.check
    if c.via == "tunnel":
        if not target.mark or not target.vip_address:
            raise ValueError(f"tunnel probe of {target.address} behind {target.vip} has no mark or VIP "
                             "address; build targets with targets_of(config, marks)")
        dst, mark = target.vip_address, target.mark
    else:
        dst, mark = target.address, 0
    if c.type == "tcp":
        return probe_tcp(dst, c.port, c.timeout_s, mark)
    if c.type == "http":
        return probe_http(dst, c.port, c.path, c.timeout_s, mark)
    return probe_udp(dst, c.port, c.timeout_s, mark)


# ------------------------------------------------------------------------------------ config rules


def require_supported(config: cfg.Config, file: str) -> None:
    """Refuse health checks this controller cannot run, naming the VIP, the real and why."""
    for i, vip in enumerate(config.vips):
        if vip.healthcheck is None or vip.healthcheck.via != "tunnel":
            continue
        for j, real in enumerate(vip.reals):
            if real.address.version != vip.address.version:
                raise ConfigError(
                    file, f"vips[{i}].healthcheck.via", "tunnel", "",
                    message=f'vips[{i}].healthcheck.via = "tunnel" cannot probe vips[{i}].reals[{j}] '
                    f"({real.address}) of {vip.name}: tunnel probes keep the VIP's family (4in4, 6in6, "
                    "GUE over the same family); "
                    'use via = "direct" for this VIP')


def uses_tunnel(config: cfg.Config) -> bool:
    """True when some VIP's health check goes through the tunnel (hc_encap must be loaded)."""
    return any(v.healthcheck is not None and v.healthcheck.via == "tunnel" for v in config.vips)


def targets_of(config: cfg.Config, marks: Callable[[str, str], int] | None = None) -> list[Target]:
    """Every (VIP, real) pair whose VIP has a health check; tunnel probes get marks(real address, VIP encap)."""
    out = []
    for vip in config.vips:
        check = vip.healthcheck
        if check is None:
            continue
        for real in vip.reals:
            mark = 0
            if check.via == "tunnel":
                if marks is None:
                    raise ValueError(f"{vip.name} is probed through the tunnel: targets_of needs marks")
                mark = marks(str(real.address), vip.encap)
            out.append(Target(vip.name, str(real.address), check, str(vip.address), mark, vip.encap))
    return out


# ------------------------------------------------------------------------------------ tunnel encap


def hc_target_bytes(address: str, encap: str, gue_port: int) -> bytes:
    """The lb_hc_reals value for a probe of the real at `address` wrapped as `encap`."""
    real = _abi.Real.from_buffer_copy(real_bytes(address, _abi.RealFlag.PRESENT))
    return bytes(_abi.HcTarget(real=real, encap=int(encaps.mode_of(encap)), gue_port=socket.htons(gue_port)))



class TunnelEncap:
    """hc_encap on tc egress of the balancer's interfaces, and its mark -> real map (lb_hc_reals).

    Links are not pinned: the program runs only while this controller probes, and closing it
    (or the process ending) detaches it.
    """

    def __init__(self, obj_path: str, interfaces: Iterable[str], gue_port: int = _abi.Limits.DEFAULT_GUE_PORT) -> None:
        ifaces = list(interfaces)
        if not ifaces:
            raise DatapathError("attach the tunnel health-check program", 0,
                                "the instance has no interfaces: tunnel probes leave through them; "
                                'load it with --interface or use via = "direct"')
        if not os.path.exists(obj_path):
            raise DatapathError(f"find the tunnel health-check program '{obj_path}'", _errno.ENOENT,
                                "run `make bpf`")
        verify_abi(obj_path)
        self._obj = BpfObject(obj_path)
        self.links: list[Link] = []
        self.marks: dict[tuple[str, str], int] = {}
        self.gue_port = gue_port
        try:
            self._obj.load()
            self.map: Map = self._obj.map("lb_hc_reals")
            prog = self._obj.program("hc_encap")
            for ifname in ifaces:
                try:
                    ifindex = socket.if_nametoindex(ifname)
                except OSError as exc:
                    raise DatapathError(f"find interface '{ifname}' for tunnel health checks", _errno.ENODEV,
                                        "check the name with `ip link`") from exc
                self.links.append(prog.attach_tcx(ifindex, "egress", ifname))
        except BaseException:
            self.close()
            raise

    def mark(self, address: str, encap: str = "ipip") -> int:
        """The mark of (real, encapsulation) (stable while this object lives); registers it in the map."""
        key = (address, encap)
        if key not in self.marks:
            used = set(self.marks.values())
            n = MARK_BASE + 1
            while n in used:
                n += 1
            self.map.update(n.to_bytes(4, "little"), hc_target_bytes(address, encap, self.gue_port))
            self.marks[key] = n
        return self.marks[key]

    def set_gue_port(self, port: int) -> None:
        """A reload changed encap.gue_port: rewrite the GUE marks' targets."""
        if port == self.gue_port:
            return
        self.gue_port = port
        for (address, encap), n in self.marks.items():
            if encap != "ipip":
                self.map.update(n.to_bytes(4, "little"), hc_target_bytes(address, encap, port))

    def keep_only(self, keys: Collection[tuple[str, str]]) -> None:
        """Forget the marks of (real, encapsulation) pairs no longer probed through the tunnel."""
        for key in [k for k in self.marks if k not in keys]:
            self.map.delete(self.marks.pop(key).to_bytes(4, "little"))

    def close(self) -> None:
        for link in self.links:
            link.close()
        self.links = []
        self._obj.close()


# ---------------------------------------------------------------------------------------- monitor


ProbeFn = Callable[[Target], Outcome]


class Monitor:
    """Probes targets concurrently on their own intervals and reports each change of health."""

    def __init__(self, on_transition: Callable[[Transition], None], *, workers: int = 64,
                 probe_fn: ProbeFn = probe) -> None:
        self._on_transition = on_transition
        self._probe = probe_fn
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="probe")
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._status: dict[tuple[str, str], TargetStatus] = {}
        self._thread = threading.Thread(target=self._loop, name="health-monitor", daemon=True)

    def set_targets(self, targets: Iterable[Target], down: Collection[tuple[str, str]] = ()) -> None:
        """Replace the targets. A target already known keeps its state and streaks (its check may
        change); a new one starts healthy, or down if its key is in ``down``."""
        with self._lock:
            new: dict[tuple[str, str], TargetStatus] = {}
            for t in targets:
                old = self._status.get(t.key)
                if old is not None:
                    st = replace(old, target=t)
                    if old.target.check.interval_s != t.check.interval_s:
                        st.due = 0.0
                    new[t.key] = st
                else:
                    new[t.key] = TargetStatus(target=t, healthy=t.key not in down)
            self._status = new
        self._wake.set()

    def down(self) -> dict[str, list[str]]:
        """vip name -> addresses of its reals that are down."""
        out: dict[str, list[str]] = {}
        with self._lock:
            for (vip, addr), st in self._status.items():
                if not st.healthy:
                    out.setdefault(vip, []).append(addr)
        return {k: sorted(v) for k, v in out.items()}

    def snapshot(self) -> list[TargetStatus]:
        """Copies of every target's status (safe to read while probes run)."""
        with self._lock:
            return [replace(st) for st in self._status.values()]

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop scheduling and wait for the probes in flight (each is bounded by its timeout)."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _loop(self) -> None:
        seq = 0
        while not self._stop.is_set():
            self._wake.clear()
            jobs: list[tuple[tuple[str, str], int, Target]] = []
            with self._lock:
                now = time.monotonic()
                for key, st in self._status.items():
                    if not st.inflight and st.due <= now:
                        seq += 1
                        st.due = now + st.target.check.interval_s
                        st.inflight = True
                        st.probe_seq = seq
                        jobs.append((key, seq, st.target))
                waits = [st.due for st in self._status.values() if not st.inflight]
                wait = (min(waits) - now) if waits else 3600.0
            # Submitted outside the lock: a probe that finishes at once runs _done in this thread.
            for key, n, target in jobs:
                try:
                    fut = self._pool.submit(self._probe, target)
                except RuntimeError:  # the pool was shut down: we are stopping
                    return
                fut.add_done_callback(functools.partial(self._done, key, n))
            self._wake.wait(max(0.0, wait))

    def _done(self, key: tuple[str, str], seq: int, fut: Future[Outcome]) -> None:
        if fut.cancelled():
            return
        exc = fut.exception()
        outcome = fut.result() if exc is None else Outcome(False, f"probe raised {exc!r}", 0.0)
        change: Transition | None = None
        with self._lock:
            st = self._status.get(key)
            if st is None or st.probe_seq != seq:
                return  # the target was removed or replaced while this probe ran
            st.inflight = False
            st.last_detail = outcome.detail
            c = st.target.check
            if outcome.ok:
                st.checks_ok += 1
                st.successes += 1
                st.failures = 0
                if not st.healthy and st.successes >= c.rise:
                    st.healthy = True
                    change = Transition(st.target, True, outcome.detail)
            else:
                st.checks_failed += 1
                st.failures += 1
                st.successes = 0
                if st.healthy and st.failures >= c.fall:
                    st.healthy = False
                    change = Transition(st.target, False, outcome.detail)
        self._wake.set()
        if change is not None:
            self._on_transition(change)
