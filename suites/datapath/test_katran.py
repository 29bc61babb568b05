"""test_katran.py: Katran's own datapath fixtures replayed against our balancer, decap and health-check programs.

The corpus (../shared/conformance/katran/, 193 cases) is replayed in file order on one balancer
instance programmed from config.json by katran_world.py (the one place that builds the corpus's
VIPs), decap cases against our decap_xdp and health-check cases against our hc_encap. What each case
proves is its row in katran_cases.py; the five counts (byte-exact transforms, verdict-exact, same
real, deliberate deviations, not applicable) are printed (`pytest suites/datapath -k katran -s`),
asserted, and written as the result `corpus.test_katran_fixtures.json`.

It runs twice: with the VIPs hashed as Katran does over Katran's own rings (what a node of a mixed
fleet runs, issue 31's `hash = "katran"`), where every same-real row but one asserts Katran's own real
and every encapsulation is Katran's byte for byte but for the outer fields whose rule is ours
(rule_fields), and in l4lab's own hash (the default), where our hash's choices are checked to be live
reals of the VIP and the flows to keep them. The result file is the first run's.
"""

from __future__ import annotations

import json
import struct
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from scapy.layers.inet import IP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from balancer import _abi, katran_hash
from balancer.datapath import Datapath, Decap, verify_abi
from balancer.health import hc_target_bytes
from balancer.libbpf import BpfObject, Program
from lab.checksum import inet_checksum
from reports.schema import CorpusPayload, write_result
from suites.corpus import corpus_file

from .frames import (
    decode_encap,
    icmp4_checksum_ok,
    ip_packet_of,
    ipv4_header_ok,
    l4_checksum_ok_v4,
    l4_checksum_ok_v6,
    pseudo6,
)
from .katran_cases import CASES, NOT_APPLICABLE_PROGRAMS, Deviation, Expectation, Match, NotApplicable, SameReal
from .katran_world import KATRAN_GUE_PORT, KATRAN_RING, Build, KatranWorld
from .rig import BALANCER_OBJ, DECAP_OBJ, OBJ_DIR, TC_VERDICTS, XDP_VERDICTS, BalancerFactory, RunBalancer

RING = 257  # l4lab's own hash: a small ring, each VIP's cycling over its live reals
# What the table adds up to; a change to CASES or to the programs shows here too.
EXPECTED = {"byte_exact": 22, "verdict_exact": 40, "same_real": 112, "deviations": 14, "not_applicable": 5}
# Of the same-real rows, how many assert Katran's own real, by the hash the VIPs are run in.
EXPECTED_KATRANS = {"katran": 111, "l4lab": 53}


def load_corpus() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    config = json.loads(corpus_file("config.json").read_text())
    cases = json.loads(corpus_file("fixtures.json").read_text())
    return config, cases


# ------------------------------------------------------------------------------------ the checks

ETH = 14


def outer_dst(frame: bytes) -> str | None:
    """The outer destination of an IPIP or GUE (port 9886) frame, None for anything else."""
    ip = Ether(frame).payload
    gue_port = struct.pack("!H", KATRAN_GUE_PORT)
    if isinstance(ip, IP) and (ip.proto in (4, 41) or (ip.proto == 17 and bytes(ip)[22:24] == gue_port)):
        return str(ip.dst)
    if isinstance(ip, IPv6) and (ip.nh in (4, 41) or (ip.nh == 17 and bytes(ip)[42:44] == gue_port)):
        return str(ip.dst)
    return None


