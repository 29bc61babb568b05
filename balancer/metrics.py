"""metrics.py: the Prometheus metrics of a running instance, built on prometheus_client, served over HTTP.

``GET /metrics`` answers with every family below plus the client's process metrics
(``process_cpu_seconds_total``, ``process_resident_memory_bytes``, ``process_open_fds``, ...); the
instance's collector is called once per request, so values are read from the maps at scrape time.
The format follows the Accept header (prometheus_client's negotiation: the text format 0.0.4 unless
the scraper asks for OpenMetrics or text 1.0.0). Names and labels (tests compare them)::

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
    l4lab_last_reload_success               1 if the last load of the config file (start or SIGHUP) was applied
    l4lab_last_reload_success_timestamp_seconds   when the config file was last applied (Unix time)
    l4lab_build_info{version,abi_digest,python,lb_instance}   always 1

No label is named ``instance``: Prometheus sets that one to the scraped target. Reason and event
label values are the lower-case enum names of ``balancer/_abi.py`` (``tx_encap``, ``drop_no_real``,
``lru_hit``). The server is ``http.server`` on a thread, so /metrics alone answers (404 elsewhere)
and a collector that fails answers 500 and is reported to the daemon.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from balancer.errors import LbError

__all__ = ["InstanceCollector", "MetricsServer", "Snapshot", "instance_families", "registry_for"]


@dataclass(frozen=True)
class Snapshot:
    """What one scrape shows: the instance's counters (``Instance.stats()``), the per-real view
    (dicts with vip, real, up, weight, configured_weight, checked, checks_ok, checks_failed), the
    apply counts keyed by (trigger, succeeded), the last config load (succeeded, Unix time of the
    last success) and the build labels."""

    stats: Mapping[str, Any]
    reals: Iterable[Mapping[str, Any]]
    applies: Mapping[tuple[str, bool], int]
    last_reload: tuple[bool, float]
    build: Mapping[str, str]


def instance_families(snap: Snapshot) -> list[Metric]:
    """Every l4lab family of one snapshot."""
    stats = snap.stats
    vp = CounterMetricFamily("l4lab_vip_packets", "Packets the balancer sent towards a VIP's reals.", labels=["vip"])
    vb = CounterMetricFamily("l4lab_vip_bytes", "Bytes the balancer sent towards a VIP's reals.", labels=["vip"])
    for vip, c in stats["vips"].items():
        vp.add_metric([vip], c["packets"])
        vb.add_metric([vip], c["bytes"])
    rp = CounterMetricFamily("l4lab_real_packets", "Packets encapsulated to a real (all VIPs).", labels=["real"])
    rb = CounterMetricFamily("l4lab_real_bytes", "Bytes encapsulated to a real (all VIPs).", labels=["real"])
    for real, c in stats["reals"].items():
        rp.add_metric([real], c["packets"])
        rb.add_metric([real], c["bytes"])
    qp = CounterMetricFamily("l4lab_reason_packets", "Packets by final outcome (transmit, pass or drop reason).",
                             labels=["reason"])
    qb = CounterMetricFamily("l4lab_reason_bytes", "Bytes by final outcome (transmit, pass or drop reason).",
                             labels=["reason"])
    for reason, c in stats["reasons"].items():
        qp.add_metric([reason.lower()], c["packets"])
        qb.add_metric([reason.lower()], c["bytes"])
    ev = CounterMetricFamily("l4lab_events", "Datapath events besides the outcome (session hits, misses...).",
                             labels=["event"])
    for event, n in stats["events"].items():
        ev.add_metric([event.lower()], n)
    pair = ["vip", "real"]
    up = GaugeMetricFamily("l4lab_real_up", "1 if the real passes its health checks (or has none), 0 if down.",
                           labels=pair)
    weight = GaugeMetricFamily("l4lab_real_weight", "The real's weight in the VIP's ring now (0 while down).",
                               labels=pair)
    cweight = GaugeMetricFamily("l4lab_real_configured_weight", "The real's weight in the config.", labels=pair)
    checks = CounterMetricFamily("l4lab_health_checks", "Health probes of a real by result.",
                                 labels=[*pair, "result"])
    for r in snap.reals:
        key = [r["vip"], r["real"]]
        up.add_metric(key, 1 if r["up"] else 0)
        weight.add_metric(key, r["weight"])
        cweight.add_metric(key, r["configured_weight"])
        if r.get("checked"):
            checks.add_metric([*key, "ok"], r["checks_ok"])
            checks.add_metric([*key, "failed"], r["checks_failed"])
    ap = CounterMetricFamily("l4lab_applies", "Configurations applied to the datapath, by trigger.",
                             labels=["trigger"])
    ae = CounterMetricFamily("l4lab_apply_errors", "Applies refused (config or datapath error), by trigger.",
                             labels=["trigger"])
    for trigger in sorted({t for t, _ in snap.applies}):
        ap.add_metric([trigger], snap.applies.get((trigger, True), 0))
        ae.add_metric([trigger], snap.applies.get((trigger, False), 0))
    ok, at = snap.last_reload
    last = GaugeMetricFamily("l4lab_last_reload_success",
                             "1 if the last load of the config file (start or SIGHUP) was applied, else 0.", ok)
    last_at = GaugeMetricFamily("l4lab_last_reload_success_timestamp_seconds",
                                "Unix time the config file was last applied (start or SIGHUP).", at)
    info = InfoMetricFamily("l4lab_build", "The controller's version and BPF contract digest; always 1.",
                            value=dict(snap.build))
    return [vp, vb, rp, rb, qp, qb, ev, up, weight, cweight, checks, ap, ae, last, last_at, info]


class InstanceCollector(Collector):
    """A prometheus_client collector that takes a `Snapshot` at each scrape."""

    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        yield from instance_families(self._snapshot())


def registry_for(snapshot: Callable[[], Snapshot]) -> CollectorRegistry:
    """A registry of its own (not the client's global one) with the instance's families and the
    process metrics of this process."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(InstanceCollector(snapshot))
    ProcessCollector(registry=registry)
    return registry


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: CollectorRegistry
    on_error: Callable[[BaseException], None]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?", 1)[0] != "/metrics":
            self._send(404, "text/plain; charset=utf-8", b"not found; metrics are at /metrics\n")
            return
        encode, ctype = choose_encoder(self.headers.get("Accept", ""))
        try:
            body = encode(self.server.registry)
        except Exception as exc:  # a scrape must answer, and the daemon must hear of it
            self.server.on_error(exc)
            self._send(500, "text/plain; charset=utf-8", f"cannot collect metrics: {exc}\n".encode())
            return
        self._send(200, ctype, body)

    def _send(self, status: int, ctype: str, data: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (http.server's signature)
        return  # scrapes are not events worth a log line


class MetricsServer:
    """Serves `registry` at http://host:port/metrics on a background thread."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry,
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
        self._server.registry = registry
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

