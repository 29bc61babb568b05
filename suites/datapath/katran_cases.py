"""katran_cases.py: what each of Katran's 193 fixture cases proves about our programs, one row each.

Four kinds of row (test_katran.py runs them):

- Match: Katran's verdict, and our reason counter named in the row. Where Katran's program changed the
  frame and sent it on (an echo reply, a decapsulation), our output must be Katran's byte for byte: a
  byte-exact transform. Where it passed or dropped the frame, ours must be left untouched (a dropped
  frame's bytes go nowhere, so one Katran altered before dropping it is not compared): verdict-exact.
- SameReal: Katran's XDP_TX of an encapsulation, compared byte for byte with Katran's output except the
  fields our outer-header rules compute otherwise (test_katran.rule_fields: outer IPv4 DF and header
  checksum, the IPIP outer source, the IPv6 flow label, the GUE source port and the outer UDP checksum,
  which must verify in both families). With `why` empty, the real is Katran's own, asserted (a server
  id, a pinned prefix, or a session that one of those wrote). Otherwise `why` says what decides it in
  l4lab's own hash (DESIGN 4): the real must be a live real of the VIP, and with `same_as` the one we
  chose for that earlier case of the same flow. Run in Katran's hash (the VIPs hashed as issue 31's
  `hash = "katran"`, Katran's ring), those rows assert Katran's own real too, but for a row whose
  `not_katrans` says why Katran's fixture cannot be reproduced in the corpus's replay.
- Deviation: we deliberately answer otherwise (the corpus README); the row pins our verdict and reason.
- NotApplicable: the case exercises something l4lab does not do, and the row says why a user would not
  want it here; it is not run. Decided per case by what it needs.
"""

from __future__ import annotations

from dataclasses import dataclass

Vip = tuple[str, int, str]


@dataclass(frozen=True)
class Match:
    """Katran's verdict; our output is Katran's where Katran transformed the frame, else untouched."""

    reason: str


@dataclass(frozen=True)
class SameReal:
    """Katran's encapsulation to `vip`'s real (Katran's own unless `why` says our hash chose); `same_as`:
    an earlier case of the same flow whose real we must choose again, unless that real is down now;
    `not_katrans`: why even Katran's hash does not give Katran's real here."""

    vip: Vip
    why: str = ""
    same_as: int = 0
    not_katrans: str = ""


@dataclass(frozen=True)
class Deviation:
    """We deliberately answer otherwise: our verdict, our reason, and why; `mtu`: the MTU our ICMPv6
    Packet Too Big advertises; `real`: our output still goes to Katran's real (health-check probes)."""

    verdict: str
    reason: str
    why: str
    mtu: int = 0
    real: bool = False


@dataclass(frozen=True)
class NotApplicable:
    """The case needs something l4lab does not do, and why a user would not want it here."""

    feature: str


Expectation = Match | SameReal | Deviation | NotApplicable

OWN_HASH = ("l4lab's flow hash and ring are its own (DESIGN 4; here a cyclic 257-slot test ring), so any "
            "live real of the VIP is as right as the one Katran's hash picks")
SAME_FLOW = "the flow of the earlier case (other ToS/traffic class): the real we chose for it"
LRU_HIT = "Katran's LRU hit on the earlier case's flow: the real we chose for it (our session table)"
ICMP_ABOUT_FLOW = "an ICMP error quoting the earlier case's flow is steered to that flow's real"
DPORT_ONLY = "dst-port-only hashing (F_HASH_DPORT_ONLY): another source, the earlier case's real"
MIGRATED = ("the flow's session: its real unless health checks took that real down for this VIP with UDP "
            "flow migration on, then another live real")
SESSION_FIRST = ("the flow has a session from the earlier case (replayed in file order): we follow it where "
                 "Katran's fixture shows its hash's choice for a fresh flow")
KATRAN_FRESH = ("Katran's program reproduces this fixture only on a fresh session table (config.json notes): "
                "replayed in file order, its own session from the earlier case sends the flow where ours does")
NO_DF = ("IPv4 over the egress MTU without DF: Katran answers frag-needed, which a sender without DF "
         "ignores; we do not fragment either, so we drop it and count it")
