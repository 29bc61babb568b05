"""The TRex stateless generator: a profile builder (streams as the JSON the STL API takes) and a thin client.

The builder is pure data, testable offline: one continuous stream per frame size (one, or the
three of IMIX with rates in the 28:16:4 proportion), each with a field engine that walks N flows
the way bpf/trafficgen.bpf.c does (source address base + i, chained to source port base + j, so
flows = addresses × ports), hardware checksum fixing, and optionally a latency stream (TRex's
flow-stats "latency" rule) at a fixed low rate. Frame sizes follow RFC 2544 here: the size
includes the 4-byte FCS the NIC appends, so a 64-byte frame is a 60-byte packet (IPv6/UDP headers
need 62 bytes: IPv6's smallest frame is 66 bytes).

The client (`TrexGenerator`) drives a TRex server through the Python package `lbr-trex-client`,
pinned to TREX_CLIENT (its versions follow TRex's: 3.4.0 ↔ server v3.04). It is imported only when
a TrexGenerator connects; that import replaces `scapy` in the process with TRex's bundled copy, so
use it from a process of its own (the hardware bench), not inside a suite that needs our scapy.
"""

from __future__ import annotations

import base64
import math
import warnings
from dataclasses import dataclass
from typing import Any

from lab.bench.gen.base import (
    Endpoints,
    Family,
    FrameSpec,
    Generator,
    GeneratorError,
    Latency,
    TrialResult,
    build_frame,
    check_trial,
    frame_mix,
)

TREX_CLIENT = "lbr-trex-client==3.4.0"
TREX_SERVER_VERSION = "v3.04"
FCS_LEN = 4
ETH_LEN = 14
UDP_L4_TYPE = 11  # TRex's code for "fix the UDP checksum" (fix_checksum_hw)
MAC_FROM_PACKET = 1 | 1 << 1  # stream flags: source and destination MAC from the packet, not the port
LATENCY_PG_ID = 7


@dataclass(frozen=True)
class ProfileSpec:
    """What a profile sends: frame size or IMIX, total rate, flows, family, addresses, latency stream."""

    frame_size: FrameSpec
    rate_pps: float
    flows: int
    family: Family
    endpoints: Endpoints
    src_addrs: int = 16
    latency_pps: float = 0.0  # 0: no latency stream
    latency_pg_id: int = LATENCY_PG_ID


def split_flows(flows: int, src_addrs: int) -> tuple[int, int]:
    """(addresses, ports) with addresses × ports == flows: the largest divisor of flows ≤ src_addrs."""
    if flows < 1 or src_addrs < 1:
        raise GeneratorError(f"flows and source addresses must be ≥ 1 but got {flows} and {src_addrs}")
    addrs = max(d for d in range(1, min(flows, src_addrs) + 1) if flows % d == 0)
    return addrs, flows // addrs


def _src_offsets(family: Family) -> tuple[int, int, int]:
    """Packet offsets of the source address's last 32-bit word and of the UDP source port, and L3 length."""
    if family == 4:
        return ETH_LEN + 12, ETH_LEN + 20, 20
    return ETH_LEN + 8 + 12, ETH_LEN + 40, 40


def field_engine(frame: bytes, family: Family, flows: int, src_addrs: int) -> dict[str, Any]:
    """The STL VM: source address word and source port walk flows; hardware fixes the checksums."""
    addrs, ports = split_flows(flows, src_addrs)
    addr_off, port_off, l3_len = _src_offsets(family)
    addr0 = int.from_bytes(frame[addr_off: addr_off + 4], "big")
    port0 = int.from_bytes(frame[port_off: port_off + 2], "big")
    if addr0 + addrs - 1 > 0xFFFFFFFF or port0 + ports - 1 > 0xFFFF:
        raise GeneratorError(f"{flows} flows from {addrs} addresses need source ports up to "
                             f"{port0 + ports - 1}; use fewer flows or more source addresses")
    return {"instructions": [
        {"type": "flow_var", "name": "src_addr", "size": 4, "op": "inc", "next_var": "src_port",
         "split_to_cores": True, "init_value": addr0, "min_value": addr0, "max_value": addr0 + addrs - 1,
         "step": 1},
        {"type": "flow_var", "name": "src_port", "size": 2, "op": "inc", "next_var": None,
         "split_to_cores": False, "init_value": port0, "min_value": port0, "max_value": port0 + ports - 1,
         "step": 1},
        {"type": "write_flow_var", "name": "src_addr", "pkt_offset": addr_off, "add_value": 0,
         "is_big_endian": True},
        {"type": "write_flow_var", "name": "src_port", "pkt_offset": port_off, "add_value": 0,
         "is_big_endian": True},
        {"type": "fix_checksum_hw", "l2_len": ETH_LEN, "l3_len": l3_len, "l4_type": UDP_L4_TYPE},
    ]}


