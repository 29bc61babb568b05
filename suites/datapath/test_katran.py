"""test_katran.py: Katran's own datapath fixtures replayed against our balancer and decap programs.

The corpus (../shared/conformance/katran/, 193 cases) is replayed in file order on one balancer
instance configured from config.json: the VIPs, reals (by Katran's real index), VIP flags mapped to
ours, GUE port 9886, router MAC and outer sources. Our rings differ from Katran's (our hash, every
listed real reachable), so an encapsulated output is compared by structure: outer protocol, outer
destination one of the VIP's reals, the inner packet byte-identical to the input's IP packet, valid
checksums, MACs as configured. Other outputs (echo replies, too-big answers, passed frames) are
compared by their fields. Decap fixtures run against our decap_xdp. Every difference is listed in
EXCEPTIONS with the reason; anything else that differs fails the test.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from typing import Any

import pytest
from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from balancer import _abi
from balancer.datapath import Decap
from suites.corpus import KATRAN_CORPUS as CORPUS

from .conftest import DECAP_OBJ, XDP_VERDICTS, Balancer, BalancerFactory
from .frames import decode_encap, icmp4_checksum_ok, ip_packet_of, ipv4_header_ok, l4_checksum_ok_v6

KATRAN_GUE_PORT = 9886
RING = 257

# Katran VIP flag bit -> ours. Bits without a counterpart (QUIC, source routing, local VIP, global
# LRU, stable routing, flow migration) hash as an ordinary VIP.
FLAG_MAP = {1: _abi.VipFlag.HASH_NO_SPORT, 2: _abi.VipFlag.NO_LRU, 8: _abi.VipFlag.HASH_DPORT_ONLY}

# Programs and features we do not implement: their cases are not compared.
NOT_OURS_PROGRAMS = {
    "healthchecking.bpf.c:healthcheck_encap": "Katran's healthcheck tc program: not part of l4lab",
    "tc_srcmatch.bpf.c:tc_srcmatch": "Katran's tc source-match program: not part of l4lab",
}
NOT_OURS_DEFINES = {
    "CIDR_VIP": "CIDR (LPM) VIPs are not implemented; l4lab VIPs are single addresses",
    "INLINE_DECAP_GUE": "inline GUE decap on the LB (xpop/egress decap) is not implemented",
}

# Cases where our verdict or output deliberately differs from Katran's, with the reason.
_NO_DF = ("IPv4 over the egress MTU without DF: Katran answers frag-needed, which a sender without DF "
          "ignores; we do not fragment either, so we drop it and count DROP_TOO_BIG_NO_DF")
_DECAP_FRAGMENT = ("a fragment reaching the real server: Katran's decap drops it; ours passes it to the "
                   "kernel (reassembly first, as the kernel's own tunnels do)")
EXCEPTIONS: dict[int, str] = {96: _NO_DF, 98: _NO_DF, 164: _DECAP_FRAGMENT, 165: _DECAP_FRAGMENT,
                              175: _DECAP_FRAGMENT, 176: _DECAP_FRAGMENT}
EXPECTED_COMPARED = 158
EXPECTED_MATCHED = 152


def load_corpus() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if not (CORPUS / "fixtures.json").exists():
        pytest.skip(f"the Katran corpus is not at {CORPUS} (set L4LAB_KATRAN_CORPUS)")
    config = json.loads((CORPUS / "config.json").read_text())
    cases = json.loads((CORPUS / "fixtures.json").read_text())
    return config, cases


class KatranWorld:
    """Programs our balancer the way each Katran profile and build flavour expects."""

    def __init__(self, b: Balancer, config: dict[str, Any]) -> None:
        self.b = b
        self.config = config
        self.profile = ""
        self.gue = False
        self.keys: list[tuple[str, int, str]] = []
        self.vip_reals: dict[tuple[str, int, str], set[str]] = {}
        b.settings(nexthop_mac=config["macs"]["router_default_mac"], src4=config["katran_src"]["v4"] + "/32",
                   src6=config["katran_src"]["v6"] + "/128", gue_port=KATRAN_GUE_PORT, mtu=1500)

    def use(self, profile: str, gue: bool) -> None:
        if (profile, gue) == (self.profile, self.gue):
            return
        for address, port, proto in self.keys:
            self.b.dp.del_vip(address, port, proto)
        self.keys.clear()
        p = self.config["profiles"][profile]
        reals = {r["real_index"]: r["address"] for r in p.get("reals", [])}
        for idx, addr in reals.items():
            self.b.dp.put_real(idx, addr)
            self.b.real_ids[addr] = idx
        for v in p.get("vips", []):
            flags = 0
            for bit, ours in FLAG_MAP.items():
                if v["flags"] & bit:
                    flags |= ours
            vip_id = f"{v['address']}:{v['port']}/{_proto_num(v['proto'])}"
            down = set(p.get("down_reals", {}).get(vip_id, []))
            live = [r["address"] for r in v["reals"] if r["real_index"] not in down]
            if not v["ring_initialized"]:
                live = []
            self.b.vip(v["address"], v["port"], v["proto"], v["vip_num"], live, "GUE1" if gue else "IPIP",
                       flags=flags)
            key = (v["address"], v["port"], v["proto"])
            self.keys.append(key)
            self.vip_reals[key] = set(live)
        self.profile, self.gue = profile, gue


def _proto_num(proto: str) -> int:
    return {"tcp": 6, "udp": 17}[proto]


def input_ip(frame: bytes) -> bytes:
    return ip_packet_of(frame)


def check_encap(out: bytes, frame: bytes, reals: set[str], gue: bool) -> str:
    """'' when our encapsulated output has Katran's structure, else what differs."""
    enc = decode_encap(out, KATRAN_GUE_PORT)
    if (enc.eth.dst, enc.eth.src) != ("00:00:de:ad:be:af", Ether(frame).dst):
        return f"MACs {enc.eth.dst}/{enc.eth.src}"
    if (enc.udp is not None) != gue:
        return "outer protocol: GUE expected" if gue else "outer protocol: IPIP expected"
    if str(enc.outer.dst) not in reals:
        return f"outer destination {enc.outer.dst} is not a configured real"
    if enc.inner != input_ip(frame):
        return "inner packet differs from the input's IP packet"
    if isinstance(enc.outer, IP) and not ipv4_header_ok(enc.outer_bytes):
        return "outer IPv4 header checksum"
    if isinstance(enc.outer, IPv6) and gue and not l4_checksum_ok_v6(enc.outer_bytes):
        return "outer UDP checksum"
    return ""