TOO_BIG_MTU = ("we answer Packet Too Big as Katran does but advertise the MTU left after the encapsulation "
               "overhead (1460 for IPv6 in IPv6, 1452 for GUE over IPv6); Katran advertises 1500 (0 in its "
               "Meta-internal origin-GUE variant), which lets the next full-size packet black-hole")
DECAP_FRAGMENT = ("a fragment reaching the real server: Katran's decap drops it; ours passes it to the "
                  "kernel, which reassembles it (as the kernel's own tunnels do)")
HC_PROBE = ("healthcheck.bpf.c wraps the marked probe for the same real as Katran's healthchecking.bpf.c "
            "(asserted), but leaves it on the interface the kernel routed it to (TC_ACT_OK) with the probe's "
            "own source address and MACs, so the real's DSR answer reaches the probing socket; Katran "
            "redirects it to a configured interface with a configured source and MACs (TC_ACT_REDIRECT)")
TC_SRCMATCH = NotApplicable(
    "Katran's tc_srcmatch rewrites the inner source of GUE on port 9887 to the outer source, for clients that "
    "encapsulate to the reals themselves from behind SNAT; l4lab's outer source is always the LB's own, so the "
    "rewrite would address every real's DSR reply to the LB instead of the client")

V4_UDP80: Vip = ("10.200.1.1", 80, "udp")
V4_TCP80: Vip = ("10.200.1.1", 80, "tcp")
V4_ANYPORT: Vip = ("10.200.1.2", 0, "tcp")
V4_V6REALS: Vip = ("10.200.1.3", 80, "tcp")
V4_DPORT_ONLY: Vip = ("10.200.1.4", 0, "tcp")
V6_TCP80: Vip = ("fc00:1::1", 80, "tcp")
V4_QUIC: Vip = ("10.200.1.5", 443, "udp")
V6_QUIC: Vip = ("fc00:1::2", 443, "udp")
V4_MIGRATE: Vip = ("10.200.1.6", 80, "udp")
V4_UDP80_6REALS: Vip = ("10.200.1.2", 80, "udp")
V4_UDP80_MIXED: Vip = ("10.200.1.3", 80, "udp")
V4_TCP80_MIXED: Vip = ("10.200.1.4", 80, "tcp")
V6_STABLE: Vip = ("fc00:1::9", 80, "udp")
CIDR_TCP: Vip = ("fc00:1::/96", 0, "tcp")
CIDR_TCP443: Vip = ("fc00:2::/96", 443, "tcp")
CIDR_UDP: Vip = ("fc00:3::/96", 0, "udp")
CIDR_UDP443: Vip = ("fc00:4::/96", 443, "udp")


def _each(first: int, last: int, expectation: Expectation) -> dict[int, Expectation]:
    return dict.fromkeys(range(first, last + 1), expectation)


def _quic(base: int) -> dict[int, Expectation]:
    """The QUIC block (#24.., #73..): initial packets hash, server ids route, sessions follow them."""
    k = SameReal(V4_QUIC)  # Katran's real: the server id, or the session a server id wrote
    return {base: SameReal(V4_QUIC, OWN_HASH), base + 1: SameReal(V4_QUIC, LRU_HIT, same_as=base),
            base + 2: k, base + 3: k, base + 4: SameReal(V6_QUIC, OWN_HASH), base + 5: k, base + 6: k,
            base + 7: k, base + 8: k}


def _tpr(base: int) -> dict[int, Expectation]:
    """The TCP server-id block (#108.., #125..), same rows for IPIP and GUE."""
    return {
        base: SameReal(V4_TCP80, OWN_HASH),  # a SYN: its option is never read
        base + 1: SameReal(V4_TCP80), base + 2: SameReal(V4_ANYPORT), base + 3: SameReal(V4_V6REALS),
        base + 4: SameReal(V6_TCP80), base + 5: SameReal(V4_TCP80), base + 6: SameReal(V4_TCP80),
        base + 7: SameReal(V6_TCP80), base + 8: SameReal(V6_TCP80), base + 9: SameReal(V6_TCP80),
        base + 10: SameReal(V6_TCP80), base + 11: SameReal(V6_TCP80, OWN_HASH),  # an unknown id, a new flow
        base + 12: SameReal(V6_TCP80), base + 13: SameReal(V4_DPORT_ONLY, DPORT_ONLY, same_as=19),
        base + 14: SameReal(V4_DPORT_ONLY), base + 15: SameReal(V6_TCP80), base + 16: SameReal(V4_V6REALS),
    }