def rule_fields(out: bytes, own_real: bool) -> list[tuple[int, int]]:
    """(offset, length) of the outer fields our rules compute otherwise than Katran (encap.h; Katran's
    pckt_encap.h and encap_helpers.h). None of Katran's comes from its flow hash, so hashing as Katran
    does makes none of ours equal; every other outer byte (TTL and hop limit 64, IPv4 ID 0, ToS and
    traffic class copied, lengths, protocols, the GUE source address) is Katran's to the byte:
    - IPv4 flags: we set DF (Katran 0), hence the header checksum too;
    - the IPIP outer source: ours the configured one; Katran's 172.16.0.0/16 or 100::/64 with bits of
      the client's address XORed with its source port (GUE's source is the configured one in both);
    - the IPv6 flow label: ours 20 bits of the flow hash (RFC 6438), Katran's 0;
    - the GUE source port: ours 49152 + 14 bits of the flow hash, Katran's the client's source port
      XORed with 16 bits of its address; hence the outer UDP checksum too;
    with `own_real` (our hash chose the real), the outer destination too."""
    v6 = out[12:14] == b"\x86\xdd"
    proto = out[ETH + (6 if v6 else 9)]
    if v6:
        fields, udp = [(ETH + 1, 3)] + ([(ETH + 8, 16)] if proto != 17 else []), ETH + 40
        fields += [(ETH + 24, 16)] if own_real else []
    else:
        fields, udp = [(ETH + 6, 2), (ETH + 10, 2)] + ([(ETH + 12, 4)] if proto != 17 else []), ETH + 20
        fields += [(ETH + 16, 4)] if own_real else []
    if proto == 17:
        fields += [(udp, 2), (udp + 6, 2)]
    return fields


def check_encap(out: bytes, katran: bytes, reals: set[str], own_real: bool, src: dict[str, str]) -> str:
    """'' when our encapsulation is Katran's byte for byte (the inner packet included) but for the fields
    our rules compute otherwise, and those hold what the rules say; else what differs. Where our hash
    chose a real of the other family than Katran's, its outer headers are not Katran's to compare: the
    inner packet is, and the outer headers must be valid."""
    dst = outer_dst(out)
    if own_real and (dst is None or dst not in reals):
        return f"outer destination {dst} is not a live real of the VIP ({sorted(reals)})"
    if own_real and out[12:14] != katran[12:14]:
        return check_outer(out, src) or ("" if decode_encap(out, KATRAN_GUE_PORT).inner.raw ==
                                         decode_encap(katran, KATRAN_GUE_PORT).inner.raw else "inner packet")
    if len(out) != len(katran):
        return f"{len(out)} bytes, Katran's {len(katran)}"
    ours = bytearray(katran)
    v6, mask = out[12:14] == b"\x86\xdd", rule_fields(out, own_real)
    if rule_fields(katran, own_real) != mask:
        return "outer protocol differs from Katran's"
    if v6 and (katran[ETH] & 0xF0, katran[ETH + 1] & 0xF0) != (out[ETH] & 0xF0, out[ETH + 1] & 0xF0):
        return "outer traffic class"
    for off, length in mask:
        ours[off: off + length] = out[off: off + length]
    if v6:  # the flow label's first nibble shares a byte with the traffic class
        ours[ETH + 1] = (katran[ETH + 1] & 0xF0) | (out[ETH + 1] & 0x0F)
    if bytes(ours) != out:
        at = next(i for i in range(len(out)) if ours[i] != out[i])
        return f"byte {at} differs: ours {out[at:at + 8].hex()}, Katran's {katran[at:at + 8].hex()}"
    return check_outer(out, src)


def check_outer(out: bytes, src: dict[str, str]) -> str:
    """'' when our outer headers hold what our rules say: the configured (fixed) source, valid checksums
    (the UDP one in both families), a GUE source port from the dynamic range."""
    v6 = out[12:14] == b"\x86\xdd"
    outer = Ether(out).payload
    if str(outer.src) != src["v6" if v6 else "v4"]:
        return f"outer source {outer.src}, our configured (fixed) source is {src['v6' if v6 else 'v4']}"
    raw = bytes(outer)
    if not v6 and not ipv4_header_ok(raw):
        return "outer IPv4 header checksum"
    if (raw[6] if v6 else raw[9]) == 17:
        if not (l4_checksum_ok_v6(raw) if v6 else l4_checksum_ok_v4(raw)):
            return f"outer UDP checksum (IPv{6 if v6 else 4})"
        if struct.unpack_from("!H", raw, 40 if v6 else 20)[0] < 0xC000:
            return "GUE source port outside 49152-65535"
    return ""


