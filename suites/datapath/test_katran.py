"""test_katran.py: Katran's own datapath fixtures replayed against our balancer and decap programs.

The corpus (../shared/conformance/katran/, 193 cases) is replayed in file order on one balancer
instance configured from config.json: the VIPs, reals (by Katran's real index), VIP flags mapped to
ours, GUE port 9886, router MAC and outer sources; decap fixtures run against our decap_xdp.

Every case has one row in CASES saying what it proves, in one of four kinds:

- Exact: our output frame is Katran's byte for byte, with the verdict Katran gave and the reason
  counter named in the row.
- SameReal: Katran's verdict (XDP_TX, TX_ENCAP) and Katran's encapsulation structure (outer
  protocol, MACs, inner packet byte-identical to the input's IP packet, valid checksums), sent to
  one of the live reals of the VIP named in the row. Our flow hash and ring are our own (DESIGN 4),
  so the real may legitimately differ from Katran's: the row says so, and where the case repeats an
  earlier flow (an LRU hit, an ICMP error about the flow, dst-port-only hashing) the real must be the
  one we chose for that earlier case.
- Deviation: we deliberately differ (README beside the corpus); the row pins our verdict and reason,
  and the test fails if we ever answer as Katran does (a stale row).
- NotApplicable: the case exercises a feature l4lab does not implement, named in the row; it is not run.

The four counts are printed (`pytest suites/datapath -k katran -s`), asserted, and written as the
result `corpus.test_katran_fixtures.json`.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from dataclasses import dataclass
from typing import Any

from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from balancer import _abi
from balancer.datapath import Decap
from reports.schema import CorpusPayload, write_result
from suites.corpus import corpus_file

from .frames import decode_encap, icmp4_checksum_ok, ip_packet_of, ipv4_header_ok, l4_checksum_ok_v6
from .rig import DECAP_OBJ, XDP_VERDICTS, BalancerFactory, RunBalancer

KATRAN_GUE_PORT = 9886
RING = 257

# Katran VIP flag bit -> ours. Bits without a counterpart (QUIC, source routing, local VIP, global
# LRU, stable routing, flow migration) belong to cases that are NotApplicable.
FLAG_MAP = {1: _abi.VipFlag.HASH_NO_SPORT, 2: _abi.VipFlag.NO_LRU, 8: _abi.VipFlag.HASH_DPORT_ONLY}

Vip = tuple[str, int, str]  # address, port (0: any), protocol


# ------------------------------------------------------------------------------ what each case proves


@dataclass(frozen=True)
class Exact:
    """Our output is Katran's byte for byte; `reason` is the counter the frame moves in our program."""

    reason: str


@dataclass(frozen=True)
class SameReal:
    """Katran's verdict and encapsulation, to a live real of `vip`; `why` our real may differ from
    Katran's; `same_as`: an earlier case of the same flow whose real we must choose again."""

    vip: Vip
    why: str
    same_as: int = 0


@dataclass(frozen=True)
class Deviation:
    """We deliberately answer otherwise: our verdict, our reason, and why; `mtu`: the MTU our
    ICMPv6 Packet Too Big advertises."""

    verdict: str
    reason: str
    why: str
    mtu: int = 0


@dataclass(frozen=True)
class NotApplicable:
    """The case exercises a feature l4lab does not implement."""

    feature: str


Expectation = Exact | SameReal | Deviation | NotApplicable

OWN_HASH = ("l4lab's flow hash and ring are its own (DESIGN 4; here a cyclic 257-slot test ring), so any "
            "live real of the VIP is as right as the one Katran's hash picks")
SAME_FLOW = "the flow of the earlier case (other ToS/traffic class): the real we chose for it"
LRU_HIT = "Katran's LRU hit on the earlier case's flow: the real we chose for it (our session table)"
ICMP_ABOUT_FLOW = "an ICMP error quoting the earlier case's flow is steered to that flow's real"
DPORT_ONLY = "dst-port-only hashing (F_HASH_DPORT_ONLY): another source, the earlier case's real"
NO_DF = ("IPv4 over the egress MTU without DF: Katran answers frag-needed, which a sender without DF "
         "ignores; we do not fragment either, so we drop it and count it")