CASES: dict[int, Expectation] = {
    # IPIP encap (default build)
    1: SameReal(V4_UDP80, OWN_HASH),
    2: SameReal(V4_TCP80, OWN_HASH),
    3: SameReal(V4_TCP80, SAME_FLOW, same_as=2),
    4: SameReal(V4_ANYPORT, OWN_HASH),
    5: SameReal(V4_V6REALS, OWN_HASH),
    6: SameReal(V6_TCP80, OWN_HASH),
    7: SameReal(V6_TCP80, SAME_FLOW, same_as=6),
    8: Match("TX_ICMP_ECHO"),
    9: Match("TX_ICMP_ECHO"),
    10: SameReal(V4_TCP80, ICMP_ABOUT_FLOW, same_as=2),
    11: SameReal(V6_TCP80, ICMP_ABOUT_FLOW, same_as=6),
    12: Match("DROP_IP_OPTIONS"),
    13: Match("DROP_FRAGMENT"),
    14: Match("DROP_FRAGMENT"),
    15: Match("PASS_NOT_VIP"),
    16: Match("PASS_NOT_VIP"),
    17: Match("PASS_NOT_IP"),
    18: SameReal(V4_TCP80, LRU_HIT, same_as=2),
    19: SameReal(V4_DPORT_ONLY, OWN_HASH),
    20: SameReal(V4_DPORT_ONLY, DPORT_ONLY, same_as=19),
    **_each(21, 23, Match("PASS_NOT_VIP")),  # tunnels to addresses that are no decap address of ours
    **_quic(24),
    33: Match("DROP_TOO_BIG_NO_DF"),
    34: SameReal(V4_QUIC),
    35: SameReal(V4_QUIC),
    36: SameReal(V4_MIGRATE, OWN_HASH),
    # CIDR VIPs
    37: SameReal(CIDR_TCP, OWN_HASH),
    38: SameReal(CIDR_TCP, OWN_HASH),
    39: SameReal(CIDR_TCP, OWN_HASH),
    40: SameReal(CIDR_TCP443, OWN_HASH),
    41: Match("PASS_NOT_VIP"),
    42: SameReal(CIDR_UDP, OWN_HASH),
    43: SameReal(CIDR_UDP443, OWN_HASH),
    44: Match("PASS_NOT_VIP"),
    45: Match("PASS_NOT_VIP"),
    # inline decap: to the LB's host, then egress decap
    46: Match("PASS_DECAP_LOCAL"),
    47: Match("PASS_DECAP_LOCAL"),
    48: SameReal(V6_TCP80, OWN_HASH),
    49: Match("TX_DECAP_EGRESS"),
    50: Match("TX_DECAP_EGRESS"),
    51: Match("DROP_TTL_EXPIRED"),
    # GUE encap
    52: SameReal(V4_UDP80, OWN_HASH),
    53: SameReal(V4_TCP80, OWN_HASH),
    54: SameReal(V4_ANYPORT, OWN_HASH),
    55: SameReal(V4_V6REALS, OWN_HASH),
    56: SameReal(V6_TCP80, OWN_HASH),
    57: Match("TX_ICMP_ECHO"),
    58: Match("TX_ICMP_ECHO"),
    59: SameReal(V4_TCP80, ICMP_ABOUT_FLOW, same_as=53),
    60: SameReal(V6_TCP80, ICMP_ABOUT_FLOW, same_as=56),
    61: Match("DROP_IP_OPTIONS"),
    62: Match("DROP_FRAGMENT"),
    63: Match("DROP_FRAGMENT"),
    64: Match("PASS_NOT_VIP"),
    65: Match("PASS_NOT_VIP"),
    66: Match("PASS_NOT_IP"),
    67: SameReal(V4_TCP80, LRU_HIT, same_as=53),
    68: SameReal(V4_DPORT_ONLY, OWN_HASH),
    69: SameReal(V4_DPORT_ONLY, DPORT_ONLY, same_as=68),
    **_each(70, 72, Match("PASS_NOT_VIP")),
    **_quic(73),
    82: SameReal(V4_TCP80, SAME_FLOW, same_as=53),
    83: SameReal(V6_TCP80, SAME_FLOW, same_as=56),
    84: SameReal(V4_QUIC),
    85: SameReal(V4_QUIC),
    86: Match("DROP_NO_REAL"),
    87: Match("DROP_NO_REAL"),
    # Katran's tc health-check program, against our healthcheck.bpf.c
    88: Match(""),  # our health-check program counts no reasons
    **_each(89, 91, Deviation("TC_ACT_OK", "", HC_PROBE, real=True)),
    92: Match(""),
    **_each(93, 95, Deviation("TC_ACT_OK", "", HC_PROBE, real=True)),
    # ICMP too-big generation
    96: Deviation("XDP_DROP", "DROP_TOO_BIG_NO_DF", NO_DF),
    97: Deviation("XDP_TX", "TX_ICMP_TOO_BIG", TOO_BIG_MTU, mtu=1460),
    98: Deviation("XDP_DROP", "DROP_TOO_BIG_NO_DF", NO_DF),
    99: Deviation("XDP_TX", "TX_ICMP_TOO_BIG", TOO_BIG_MTU, mtu=1452),
    # source prefixes pinned to reals
    100: SameReal(V4_UDP80),
    101: SameReal(V4_UDP80),
    102: SameReal(V4_UDP80),
    103: SameReal(V4_UDP80, OWN_HASH),
    104: SameReal(V6_TCP80),
    105: SameReal(V6_TCP80),
    106: SameReal(V6_TCP80, OWN_HASH),
    107: SameReal(V6_TCP80, SESSION_FIRST, same_as=6, not_katrans=KATRAN_FRESH),
    **_tpr(108),
    **_tpr(125),
    # UDP flow migration, before and after a real goes down
    142: SameReal(V4_UDP80, OWN_HASH),
    143: SameReal(V4_UDP80_6REALS, OWN_HASH),
    144: SameReal(V4_UDP80_MIXED, OWN_HASH),
    145: SameReal(V4_TCP80_MIXED, OWN_HASH),
    146: SameReal(V4_UDP80, MIGRATED, same_as=142),
    147: SameReal(V4_UDP80_6REALS, MIGRATED, same_as=143),
    148: SameReal(V4_UDP80_MIXED, MIGRATED, same_as=144),
    149: SameReal(V4_TCP80_MIXED, MIGRATED, same_as=145),
    # UDP stable routing
    150: SameReal(V6_STABLE, OWN_HASH),
    **_each(151, 154, SameReal(V6_STABLE)),
    # inline decap that balances the inner packet (cross-PoP)
    155: SameReal(V4_UDP80, OWN_HASH),
    156: SameReal(V4_UDP80_6REALS, OWN_HASH),
    157: SameReal(V6_TCP80, OWN_HASH),
    158: Match("DROP_TTL_EXPIRED"),
    159: Match("DROP_TTL_EXPIRED"),
    160: Match("PASS_DECAP_LOCAL"),
    161: Match("PASS_NOT_VIP"),
    # Katran's standalone XDP decap on the real, against our decap_xdp
    162: Match("PASS_NOT_ENCAP"),
    163: Match("PASS_NOT_ENCAP"),
    164: Deviation("XDP_PASS", "PASS_NOT_ENCAP", DECAP_FRAGMENT),
    165: Deviation("XDP_PASS", "PASS_NOT_ENCAP", DECAP_FRAGMENT),
    166: Match("IPIP"),
    167: Match("IPIP"),
    168: Match("IPIP"),
    **_each(169, 174, Match("PASS_NOT_ENCAP")),
    175: Deviation("XDP_PASS", "PASS_NOT_ENCAP", DECAP_FRAGMENT),
    176: Deviation("XDP_PASS", "PASS_NOT_ENCAP", DECAP_FRAGMENT),
    **_each(177, 180, Match("GUE")),
    181: Match("PASS_NOT_ENCAP"),
    182: Match("PASS_NOT_ENCAP"),
    **_each(183, 188, Match("GUE")),
    # Katran's tc source-match program (case["program"] == "tc_srcmatch.bpf.c:tc_srcmatch")
    189: TC_SRCMATCH,
    190: TC_SRCMATCH,
    191: TC_SRCMATCH,
    192: TC_SRCMATCH,
    193: TC_SRCMATCH,
}
# What a not-applicable row needs, by the case's program: the test holds every such row to it.
NOT_APPLICABLE_PROGRAMS = {TC_SRCMATCH: "tc_srcmatch.bpf.c:tc_srcmatch"}
