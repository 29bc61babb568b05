"""metrics.py: the Prometheus text exposition (format 0.0.4) of a running instance, served over HTTP.

``GET /metrics`` answers with every family below; the collector is called once per request, so
values are read from the maps at scrape time. Names and labels (tests compare them)::

    l4lab_vip_packets_total{vip}            l4lab_vip_bytes_total{vip}
    l4lab_real_packets_total{real}          l4lab_real_bytes_total{real}
    l4lab_reason_packets_total{reason}      l4lab_reason_bytes_total{reason}
    l4lab_events_total{event}
    l4lab_real_up{vip,real}                 1 healthy (or not checked), 0 failed its health check
    l4lab_real_weight{vip,real}             the weight in the ring now (0 while down)
    l4lab_real_configured_weight{vip,real}  the weight the config gives
    l4lab_health_checks_total{vip,real,result}   result = ok | failed
    l4lab_applies_total{trigger}            trigger = start | health | reload
    l4lab_apply_errors_total{trigger}
    l4lab_build_info{version,abi_digest,python,instance}   always 1

Reason and event label values are the lower-case enum names of ``balancer/_abi.py`` (``tx_encap``,
``drop_no_real``, ``lru_hit``). The server is ``http.server`` on a thread: no external dependency.
"""

from __future__ import annotations

import ipaddress
import math
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from balancer.errors import LbError

__all__ = ["CONTENT_TYPE", "Family", "MetricsServer", "escape_label", "instance_families", "render"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass
class Family:
    """One metric family: its name, type (counter or gauge), help text and samples."""

    name: str
    type: str
    help: str
    samples: list[tuple[dict[str, str], float]] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> None:
        self.samples.append((labels, value))


def escape_label(value: str) -> str:
    """A label value as the text format wants it: backslash, double quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 2**53):
        return str(int(value))
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def render(families: Iterable[Family]) -> str:
    """The text exposition of the families, each with its HELP and TYPE lines."""
    lines: list[str] = []
    for fam in families:
        lines.append(f"# HELP {fam.name} {_escape_help(fam.help)}")
        lines.append(f"# TYPE {fam.name} {fam.type}")
        for labels, value in fam.samples:
            text = ",".join(f'{k}="{escape_label(v)}"' for k, v in labels.items())
            lines.append(f"{fam.name}{{{text}}} {_number(value)}" if text else f"{fam.name} {_number(value)}")
    return "\n".join(lines) + "\n"


def instance_families(stats: Mapping[str, Any], reals: Iterable[Mapping[str, Any]],
                      applies: Mapping[tuple[str, bool], int], build: Mapping[str, str]) -> list[Family]:
    """Every family from the instance's counters (``Instance.stats()``), the per-real view (dicts with
    vip, real, up, weight, configured_weight, checks_ok, checks_failed), the apply counts keyed by
    (trigger, succeeded) and the build labels."""
    vp = Family("l4lab_vip_packets_total", "counter", "Packets the balancer sent towards a VIP's reals.")
    vb = Family("l4lab_vip_bytes_total", "counter", "Bytes the balancer sent towards a VIP's reals.")
    for vip, c in stats["vips"].items():
        vp.add(c["packets"], vip=vip)
        vb.add(c["bytes"], vip=vip)
    rp = Family("l4lab_real_packets_total", "counter", "Packets encapsulated to a real (all VIPs).")
    rb = Family("l4lab_real_bytes_total", "counter", "Bytes encapsulated to a real (all VIPs).")
    for real, c in stats["reals"].items():
        rp.add(c["packets"], real=real)
        rb.add(c["bytes"], real=real)
    qp = Family("l4lab_reason_packets_total", "counter",
                "Packets by final outcome (transmit, pass or drop reason).")
    qb = Family("l4lab_reason_bytes_total", "counter",
                "Bytes by final outcome (transmit, pass or drop reason).")
    for reason, c in stats["reasons"].items():
        qp.add(c["packets"], reason=reason.lower())
        qb.add(c["bytes"], reason=reason.lower())
    ev = Family("l4lab_events_total", "counter",
                "Datapath events besides the outcome (session hits, misses...).")
    for event, n in stats["events"].items():
        ev.add(n, event=event.lower())
    up = Family("l4lab_real_up", "gauge", "1 if the real passes its health checks (or has none), 0 if down.")
    weight = Family("l4lab_real_weight", "gauge", "The real's weight in the VIP's ring now (0 while down).")
    cweight = Family("l4lab_real_configured_weight", "gauge", "The real's weight in the config.")
    checks = Family("l4lab_health_checks_total", "counter", "Health probes of a real by result.")
    for r in reals:
        up.add(1 if r["up"] else 0, vip=r["vip"], real=r["real"])
        weight.add(r["weight"], vip=r["vip"], real=r["real"])
        cweight.add(r["configured_weight"], vip=r["vip"], real=r["real"])
        if r.get("checked"):
            checks.add(r["checks_ok"], vip=r["vip"], real=r["real"], result="ok")
            checks.add(r["checks_failed"], vip=r["vip"], real=r["real"], result="failed")
    ap = Family("l4lab_applies_total", "counter", "Configurations applied to the datapath, by trigger.")
    ae = Family("l4lab_apply_errors_total", "counter",
                "Applies refused (config or datapath error), by trigger.")
    for trigger in sorted({t for t, _ in applies}):
        ap.add(applies.get((trigger, True), 0), trigger=trigger)
        ae.add(applies.get((trigger, False), 0), trigger=trigger)
    info = Family("l4lab_build_info", "gauge", "The controller's version and BPF contract digest; always 1.")
    info.add(1, **dict(build))
    return [vp, vb, rp, rb, qp, qb, ev, up, weight, cweight, checks, ap, ae, info]


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    collect: Callable[[], str]
    on_error: Callable[[BaseException], None]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] != "/metrics":
            self._send(404, "text/plain; charset=utf-8", "not found; metrics are at /metrics\n")
            return
        try:
            body = self.server.collect()
        except Exception as exc:  # a scrape must answer, and the daemon must hear of it
            self.server.on_error(exc)
            self._send(500, "text/plain; charset=utf-8", f"cannot collect metrics: {exc}\n")
            return
        self._send(200, CONTENT_TYPE, body)

    def _send(self, status: int, ctype: str, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        return  # scrapes are not events worth a log line


class MetricsServer:
    """Serves ``collect()`` at http://host:port/metrics on a background thread."""

    def __init__(self, host: str, port: int, collect: Callable[[], str],
                 on_error: Callable[[BaseException], None]) -> None:
        self.host = host
        self.port = port
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        server_class = type("_BoundServer", (_Server,), {"address_family": family})
        try:
            self._server: _Server = server_class((host, port), _Handler)
        except OSError as exc:
            raise LbError(f"cannot listen for metrics on {host}:{port}: "
                          f"{exc.strerror or exc}; change metrics.listen or free the port") from exc
        self._server.collect = collect
        self._server.on_error = on_error
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    @property
    def listen(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