TOO_BIG_MTU = ("we answer Packet Too Big as Katran does but advertise the MTU left after the encapsulation "
               "overhead (1460 for IPv6 in IPv6, 1452 for GUE over IPv6); Katran advertises 1500 (0 in its "
               "Meta-internal origin-GUE variant), which lets the next full-size packet black-hole")
DECAP_FRAGMENT = ("a fragment reaching the real server: Katran's decap drops it; ours passes it to the "
                  "kernel, which reassembles it (as the kernel's own tunnels do)")

QUIC = NotApplicable("QUIC connection-id (server id) routing; l4lab hashes QUIC as plain UDP")
FLOW_MIGRATION = NotApplicable("UDP flow migration away from a down real (F_UDP_FLOW_MIGRATION)")
CIDR = NotApplicable("CIDR (LPM) VIPs; l4lab VIPs are single addresses")
INLINE_DECAP = NotApplicable("inline GUE decap on the LB (xpop / egress decap, INLINE_DECAP_GUE)")
HEALTHCHECK_TC = NotApplicable("Katran's healthcheck tc program (healthchecking.bpf.c); l4lab's health "
                               "checks are user-space probes")
LPM_SRC = NotApplicable("source-prefix (LPM) routing to a fixed real (LPM_SRC_LOOKUP)")
TCP_SERVER_ID = NotApplicable("TCP server-id routing from a TCP header option (TCP_SERVER_ID_ROUTING)")
STABLE_ROUTING = NotApplicable("UDP stable routing by a server id in the payload (UDP_STABLE_ROUTING)")
TC_SRCMATCH = NotApplicable("Katran's tc source-match program (tc_srcmatch.bpf.c)")

V4_UDP80: Vip = ("10.200.1.1", 80, "udp")
V4_TCP80: Vip = ("10.200.1.1", 80, "tcp")
V4_ANYPORT: Vip = ("10.200.1.2", 0, "tcp")
V4_V6REALS: Vip = ("10.200.1.3", 80, "tcp")
V4_DPORT_ONLY: Vip = ("10.200.1.4", 0, "tcp")
V6_TCP80: Vip = ("fc00:1::1", 80, "tcp")


def _each(first: int, last: int, expectation: Expectation) -> dict[int, Expectation]:
    return dict.fromkeys(range(first, last + 1), expectation)