def stream(name: str, packet: bytes, pps: float, vm: dict[str, Any] | None = None,
           latency_pg_id: int | None = None) -> dict[str, Any]:
    """One continuous STL stream as the STL API's JSON (STLStream.to_json / from_json)."""
    flow_stats: dict[str, Any] = {"enabled": False}
    if latency_pg_id is not None:
        flow_stats = {"enabled": True, "stream_id": latency_pg_id, "vxlan": False, "ieee_1588": False,
                      "rule_type": "latency"}
    return {
        "name": name,
        "flags": MAC_FROM_PACKET,
        "action_count": 0,
        "enabled": True,
        "self_start": True,
        "start_paused": False,
        "isg": 0.0,
        "core_id": -1,
        "mode": {"rate": {"type": "pps", "value": pps}, "type": "continuous"},
        "packet": {"binary": base64.b64encode(packet).decode(), "meta": ""},
        "vm": vm if vm is not None else {"instructions": []},
        "flow_stats": flow_stats,
    }


def packet_size(frame_size: int, family: Family) -> int:
    """Bytes TRex sends for a frame of `frame_size` on the wire: without the FCS, at least the headers."""
    return max(frame_size - FCS_LEN, ETH_LEN + (20 if family == 4 else 40) + 8)


def build_profile(spec: ProfileSpec) -> list[dict[str, Any]]:
    """The streams of one trial: one per frame size of the mix (rates in its proportion), then latency."""
    if not spec.rate_pps > 0:
        raise GeneratorError(f"profile rate must be > 0 packets/s but got {spec.rate_pps!r}")
    mix = frame_mix(spec.frame_size)
    total = sum(share for _, share in mix)
    streams = []
    for size, share in mix:
        packet = build_frame(packet_size(size, spec.family), spec.family, spec.endpoints)
        vm = field_engine(packet, spec.family, spec.flows, spec.src_addrs)
        streams.append(stream(f"udp{spec.family}-{size}", packet, spec.rate_pps * share / total, vm))
    if spec.latency_pps > 0:
        packet = build_frame(packet_size(mix[0][0], spec.family), spec.family, spec.endpoints)
        streams.append(stream(f"latency{spec.family}", packet, spec.latency_pps,
                              latency_pg_id=spec.latency_pg_id))
    return streams


# --- the client ------------------------------------------------------------------------------------


def _stl_api() -> Any:
    """trex.stl.api from lbr-trex-client, or a GeneratorError naming the package and server version."""
    try:
        import lbr_trex_client  # noqa: F401 (sets the paths trex.* needs)

        with warnings.catch_warnings():
            # Its bundled scapy 2.4.3 names TripleDES where cryptography >= 43 (aioquic's, in the lab
            # extra) has moved it: a deprecation warning on stderr at every import, nothing broken.
            warnings.filterwarnings("ignore", message="TripleDES has been moved")
            from trex.stl import api
    except ImportError as exc:
        raise GeneratorError(f"the TRex generator needs the Python package {TREX_CLIENT} (client of TRex "
                             f"server {TREX_SERVER_VERSION}); install it with `pip install {TREX_CLIENT}`"
                             ) from exc
    except Exception as exc:  # its bundled scapy clashing with one imported before
        raise GeneratorError(f"importing {TREX_CLIENT} failed ({type(exc).__name__}: {exc}); it replaces "
                             "scapy with its own copy, so run the TRex generator in a process that has "
                             "not imported scapy") from exc
    return api