def check_answer(out: bytes, expected: bytes) -> str:
    """'' when our ICMP answer has Katran's addresses, MACs, type and code and valid checksums."""
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


def check_probe(out: bytes, katran: bytes, frame: bytes) -> str:
    """'' when our wrapped health-check probe goes to Katran's real in Katran's tunnel, the probe inside intact."""
    if outer_dst(out) != outer_dst(katran):
        return f"probe to {outer_dst(out)}, Katran's to {outer_dst(katran)}"
    ours, theirs = Ether(out).payload, Ether(katran).payload
    if (ours.version, getattr(ours, "proto", getattr(ours, "nh", None))) != \
            (theirs.version, getattr(theirs, "proto", getattr(theirs, "nh", None))):
        return "outer protocol"
    return "" if bytes(ours).endswith(ip_packet_of(frame)) else "the probe inside"


# ------------------------------------------------------------------------------------ the run


@dataclass
class Tally:
    """The five counts, with how many same-real cases went to Katran's very real."""

    byte_exact: int = 0
    verdict_exact: int = 0
    same_real: int = 0
    deviations: int = 0
    not_applicable: int = 0
    katrans_real: int = 0
    asserted_katran: int = 0  # of same_real: rows that assert Katran's own real (not our hash's chance)
    by_hash: int = 0  # of those: rows whose real Katran's hash and ring decide (run in Katran's hash)
    not_asserted: dict[int, str] = field(default_factory=dict)  # in Katran's hash: case -> why not Katran's
    failures: list[str] = field(default_factory=list)
    missing: Counter[str] = field(default_factory=Counter)

    def counts(self) -> dict[str, int]:
        return {"byte_exact": self.byte_exact, "verdict_exact": self.verdict_exact, "same_real": self.same_real,
                "deviations": self.deviations, "not_applicable": self.not_applicable}


@dataclass
class Programs:
    """Our three programs under the corpus, and what they did to one case."""

    world: KatranWorld
    decap: Decap
    hc: Program
    hc_obj: BpfObject

    def run(self, case: dict[str, Any], frame: bytes) -> tuple[str, bytes, str]:
        """(verdict, output, reason counted; '' for the health-check program, which counts none)."""
        prog = case["program"]
        if prog == "balancer":
            self.world.use(case["config_profile"], Build.of(case["required_defines"]))
            dp = self.world.b.dp
            before = dp.reasons()
            action, out = dp.run(frame)
            return XDP_VERDICTS.get(action, str(action)), out, one_reason(before, dp.reasons())
        if prog.startswith("healthchecking"):
            res = self.hc.test_run(frame, ctx=bytes(8) + int(case["ctx"]["skb_mark"]).to_bytes(4, "little"))
            return TC_VERDICTS.get(res.retval, str(res.retval)), res.data, ""
        assert prog == "decap.bpf.c:xdpdecap", prog
        dst = outer_dst(frame)
        if dst is not None:
            self.decap.add_local(dst)
        before = self.decap.reasons()
        action, out = self.decap.run_xdp(frame)
        return XDP_VERDICTS.get(action, str(action)), out, one_reason(before, self.decap.reasons())


def one_reason(before: dict[str, int], after: dict[str, int]) -> str:
    moved = {k: after[k] - before[k] for k in after if after[k] != before[k]}
    assert len(moved) == 1 and sum(moved.values()) == 1, f"one reason per frame, got {moved}"
    return next(iter(moved))