CASES: dict[int, Expectation] = {
    # IPIP encap (default build)
    1: SameReal(V4_UDP80, OWN_HASH),
    2: SameReal(V4_TCP80, OWN_HASH),
    3: SameReal(V4_TCP80, SAME_FLOW, same_as=2),
    4: SameReal(V4_ANYPORT, OWN_HASH),
    5: SameReal(V4_V6REALS, OWN_HASH),
    6: SameReal(V6_TCP80, OWN_HASH),
    7: SameReal(V6_TCP80, SAME_FLOW, same_as=6),
    8: Exact("TX_ICMP_ECHO"),
    9: Exact("TX_ICMP_ECHO"),
    10: SameReal(V4_TCP80, ICMP_ABOUT_FLOW, same_as=2),
    11: SameReal(V6_TCP80, ICMP_ABOUT_FLOW, same_as=6),
    12: Exact("DROP_IP_OPTIONS"),
    13: Exact("DROP_FRAGMENT"),
    14: Exact("DROP_FRAGMENT"),
    15: Exact("PASS_NOT_VIP"),
    16: Exact("PASS_NOT_VIP"),
    17: Exact("PASS_NOT_IP"),
    18: SameReal(V4_TCP80, LRU_HIT, same_as=2),
    19: SameReal(V4_DPORT_ONLY, OWN_HASH),
    20: SameReal(V4_DPORT_ONLY, DPORT_ONLY, same_as=19),
    21: Exact("PASS_NOT_VIP"),
    22: Exact("PASS_NOT_VIP"),
    23: Exact("PASS_NOT_VIP"),
    **_each(24, 32, QUIC),
    33: Exact("DROP_TOO_BIG_NO_DF"),
    34: QUIC,
    35: QUIC,
    36: FLOW_MIGRATION,
    **_each(37, 45, CIDR),
    **_each(46, 51, INLINE_DECAP),
    # GUE encap
    52: SameReal(V4_UDP80, OWN_HASH),
    53: SameReal(V4_TCP80, OWN_HASH),
    54: SameReal(V4_ANYPORT, OWN_HASH),
    55: SameReal(V4_V6REALS, OWN_HASH),
    56: SameReal(V6_TCP80, OWN_HASH),
    57: Exact("TX_ICMP_ECHO"),
    58: Exact("TX_ICMP_ECHO"),
    59: SameReal(V4_TCP80, ICMP_ABOUT_FLOW, same_as=53),
    60: SameReal(V6_TCP80, ICMP_ABOUT_FLOW, same_as=56),
    61: Exact("DROP_IP_OPTIONS"),
    62: Exact("DROP_FRAGMENT"),
    63: Exact("DROP_FRAGMENT"),
    64: Exact("PASS_NOT_VIP"),
    65: Exact("PASS_NOT_VIP"),
    66: Exact("PASS_NOT_IP"),
    67: SameReal(V4_TCP80, LRU_HIT, same_as=53),
    68: SameReal(V4_DPORT_ONLY, OWN_HASH),
    69: SameReal(V4_DPORT_ONLY, DPORT_ONLY, same_as=68),
    70: Exact("PASS_NOT_VIP"),
    71: Exact("PASS_NOT_VIP"),
    72: Exact("PASS_NOT_VIP"),
    **_each(73, 81, QUIC),
    82: SameReal(V4_TCP80, SAME_FLOW, same_as=53),
    83: SameReal(V6_TCP80, SAME_FLOW, same_as=56),
    84: QUIC,
    85: QUIC,
    86: Exact("DROP_NO_REAL"),
    87: Exact("DROP_NO_REAL"),
    **_each(88, 95, HEALTHCHECK_TC),
    # ICMP too-big generation
    96: Deviation("XDP_DROP", "DROP_TOO_BIG_NO_DF", NO_DF),
    97: Deviation("XDP_TX", "TX_ICMP_TOO_BIG", TOO_BIG_MTU, mtu=1460),
    98: Deviation("XDP_DROP", "DROP_TOO_BIG_NO_DF", NO_DF),
    99: Deviation("XDP_TX", "TX_ICMP_TOO_BIG", TOO_BIG_MTU, mtu=1452),
    **_each(100, 107, LPM_SRC),
    **_each(108, 141, TCP_SERVER_ID),
    **_each(142, 149, FLOW_MIGRATION),
    **_each(150, 154, STABLE_ROUTING),
    **_each(155, 161, INLINE_DECAP),
    # Katran's standalone XDP decap on the real, against our decap_xdp
    162: Exact("PASS_NOT_ENCAP"),
    163: Exact("PASS_NOT_ENCAP"),
    164: Deviation("XDP_PASS", "PASS_NOT_ENCAP", DECAP_FRAGMENT),
    165: Deviation("XDP_PASS", "PASS_NOT_ENCAP", DECAP_FRAGMENT),
    166: Exact("IPIP"),
    167: Exact("IPIP"),
    168: Exact("IPIP"),
    **_each(169, 174, Exact("PASS_NOT_ENCAP")),
    175: Deviation("XDP_PASS", "PASS_NOT_ENCAP", DECAP_FRAGMENT),
    176: Deviation("XDP_PASS", "PASS_NOT_ENCAP", DECAP_FRAGMENT),
    **_each(177, 180, Exact("GUE")),
    181: Exact("PASS_NOT_ENCAP"),
    182: Exact("PASS_NOT_ENCAP"),
    **_each(183, 188, Exact("GUE")),
    **_each(189, 193, TC_SRCMATCH),
}

# What the table adds up to; a change to CASES shows here too.
EXPECTED = {"byte_exact": 48, "verdict_and_real": 24, "deviations": 8, "not_applicable": 113}


def load_corpus() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    config = json.loads(corpus_file("config.json").read_text())
    cases = json.loads(corpus_file("fixtures.json").read_text())
    return config, cases


class KatranWorld:
    """Programs our balancer the way each Katran profile and build flavour expects."""

    def __init__(self, b: RunBalancer, config: dict[str, Any]) -> None:
        self.b = b
        self.config = config
        self.profile = ""
        self.gue = False
        self.keys: list[Vip] = []
        self.vip_reals: dict[Vip, set[str]] = {}
        b.settings(nexthop_mac=config["macs"]["router_default_mac"], src4=config["katran_src"]["v4"] + "/32",
                   src6=config["katran_src"]["v6"] + "/128", gue_port=KATRAN_GUE_PORT, mtu=1500)

    def use(self, profile: str, gue: bool) -> None:
        if (profile, gue) == (self.profile, self.gue):
            return
        for address, port, proto in self.keys:
            self.b.dp.del_vip(address, port, proto)
        self.keys.clear()
        self.vip_reals.clear()
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