def check_balancer_output(case: dict[str, Any], verdict: str, out: bytes, frame: bytes,
                          world: KatranWorld) -> str:
    want = case["expected_action"]
    if verdict != want:
        return f"verdict {verdict}, Katran {want}"
    expected = bytes.fromhex(case["expected_output_hex"] or "")
    if verdict in ("XDP_PASS", "XDP_DROP"):
        return "" if out == frame else "a passed frame was changed"
    exp_eth = Ether(expected)
    exp_ip = exp_eth.payload
    to_router = exp_eth.dst == world.config["macs"]["router_default_mac"]
    encapsulated = to_router and ((isinstance(exp_ip, IP) and exp_ip.proto in (4, 41, 17))
                                  or (isinstance(exp_ip, IPv6) and exp_ip.nh in (4, 41, 17)))
    if encapsulated:
        all_reals = set().union(*world.vip_reals.values())
        return check_encap(out, frame, all_reals, world.gue)
    # An answer to the client: echo reply or too big. Same addresses, same ICMP type and code.
    got_ip = Ether(out).payload
    if (got_ip.src, got_ip.dst) != (exp_ip.src, exp_ip.dst) or Ether(out).dst != exp_eth.dst:
        return f"answer {got_ip.src} -> {got_ip.dst}, Katran {exp_ip.src} -> {exp_ip.dst}"
    raw = bytes(got_ip)
    if isinstance(got_ip, IP):
        hdr = (raw[0] & 0xF) * 4
        if bytes(exp_ip)[hdr: hdr + 2] != raw[hdr: hdr + 2]:
            return "ICMP type/code"
        return "" if ipv4_header_ok(raw) and icmp4_checksum_ok(raw) else "ICMP checksums"
    if bytes(exp_ip)[40:42] != raw[40:42]:
        return "ICMPv6 type/code"
    return "" if l4_checksum_ok_v6(raw) else "ICMPv6 checksum"


