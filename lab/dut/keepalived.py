"""keepalived.py: the keepalived.conf that drives IPVS as deployed: tunnel mode, Maglev, health checks.

One `virtual_server` per VIP, port and protocol (`lvs_sched mh` with its flags, `lvs_method TUN`
with the tunnel type), one `real_server` per real in the order given, each with a TCP_CHECK or an
HTTP_GET on the real's own address when health checks are asked for (keepalived.conf(5)). A failed
real is drained (`inhibit_on_failure`: weight 0, its connections go on) rather than removed, as
l4lab's health checks drain. `lvs_timeouts` shortens IPVS's connection timeouts: the suites send
the same 5-tuples again within seconds.

    text = render([VirtualServer("198.51.100.100", 80, "tcp", reals=(RealServer("203.0.113.18"),))])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from lab.dut.base import HealthCheck

# IPVS connection timeouts in seconds: established TCP, TCP after a FIN, UDP.
TIMEOUTS = (5, 2, 2)
GUE_PORT = 6080


@dataclass(frozen=True)
class RealServer:
    """One real of a virtual server: its address and weight (0 drains it)."""

    address: str
    weight: int = 1


@dataclass(frozen=True)
class VirtualServer:
    """One IPVS virtual service as keepalived configures it."""

    vip: str
    port: int
    proto: str = "tcp"
    scheduler: str = "mh"
    flags: tuple[str, ...] = ("mh-port", "mh-fallback")
    tunnel: str = "ipip"
    reals: tuple[RealServer, ...] = field(default_factory=tuple)
    check: HealthCheck | None = None


def _seconds(value: float) -> str:
    return f"{value:g}"


def _checker(check: HealthCheck) -> list[str]:
    """The real's health checker: keepalived fails a real after `retry` more failed checks, so
    fall = retry + 1; one good check brings it back (keepalived has no rise count)."""
    options = [f"connect_port {check.port}", f"connect_timeout {_seconds(check.timeout_s)}",
               f"retry {max(0, check.fall - 1)}", f"delay_before_retry {_seconds(check.interval_s)}"]
    if check.kind == "tcp":
        return ["TCP_CHECK {", *(f"    {o}" for o in options), "}"]
    if check.kind == "http":
        return ["HTTP_GET {", "    url {", "        path /", "        status_code 200-299", "    }",
                *(f"    {o}" for o in options), "}"]
    raise ValueError(f"health check kind must be tcp or http but got {check.kind!r}")


def _method(tunnel: str) -> str:
    if tunnel == "ipip":
        return "lvs_method TUN type ipip"
    if tunnel == "gue":
        return f"lvs_method TUN type gue port {GUE_PORT} nocsum"
    raise ValueError(f"tunnel must be ipip or gue but got {tunnel!r}")


def _virtual_server(vs: VirtualServer) -> list[str]:
    lines = [f"virtual_server {vs.vip} {vs.port} {{", f"    lvs_sched {vs.scheduler}"]
    lines += [f"    {flag}" for flag in vs.flags]
    lines += [f"    {_method(vs.tunnel)}", f"    protocol {vs.proto.upper()}"]
    if vs.check is not None:
        lines += [f"    delay_loop {_seconds(vs.check.interval_s)}", "    warmup 0", "    inhibit_on_failure"]
    for real in vs.reals:
        # In tunnel mode the real's port is the virtual port: IPVS does not rewrite it.
        lines += [f"    real_server {real.address} {vs.port} {{", f"        weight {real.weight}"]
        if vs.check is not None:
            lines += [f"        {line}" for line in _checker(vs.check)]
        lines.append("    }")
    lines.append("}")
    return lines


def render(services: Sequence[VirtualServer], timeouts: tuple[int, int, int] = TIMEOUTS) -> str:
    """keepalived.conf for `services` (health checkers only; no VRRP)."""
    tcp, tcpfin, udp = timeouts
    lines = ["# written by l4lab (lab/dut/keepalived.py)", "global_defs {", "    router_id l4lab",
             f"    lvs_timeouts tcp {tcp} tcpfin {tcpfin} udp {udp}", "}"]
    for vs in services:
        lines += _virtual_server(vs)
    return "\n".join(lines) + "\n"