def check_encap(out: bytes, frame: bytes, reals: set[str], gue: bool) -> str:
    """'' when our encapsulated output has Katran's structure and goes to one of `reals`, else what differs."""
    enc = decode_encap(out, KATRAN_GUE_PORT)
    if (enc.eth.dst, enc.eth.src) != ("00:00:de:ad:be:af", Ether(frame).dst):
        return f"MACs {enc.eth.dst}/{enc.eth.src}"
    if bool(enc.udp) != gue:
        return "outer protocol: GUE expected" if gue else "outer protocol: IPIP expected"
    if str(enc.outer.dst) not in reals:
        return f"outer destination {enc.outer.dst} is not a live real of the VIP ({sorted(reals)})"
    if enc.inner.raw != ip_packet_of(frame):
        return "inner packet differs from the input's IP packet"
    if enc.outer.version == 4 and not ipv4_header_ok(enc.outer.raw):
        return "outer IPv4 header checksum"
    if enc.outer.version == 6 and gue and not l4_checksum_ok_v6(enc.outer.raw):
        return "outer UDP checksum"
    return ""


def check_answer(out: bytes, expected: bytes) -> str:
    """'' when our ICMP answer to the client has Katran's addresses, MACs, type and code and valid
    checksums, else what differs."""
    got_eth, exp_eth = Ether(out), Ether(expected)
    got_ip, exp_ip = got_eth.payload, exp_eth.payload
    if (got_ip.src, got_ip.dst) != (exp_ip.src, exp_ip.dst) or got_eth.dst != exp_eth.dst:
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
    """The outer destination of an IPIP or GUE (port 9886) frame, None for anything else."""
    eth = Ether(frame)
    ip = eth.payload
    gue_port = struct.pack("!H", KATRAN_GUE_PORT)
    if isinstance(ip, IP) and (ip.proto in (4, 41) or (ip.proto == 17 and bytes(ip)[22:24] == gue_port)):
        return str(ip.dst)
    if isinstance(ip, IPv6) and (ip.nh in (4, 41) or (ip.nh == 17 and bytes(ip)[42:44] == gue_port)):
        return str(ip.dst)
    return None


def one_reason(before: dict[str, int], after: dict[str, int]) -> str:
    moved = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert len(moved) == 1 and sum(moved.values()) == 1, f"one reason per frame, got {moved}"
    return next(iter(moved))


@dataclass
class Tally:
    """The four counts, with what each compared case showed."""

    byte_exact: int = 0
    verdict_and_real: int = 0
    katrans_real: int = 0  # of verdict_and_real: the very real Katran chose
    deviations: int = 0
    not_applicable: int = 0


def test_case_table_covers_the_corpus_once() -> None:
    _, cases = load_corpus()
    assert sorted(CASES) == [c["id"] for c in cases], "one CASES row per corpus case, in file order"
    reasons = {r.name for r in _abi.Reason} | {r.name for r in _abi.DecapReason}
    for cid, row in CASES.items():
        if isinstance(row, Exact | Deviation):
            assert row.reason in reasons, f"#{cid}: {row.reason} is not a reason in balancer/_abi.py"
        if isinstance(row, SameReal) and row.same_as:
            earlier = CASES[row.same_as]
            assert row.same_as < cid and isinstance(earlier, SameReal) and earlier.vip == row.vip, cid
    kinds = Counter(type(row).__name__ for row in CASES.values())
    assert dict(kinds) == {"Exact": EXPECTED["byte_exact"], "SameReal": EXPECTED["verdict_and_real"],
                           "Deviation": EXPECTED["deviations"], "NotApplicable": EXPECTED["not_applicable"]}


