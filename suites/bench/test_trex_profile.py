"""Unit tests of lab/bench/gen/trex.py's profile builder, offline: profile → JSON, field engine ranges, IMIX mix."""

from __future__ import annotations

import base64
import importlib.util
import ipaddress
import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lab.bench.gen.base import GeneratorError
from lab.bench.gen.trex import (
    FCS_LEN,
    MAC_FROM_PACKET,
    TREX_CLIENT,
    ProfileSpec,
    build_profile,
    split_flows,
)
from lab.bench.gen.xdplive import Endpoints

EP = Endpoints(src_mac="02:00:00:00:0b:01", dst_mac="02:00:00:00:0b:02")
REPO = Path(__file__).resolve().parents[2]


def spec(**kw: Any) -> ProfileSpec:
    base: dict[str, Any] = {"frame_size": 64, "rate_pps": 1e6, "flows": 1024, "family": 4, "endpoints": EP}
    base.update(kw)
    return ProfileSpec(**base)


def instructions(stream: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [i for i in stream["vm"]["instructions"] if i["type"] == kind]


def test_profile_is_plain_json_that_survives_a_round_trip() -> None:
    profile = build_profile(spec(latency_pps=1000))
    assert json.loads(json.dumps(profile)) == profile
    for s in profile:
        assert s["mode"] == {"rate": {"type": "pps", "value": s["mode"]["rate"]["value"]}, "type": "continuous"}
        assert s["flags"] == MAC_FROM_PACKET and s["enabled"] and s["self_start"]


@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize("size", [64, 570, 1518])
def test_packet_is_the_frame_without_fcs_with_valid_checksums(family: int, size: int) -> None:
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether

    (stream,) = build_profile(spec(frame_size=size, family=family))
    raw = base64.b64decode(stream["packet"]["binary"])
    assert len(raw) == max(size - FCS_LEN, 62 if family == 6 else 0)
    pkt = Ether(raw)
    ip_layer = IP if family == 4 else IPv6
    assert pkt[Ether].dst == EP.dst_mac and pkt[Ether].src == EP.src_mac
    assert pkt[ip_layer].dst == (EP.dst4 if family == 4 else EP.dst6)
    assert (pkt[UDP].sport, pkt[UDP].dport) == (EP.sport, EP.dport)
    rebuilt = pkt.copy()
    del rebuilt[UDP].chksum
    if family == 4:
        del rebuilt[IP].chksum
    assert bytes(Ether(bytes(rebuilt))) == raw


@pytest.mark.parametrize(("flows", "addrs"), [(1, 1), (16, 16), (1024, 16), (1000, 10), (97, 1), (4096, 16)])
def test_field_engine_walks_exactly_the_flows(flows: int, addrs: int) -> None:
    (stream,) = build_profile(spec(flows=flows))
    src_addr, src_port = instructions(stream, "flow_var")
    assert (src_addr["name"], src_addr["size"], src_addr["op"], src_addr["next_var"]) == \
        ("src_addr", 4, "inc", "src_port")
    base = int(ipaddress.IPv4Address(EP.src4))
    assert (src_addr["min_value"], src_addr["max_value"], src_addr["init_value"]) == \
        (base, base + addrs - 1, base)
    ports = flows // addrs
    assert (src_port["min_value"], src_port["max_value"]) == (EP.sport, EP.sport + ports - 1)
    span = (src_addr["max_value"] - src_addr["min_value"] + 1) * (src_port["max_value"] - src_port["min_value"] + 1)
    assert span == flows


@pytest.mark.parametrize(("family", "addr_off", "port_off", "l3_len"), [(4, 26, 34, 20), (6, 34, 54, 40)])
def test_field_engine_writes_where_source_address_and_port_live(family: int, addr_off: int, port_off: int,
                                                                 l3_len: int) -> None:
    (stream,) = build_profile(spec(family=family))
    raw = base64.b64decode(stream["packet"]["binary"])
    writes = {w["name"]: w["pkt_offset"] for w in instructions(stream, "write_flow_var")}
    assert writes == {"src_addr": addr_off, "src_port": port_off}
    first_addr = instructions(stream, "flow_var")[0]["min_value"]
    assert int.from_bytes(raw[addr_off: addr_off + 4], "big") == first_addr
    assert int.from_bytes(raw[port_off: port_off + 2], "big") == EP.sport
    (fix,) = instructions(stream, "fix_checksum_hw")
    assert (fix["l2_len"], fix["l3_len"], fix["l4_type"]) == (14, l3_len, 11)


def test_imix_is_three_streams_in_28_16_4_proportion() -> None:
    profile = build_profile(spec(frame_size="imix", rate_pps=4.8e6))
    sizes = [len(base64.b64decode(s["packet"]["binary"])) + FCS_LEN for s in profile]
    rates = [s["mode"]["rate"]["value"] for s in profile]
    assert sizes == [64, 570, 1518]
    assert rates == pytest.approx([2.8e6, 1.6e6, 0.4e6])
    assert sum(rates) == pytest.approx(4.8e6)


def test_latency_stream_has_its_own_packet_group_and_rate() -> None:
    profile = build_profile(spec(latency_pps=1000, latency_pg_id=9))
    *traffic, latency = profile
    assert all(not s["flow_stats"]["enabled"] for s in traffic)
    assert latency["flow_stats"] == {"enabled": True, "stream_id": 9, "vxlan": False, "ieee_1588": False,
                                     "rule_type": "latency"}
    assert latency["mode"]["rate"]["value"] == 1000
    assert latency["vm"]["instructions"] == []


def test_split_flows_refuses_nonsense() -> None:
    assert split_flows(1024, 16) == (16, 64)
    assert split_flows(7, 16) == (7, 1)
    with pytest.raises(GeneratorError, match="must be ≥ 1"):
        split_flows(0, 16)


def test_too_many_flows_for_the_port_range_are_refused() -> None:
    with pytest.raises(GeneratorError, match="source ports up to"):
        build_profile(spec(flows=65521 * 2, src_addrs=1))


def test_bad_frame_size_and_rate_are_refused_by_name() -> None:
    with pytest.raises(GeneratorError, match="frame size must be 64..1518"):
        build_profile(spec(frame_size=40))
    with pytest.raises(GeneratorError, match="rate must be > 0"):
        build_profile(spec(rate_pps=0))


def test_client_without_the_package_or_server_names_both() -> None:
    # In a process of its own: importing lbr_trex_client would replace this process's scapy.
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    script = textwrap.dedent(f"""
        from lab.bench.gen.base import GeneratorError
        from lab.bench.gen.trex import TrexGenerator
        from lab.bench.gen.xdplive import Endpoints
        gen = TrexGenerator("127.0.0.1", Endpoints("02:00:00:00:0b:01", "02:00:00:00:0b:02"),
                            sync_port={port}, async_port={port})
        try:
            gen.connect()
        except GeneratorError as exc:
            print("GeneratorError:", exc)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=REPO, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    message = done.stdout
    assert message.startswith("GeneratorError:") and "v3.04" in message
    if importlib.util.find_spec("lbr_trex_client") is None:
        assert TREX_CLIENT in message
    else:
        assert "127.0.0.1" in message and f"sync port {port}" in message


@pytest.mark.skipif(importlib.util.find_spec("lbr_trex_client") is None,
                    reason=f"TRex's own parser needs {TREX_CLIENT}: pip install {TREX_CLIENT}")
def test_trex_own_api_parses_the_profile_back_unchanged(tmp_path: Path) -> None:
    # lbr_trex_client swaps scapy for its bundled copy, so TRex's parser runs in a process of its own.
    profile = build_profile(spec(frame_size="imix", family=6, latency_pps=500))
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    script = textwrap.dedent("""
        import json, sys, warnings
        warnings.simplefilter("ignore")
        import lbr_trex_client
        from trex.stl.api import STLProfile
        mine = json.load(open(sys.argv[1]))
        theirs = STLProfile.from_json(mine).to_json()
        print(json.dumps(theirs))
    """)
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path / "profile.json")], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    assert theirs == profile


def test_latency_percentiles_come_from_trex_histogram() -> None:
    """p50/p99 from TRex's latency histogram (bucket lower bound in µs → packets), clamped to min/max."""
    from lab.bench.gen.trex import _latency, histogram_percentile

    # 100 packets: 60 in 10-20 µs, 39 in 20-30 µs, 1 in 100 µs-max.
    hist = {"10": 60, "20": 39, "100": 1, "200": 0}
    assert histogram_percentile(hist, 0.5, 11.0, 140.0) == pytest.approx(10 + 10 * 50 / 60, abs=1e-3)
    assert histogram_percentile(hist, 0.99, 11.0, 140.0) == pytest.approx(30.0)
    assert histogram_percentile(hist, 1.0, 11.0, 140.0) == pytest.approx(140.0)
    assert histogram_percentile({"10": 5}, 0.01, 12.5, 13.0) == 12.5, "clamped to the stream's own min"
    assert histogram_percentile({}, 0.5, 1.0, 2.0) is None
    stats = {"latency": {7: {"latency": {"total_min": 11.0, "average": 19.0, "total_max": 140.0,
                                         "histogram": hist}}}}
    lat = _latency(stats, 7)
    assert lat is not None and lat.min_us <= lat.p50_us <= lat.p99_us <= lat.max_us  # type: ignore[operator]


def test_nic_identity_from_ethtool_and_lspci() -> None:
    from lab.bench.trex import nic_identity

    text = ("driver: mlx5_core\nversion: 6.18.0\nfirmware-version: 16.35.2000\nbus-info: 0000:3b:00.0\n"
            '3b:00.0 "Ethernet controller [0200]" "Mellanox Technologies [15b3]" '
            '"MT27800 Family [ConnectX-5] [1017]" -r00 "Mellanox Technologies [15b3]" "ConnectX-5 [0008]"\n')
    assert nic_identity(text) == ("mlx5_core", "Mellanox Technologies [15b3] MT27800 Family [ConnectX-5] [1017]")
    assert nic_identity("driver: veth\nbus-info: \n") == ("veth", "")
    assert nic_identity("") == ("", "")