class TrexGenerator(Generator):
    """Trials on a TRex server: transmit on `tx_port`, count on `rx_port` (the single-arm LB set-up)."""

    name = "trex"

    def __init__(self, server: str, endpoints: Endpoints, tx_port: int = 0, rx_port: int = 1,
                 sync_port: int = 4501, async_port: int = 4500, src_addrs: int = 16,
                 latency_pps: float = 1000.0) -> None:
        self.server = server
        self.endpoints = endpoints
        self.tx_port = tx_port
        self.rx_port = rx_port
        self.sync_port = sync_port
        self.async_port = async_port
        self.src_addrs = src_addrs
        self.latency_pps = latency_pps
        self._api: Any = None
        self._client: Any = None

    def connect(self) -> None:
        api = _stl_api()
        client = api.STLClient(server=self.server, sync_port=self.sync_port, async_port=self.async_port)
        try:
            client.connect()
            client.reset(ports=sorted({self.tx_port, self.rx_port}))
        except Exception as exc:  # TRexError and socket errors alike
            raise GeneratorError(f"cannot use the TRex server at {self.server} (sync port {self.sync_port}): "
                                 f"{exc}; start `./t-rex-64 -i` there (TRex {TREX_SERVER_VERSION}, the "
                                 f"version {TREX_CLIENT} speaks)") from exc
        self._api, self._client = api, client

    def run(self, rate_pps: float, duration_s: float, frame_size: FrameSpec, flows: int,
            family: Family) -> TrialResult:
        check_trial(rate_pps, duration_s, flows, family)
        if self._client is None:
            self.connect()
        api, client = self._api, self._client
        spec = ProfileSpec(frame_size, rate_pps, flows, family, self.endpoints, self.src_addrs,
                           self.latency_pps)
        streams = [api.STLStream.from_json(s) for s in build_profile(spec)]
        ports = [self.tx_port]
        try:
            client.remove_all_streams(ports=ports)
            client.add_streams(streams, ports=ports)
            client.clear_stats()
            client.start(ports=ports, duration=duration_s, force=True)
            client.wait_on_traffic(ports=ports, rx_delay_ms=100)
            stats = client.get_stats()
        except Exception as exc:
            raise GeneratorError(f"TRex trial at {rate_pps:.0f} pps on {self.server} failed: {exc}") from exc
        sent = int(stats[self.tx_port]["opackets"])
        received = int(stats[self.rx_port]["ipackets"])
        return TrialResult(offered=sent, sent=sent, received=received, duration=duration_s,
                           latency=_latency(stats, LATENCY_PG_ID) if self.latency_pps > 0 else None)

    def close(self) -> None:
        if self._client is not None:
            self._client.disconnect()
            self._client = None


def _latency(stats: dict[str, Any], pg_id: int) -> Latency | None:
    lat = stats.get("latency", {}).get(pg_id, {}).get("latency")
    if not lat:
        return None
    values = [lat.get("total_min", math.nan), lat.get("average", math.nan), lat.get("total_max", math.nan)]
    if any(not isinstance(v, int | float) for v in values):
        return None
    low, high = float(values[0]), float(values[2])
    hist = lat.get("histogram") or {}
    return Latency(min_us=low, avg_us=float(values[1]), max_us=high,
                   p50_us=histogram_percentile(hist, 0.50, low, high),
                   p99_us=histogram_percentile(hist, 0.99, low, high))


def histogram_percentile(hist: dict[Any, Any], q: float, low: float, high: float) -> float | None:
    """The q-quantile (0..1) of TRex's latency histogram, in µs; None for an empty histogram.

    TRex keys each bucket by its lower bound in µs (10, 20, … 90, 100, 200, … 900, 1000, …), the
    count of packets whose latency fell in it as value: a bucket is as wide as its key's leading
    decade (10 µs below 100, 100 µs below 1000, …). The quantile is interpolated linearly inside
    its bucket, then clamped to the stream's own [min, max]: the bucket bounds are coarser than the
    exact extremes TRex reports.
    """
    buckets = sorted((float(k), int(v)) for k, v in hist.items() if int(v) > 0)
    total = sum(n for _, n in buckets)
    if total == 0:
        return None
    want = q * total
    seen = 0
    for start, count in buckets:
        if seen + count >= want:
            width = 10 ** math.floor(math.log10(start)) if start >= 1 else 1.0
            value = start + width * (want - seen) / count
            return round(min(max(value, low), high), 3)
        seen += count
    return round(high, 3)