@pytest.fixture(params=["katran", "l4lab"], ids=["katran-hash", "l4lab-hash"])
def programs(request: pytest.FixtureRequest, balancer_factory: BalancerFactory) -> Iterator[Programs]:
    """Name: programs. Scope: function. Depends: root, build/bpf/{balancer,decap,healthcheck}.o, the corpus.

    The balancer programmed by KatranWorld, its VIPs hashed as Katran does over Katran's rings (param
    "katran") or in l4lab's own hash (param "l4lab"), our decap, and hc_encap with Katran's three marks:
        verdict, out, reason = programs.run(case, frame)
    """
    config, _ = load_corpus()
    with ExitStack() as stack:
        if request.param == "katran":
            # Katran's ring size and MAX_VIPS (its hash's seeds). Loaded here, not taken from the pool,
            # whose reset of a program writes its 10^6 ring slots one syscall at a time.
            dp = Datapath.load(str(BALANCER_OBJ), max_vips=32, max_reals=64, ring_size=KATRAN_RING,
                               lru_size=1024, fallback_size=1024, katran_max_vips=katran_hash.DEFAULT_MAX_VIPS)
            stack.callback(dp.close)
            b = RunBalancer(dp)
        else:
            b = balancer_factory(world=False, ring_size=RING, max_vips=32, max_reals=64)
        world = KatranWorld(b, config, katran_hash=request.param == "katran")
        decap = Decap.load(str(DECAP_OBJ), gue_port=KATRAN_GUE_PORT)
        stack.callback(decap.close)
        hc_path = Path(OBJ_DIR) / "healthcheck.o"
        verify_abi(str(hc_path))
        hc_obj = BpfObject(str(hc_path))
        stack.callback(hc_obj.close)
        hc_obj.load()
        yield Programs(world, decap, hc_obj.program("hc_encap"), hc_obj)


def _set_hc_encap(p: Programs, config: dict[str, Any], gue: bool) -> None:
    """Katran's three health-check marks, to their reals in the case's encapsulation."""
    marks = p.hc_obj.map("lb_hc_reals")
    for mark, addr in config["healthcheck"]["marks"].items():
        marks.update(int(mark).to_bytes(4, "little"), hc_target_bytes(addr, "gue1" if gue else "ipip", KATRAN_GUE_PORT))


def judge(row: Expectation, case: dict[str, Any], frame: bytes, p: Programs, t: Tally,
          our_real: dict[int, str]) -> str:
    """Runs one case and counts it; returns '' or what went wrong."""
    katran, expected = case["expected_action"], bytes.fromhex(case["expected_output_hex"] or "")
    if case["program"].startswith("healthchecking"):
        _set_hc_encap(p, p.world.config, "GUE_ENCAP" in case["required_defines"])
    verdict, out, reason = p.run(case, frame)
    if isinstance(row, Match):
        if (verdict, reason) != (katran, row.reason):
            return f"{verdict}/{reason}, the row wants {katran}/{row.reason}"
        if expected != frame and verdict != "XDP_DROP":
            if out != expected:
                return f"output differs: ours {out.hex()} Katran {expected.hex()}"
            t.byte_exact += 1
            return ""
        if out != frame:
            return "a passed or dropped frame was changed"
        t.verdict_exact += 1
        return ""
    if isinstance(row, SameReal):
        return _judge_same_real(row, case, frame, verdict, reason, out, expected, p, t, our_real)
    assert isinstance(row, Deviation)
    if (verdict, reason) != (row.verdict, row.reason):
        return f"{verdict}/{reason}, the row wants {row.verdict}/{row.reason}"
    if (verdict, out) == (katran, expected):
        return "we now answer exactly as Katran does: the Deviation row is stale"
    problem = ""
    if row.real:
        problem = check_probe(out, expected, frame)
    elif verdict == "XDP_TX":
        problem = check_answer(out, expected)
        mtu = struct.unpack("!I", out[ETH + 44: ETH + 48])[0]
        if not problem and mtu != row.mtu:
            problem = f"Packet Too Big advertises MTU {mtu}, the row says {row.mtu}"
    t.deviations += not problem
    return problem