def test_katran_fixtures(balancer_factory: BalancerFactory) -> None:
    config, cases = load_corpus()
    b = balancer_factory(world=False, ring_size=RING, max_vips=32, max_reals=64)
    world = KatranWorld(b, config)
    decap = Decap.load(str(DECAP_OBJ), gue_port=KATRAN_GUE_PORT)
    tally = Tally()
    missing_features: Counter[str] = Counter()
    our_real: dict[int, str] = {}
    failures: list[str] = []
    try:
        for case in cases:
            cid, row = case["id"], CASES[case["id"]]
            if isinstance(row, NotApplicable):
                tally.not_applicable += 1
                missing_features[row.feature] += 1
                continue
            frame = bytes.fromhex(case["input_hex"])
            expected = bytes.fromhex(case["expected_output_hex"] or "")
            if case["program"] == "balancer":
                world.use(case["config_profile"], "GUE_ENCAP" in case["required_defines"])
                before = b.dp.reasons()
                action, out = b.dp.run(frame)
                reason = one_reason(before, b.dp.reasons())
            else:  # Katran's real-server decap program
                assert case["program"] == "decap.bpf.c:xdpdecap", case["program"]
                dst = outer_dst_of_tunnel(frame)
                if dst is not None:
                    decap.add_local(dst)
                before = decap.reasons()
                action, out = decap.run_xdp(frame)
                reason = one_reason(before, decap.reasons())
            verdict = XDP_VERDICTS.get(action, str(action))
            katran = case["expected_action"]
            problem = ""
            if (verdict, reason) != _wanted(row, katran):
                problem = f"{verdict}/{reason}, the row wants {'/'.join(_wanted(row, katran))}"
            elif isinstance(row, Exact):
                problem = "" if out == expected else f"output differs: ours {out.hex()} Katran {expected.hex()}"
                tally.byte_exact += not problem
            elif isinstance(row, SameReal):
                problem = check_encap(out, frame, world.vip_reals[row.vip], world.gue)
                dst = outer_dst_of_tunnel(out) or ""
                our_real[cid] = dst
                if not problem and row.same_as and dst != our_real.get(row.same_as):
                    problem = f"real {dst}, but #{row.same_as} of the same flow went to {our_real.get(row.same_as)}"
                if not problem and not row.why and dst != outer_dst_of_tunnel(expected):
                    problem = f"real {dst}, Katran's {outer_dst_of_tunnel(expected)}"
                tally.verdict_and_real += not problem
                tally.katrans_real += not problem and dst == outer_dst_of_tunnel(expected)
            else:  # Deviation
                if (verdict, out) == (katran, expected):
                    problem = "we now answer exactly as Katran does: the Deviation row is stale"
                elif verdict == "XDP_TX":
                    problem = check_answer(out, expected)
                    mtu = struct.unpack("!I", out[14 + 44: 14 + 48])[0]
                    if not problem and mtu != row.mtu:
                        problem = f"Packet Too Big advertises MTU {mtu}, the row says {row.mtu}"
                tally.deviations += not problem
            if problem:
                failures.append(f"#{cid} {case['description'][:70]}: {problem}")
    finally:
        decap.close()
    counts = {"byte_exact": tally.byte_exact, "verdict_and_real": tally.verdict_and_real,
              "deviations": tally.deviations, "not_applicable": tally.not_applicable}
    print(f"\nKatran fixtures: {len(cases)} cases = {tally.byte_exact} byte-exact + {tally.verdict_and_real} "
          f"verdict-and-real ({tally.katrans_real} to the very real Katran chose) + {tally.deviations} "
          f"deliberate deviations + {tally.not_applicable} not applicable")
    for feature, n in missing_features.most_common():
        print(f"  {n:3d} not applicable: {feature}")
    for cid, row in CASES.items():
        if isinstance(row, Deviation):
            print(f"  deviation #{cid}: {row.verdict} {row.reason}: {row.why}")
    assert not failures, "\n".join(failures)
    assert counts == EXPECTED
    assert sum(counts.values()) == len(cases) == 193
    write_result("corpus", "test_katran_fixtures",
                 CorpusPayload(cases=len(cases), katrans_real=tally.katrans_real, **counts))


def _wanted(row: Expectation, katran: str) -> tuple[str, str]:
    """The (verdict, reason) a row wants from our program."""
    if isinstance(row, Exact):
        return katran, row.reason
    if isinstance(row, SameReal):
        return "XDP_TX", "TX_ENCAP"
    assert isinstance(row, Deviation)
    return row.verdict, row.reason