def outer_dst_of_tunnel(frame: bytes) -> str | None:
    eth = Ether(frame)
    ip = eth.payload
    gue_port = struct.pack("!H", KATRAN_GUE_PORT)
    if isinstance(ip, IP) and (ip.proto in (4, 41) or (ip.proto == 17 and bytes(ip)[22:24] == gue_port)):
        return str(ip.dst)
    if isinstance(ip, IPv6) and (ip.nh in (4, 41) or (ip.nh == 17 and bytes(ip)[42:44] == gue_port)):
        return str(ip.dst)
    return None


def test_katran_fixtures(balancer_factory: BalancerFactory) -> None:
    config, cases = load_corpus()
    b = balancer_factory(world=False, ring_size=RING, max_vips=32, max_reals=64)
    world = KatranWorld(b, config)
    decap = Decap.load(str(DECAP_OBJ), gue_port=KATRAN_GUE_PORT)
    skipped: Counter[str] = Counter()
    features: Counter[str] = Counter()
    compared = matched = excepted = 0
    failures: list[str] = []
    try:
        for case in cases:
            cid, prog, defines = case["id"], case["program"], case["required_defines"]
            if prog in NOT_OURS_PROGRAMS:
                skipped[NOT_OURS_PROGRAMS[prog]] += 1
                continue
            missing = [d for d in defines if d.split("=")[0] in NOT_OURS_DEFINES]
            if missing and prog == "balancer":
                skipped[NOT_OURS_DEFINES[missing[0].split("=")[0]]] += 1
                continue
            frame = bytes.fromhex(case["input_hex"])
            if prog == "balancer":
                world.use(case["config_profile"], "GUE_ENCAP" in defines)
                action, out = b.dp.run(frame)
                verdict = XDP_VERDICTS.get(action, str(action))
                problem = check_balancer_output(case, verdict, out, frame, world)
            else:  # Katran's real-server decap program
                dst = outer_dst_of_tunnel(frame)
                if dst is not None:
                    decap.add_local(dst)
                action, out = decap.run_xdp(frame)
                verdict = XDP_VERDICTS.get(action, str(action))
                problem = check_decap_output(case, verdict, out)
            compared += 1
            features[case["feature"]] += 1
            if not problem:
                matched += 1
            elif cid in EXCEPTIONS:
                excepted += 1
            else:
                failures.append(f"#{cid} {case['description'][:70]}: {problem}")
    finally:
        decap.close()
    print(f"\nKatran fixtures: {len(cases)} cases, {compared} compared, {matched} matched, "
          f"{excepted} documented exceptions, {sum(skipped.values())} not compared:")
    for why, n in skipped.items():
        print(f"  {n:3d} not compared: {why}")
    for feature, n in sorted(features.items()):
        print(f"  {n:3d} compared: {feature}")
    for cid, why in EXCEPTIONS.items():
        print(f"  exception #{cid}: {why}")
    assert not failures, "\n".join(failures)
    assert (compared, matched, excepted) == (EXPECTED_COMPARED, EXPECTED_MATCHED, len(EXCEPTIONS))


def check_decap_output(case: dict[str, Any], verdict: str, out: bytes) -> str:
    want = case["expected_action"]
    if verdict != want:
        return f"verdict {verdict}, Katran {want}"
    expected = bytes.fromhex(case["expected_output_hex"] or "")
    if out != expected:
        return f"output differs: ours {out.hex()} Katran {expected.hex()}"
    return ""