def _judge_same_real(row: SameReal, case: dict[str, Any], frame: bytes, verdict: str, reason: str, out: bytes,
                     expected: bytes, p: Programs, t: Tally, our_real: dict[int, str]) -> str:
    if (verdict, reason) != ("XDP_TX", "TX_ENCAP"):
        return f"{verdict}/{reason}, the row wants XDP_TX/TX_ENCAP"
    dst = outer_dst(out) or ""
    our_real[case["id"]] = dst
    katrans = outer_dst(expected)
    asserts_katrans = not row.why or (p.world.katran_hash and not row.not_katrans)
    problem = f"real {dst}, Katran's {katrans}" if asserts_katrans and dst != katrans else \
        check_encap(out, expected, p.world.vip_reals[row.vip] | p.world.down.get(row.vip, set()),
                    own_real=not asserts_katrans, src=p.world.config["katran_src"])
    if not problem and row.same_as:
        earlier = our_real.get(row.same_as)
        if earlier in p.world.down.get(row.vip, set()):
            problem = f"real {dst} is the one #{row.same_as} had, now down" if dst == earlier else ""
        elif dst != earlier:
            problem = f"real {dst}, but #{row.same_as} of the same flow went to {earlier}"
    t.same_real += not problem
    t.katrans_real += not problem and dst == katrans
    t.asserted_katran += not problem and asserts_katrans
    t.by_hash += not problem and asserts_katrans and bool(row.why)
    if p.world.katran_hash and row.not_katrans:
        t.not_asserted[case["id"]] = row.not_katrans
    return problem


def test_case_table_covers_the_corpus_once() -> None:
    _, cases = load_corpus()
    assert sorted(CASES) == [c["id"] for c in cases], "one row per corpus case, in file order"
    reasons = {r.name for r in _abi.Reason} | {r.name for r in _abi.DecapReason} | {""}
    for cid, row in CASES.items():
        if isinstance(row, Match | Deviation):
            assert row.reason in reasons, f"#{cid}: {row.reason} is not a reason in balancer/_abi.py"
        if isinstance(row, SameReal) and row.same_as:
            earlier = CASES[row.same_as]
            assert row.same_as < cid and isinstance(earlier, SameReal) and earlier.vip == row.vip, cid
    not_applicable = [cid for cid, row in CASES.items() if isinstance(row, NotApplicable)]
    assert len(not_applicable) <= 8, not_applicable
    by_id = {c["id"]: c for c in cases}
    for cid in not_applicable:  # n/a because of what the case needs, not where it sits in the file
        assert by_id[cid]["program"] == NOT_APPLICABLE_PROGRAMS[CASES[cid]], (cid, by_id[cid]["program"])
    assert all(c["program"] != p for c in cases if not isinstance(CASES[c["id"]], NotApplicable)
               for p in NOT_APPLICABLE_PROGRAMS.values()), "every case of a program we lack is n/a"


# Outer bytes where our rules are Katran's (rule_fields), by family: ToS / traffic class, IPv4 ID, TTL
# and hop limit, protocol, the outer destination; for GUE the outer source and the UDP destination port.
SAME_RULE_BYTES = {4: [ETH + 1, ETH + 4, ETH + 5, ETH + 8, ETH + 9, ETH + 16],
                   6: [ETH, ETH + 6, ETH + 7, ETH + 24, ETH + 39]}
SAME_RULE_GUE = {4: [ETH + 12, ETH + 22], 6: [ETH + 8, ETH + 23, ETH + 42]}


@pytest.mark.parametrize("programs", ["katran"], indirect=True)
def test_the_encap_check_catches_wrong_outputs(programs: Programs) -> None:
    """check_encap passes our output for Katran's real (IPIP 4in4, 4in6, 6in6; GUE over IPv4 and IPv6)
    and fails it when one bit of a byte where our rule is Katran's, or of the inner packet, is wrong."""
    _, cases = load_corpus()
    by_id = {c["id"]: c for c in cases}
    src = programs.world.config["katran_src"]
    for cid in (2, 5, 6, 53, 55, 56):
        case = by_id[cid]
        verdict, out, _ = programs.run(case, bytes.fromhex(case["input_hex"]))
        katran = bytes.fromhex(case["expected_output_hex"])
        assert verdict == "XDP_TX" and check_encap(out, katran, set(), own_real=False, src=src) == "", cid
        family = 6 if out[12:14] == b"\x86\xdd" else 4
        gue = out[ETH + (6 if family == 6 else 9)] == 17
        for at in SAME_RULE_BYTES[family] + (SAME_RULE_GUE[family] if gue else []) + [len(out) - 1]:
            wrong = bytearray(out)
            wrong[at] ^= 0x01
            assert check_encap(with_valid_checksums(bytes(wrong)), katran, set(), own_real=False, src=src), (cid, at)


def with_valid_checksums(frame: bytes) -> bytes:
    """The frame with its outer IPv4 header checksum and outer UDP checksum made valid again, so that only
    the comparison with Katran's bytes can see a changed byte."""
    out = bytearray(frame)
    v6 = out[12:14] == b"\x86\xdd"
    udp = ETH + (40 if v6 else 20)
    if not v6:
        out[ETH + 10: ETH + 12] = bytes(2)
        out[ETH + 10: ETH + 12] = struct.pack("!H", inet_checksum(bytes(out[ETH: ETH + 20])))
    if out[ETH + (6 if v6 else 9)] == 17:
        out[udp + 6: udp + 8] = bytes(2)
        segment = bytes(out[udp:])
        pseudo = (pseudo6(bytes(out[ETH:]), 17, len(segment)) if v6 else
                  bytes(out[ETH + 12: ETH + 20]) + struct.pack("!BBH", 0, 17, len(segment)))
        out[udp + 6: udp + 8] = struct.pack("!H", inet_checksum(pseudo + segment) or 0xFFFF)
    return bytes(out)


def test_katran_fixtures(programs: Programs) -> None:
    _, cases = load_corpus()
    t = Tally()
    our_real: dict[int, str] = {}
    for case in cases:
        row = CASES[case["id"]]
        if isinstance(row, NotApplicable):
            t.not_applicable += 1
            t.missing[row.feature] += 1
            continue
        problem = judge(row, case, bytes.fromhex(case["input_hex"]), programs, t, our_real)
        if problem:
            t.failures.append(f"#{case['id']} {case['description'][:70]}: {problem}")
    counts = t.counts()
    print(f"\nKatran fixtures: {len(cases)} cases = {t.byte_exact} byte-exact transforms + {t.verdict_exact} "
          f"verdict-exact + {t.same_real} same real + {t.deviations} deliberate deviations + {t.not_applicable} "
          "not applicable")
    print_same_real(t, programs.world.katran_hash)
    for feature, n in t.missing.most_common():
        print(f"  {n:3d} not applicable: {feature}")
    for cid, row in CASES.items():
        if isinstance(row, Deviation):
            print(f"  deviation #{cid}: {row.verdict} {row.reason}: {row.why}")
    assert not t.failures, "\n".join(t.failures)
    assert counts == EXPECTED
    assert sum(counts.values()) == len(cases) == 193
    assert t.asserted_katran == EXPECTED_KATRANS["katran" if programs.world.katran_hash else "l4lab"]
    if programs.world.katran_hash:  # the result the reports show: the corpus run as a mixed fleet's node
        assert t.katrans_real == t.asserted_katran == t.same_real - len(t.not_asserted)
        write_result("corpus", "test_katran_fixtures",
                     CorpusPayload(cases=len(cases), katrans_real=t.katrans_real, **counts))


def print_same_real(t: Tally, katran: bool) -> None:
    """The line under the summary: how many same-real rows assert Katran's own real, and what decides the rest."""
    sid = t.asserted_katran - t.by_hash
    if katran:
        print(f"  same real (VIPs in Katran's hash and ring): {t.asserted_katran} of {t.same_real} assert Katran's own "
              f"real, {sid} decided by a server id, a pinned prefix or a session one of them wrote, {t.by_hash} by "
              "Katran's hash and ring or a session they wrote")
        for cid, why in t.not_asserted.items():
            print(f"  same real #{cid}, not Katran's: {why}")
        return
    print(f"  same real (VIPs in l4lab's own hash): {t.asserted_katran} of {t.same_real} assert Katran's own real (a "
          f"server id, a pinned prefix or a session one of them wrote); of the {t.same_real - t.asserted_katran} our "
          f"hash decides, {t.katrans_real - t.asserted_katran} happen to be Katran's too")
