"""test_two_arm.py: a balancer loaded two-arm (datapath.egress) sends what it encapsulates out of another interface.

Loaded with an egress (balancer/egress.py: its ifindex and MAC in .rodata, the ifindex in the devmap
lb_egress), every encapsulated frame is XDP_REDIRECTed, from the egress interface's MAC to the next
hop, still counted TX_ENCAP; the ICMP answers the LB makes itself (echo, too big) go back by XDP_TX,
to their sender; with the devmap empty (the interface gone) an encapsulated frame drops as
DROP_NO_EGRESS. The test run's redirect sends nothing (no live frames): what is checked is the verdict,
the reason and the frame (an ICMP error steered to its flow's real leaves by the egress too). The
egress is `lo` (ifindex 1, in every namespace); its MAC here is invented.
"""

from __future__ import annotations

import pytest
from scapy.layers.inet import ICMP, IP

from balancer.egress import Egress
from lab.bench.katran import program_insns

from . import packets as P
from .frames import decode_encap, ip_packet_of
from .rig import BalancerFactory, RunBalancer
from .test_program_size import KATRAN_IPIP_VERIFIED

EGRESS = Egress("lo", 1, "02:00:00:00:0e:91")


@pytest.fixture
def two_arm(balancer_factory: BalancerFactory) -> RunBalancer:
    """Name: two_arm. Scope: function. Depends: balancer_factory.

    The standard world on a balancer loaded with EGRESS as its egress interface::

        assert two_arm.run(P.tcp_to(P.VIP4)).verdict == "XDP_REDIRECT"
    """
    return balancer_factory(egress=EGRESS)


@pytest.mark.parametrize("case", P.ENCAPS, ids=P.ENCAP_IDS)
def test_encapsulated_frames_leave_by_the_egress(two_arm: RunBalancer, case: P.EncapCase) -> None:
    frame = P.tcp_to(case.vip, sport=41000, flags="S")
    out = two_arm.run(frame)
    assert (out.verdict, out.reason) == ("XDP_REDIRECT", "TX_ENCAP")
    enc = decode_encap(out.out, P.GUE_PORT)
    assert (enc.eth.dst, enc.eth.src) == (P.ROUTER_MAC, EGRESS.mac), "from the egress's MAC to the next hop"
    assert enc.inner.raw == ip_packet_of(frame)
    assert enc.outer.dst in case.reals


def test_a_vlan_tag_is_kept_on_the_egress(two_arm: RunBalancer) -> None:
    out = two_arm.run(P.VLAN_TCP4)
    assert (out.verdict, out.reason) == ("XDP_REDIRECT", "TX_ENCAP")
    assert out.out[6:12] == bytes.fromhex(EGRESS.mac.replace(":", ""))
    assert out.out[12:16] == bytes(P.VLAN_TCP4)[12:16], "the 802.1Q tag (TPID and TCI) as it came in"


def test_an_icmp_error_steered_to_its_real_leaves_by_the_egress(two_arm: RunBalancer) -> None:
    fwd = decode_encap(two_arm.run(P.tcp_to(P.VIP4, sport=41004, flags="S")).out, P.GUE_PORT)
    err = P.icmp_error_about(P.VIP4, P.CLIENT4, cport=41004)
    out = two_arm.run(err)
    assert (out.verdict, out.reason) == ("XDP_REDIRECT", "TX_ENCAP") and out.events.get("ICMP_STEERED") == 1
    enc = decode_encap(out.out, P.GUE_PORT)
    assert (enc.eth.src, enc.outer.dst) == (EGRESS.mac, fwd.outer.dst), "from the egress, to the flow's real"


def test_the_lbs_own_icmp_answers_go_back_to_their_sender(two_arm: RunBalancer) -> None:
    echo = two_arm.run(P.ICMP4_ECHO_TO_VIP)
    assert (echo.verdict, echo.reason) == ("XDP_TX", "TX_ICMP_ECHO")
    assert IP(echo.out[14:])[ICMP].type == 0
    assert echo.out[:6] == bytes.fromhex(P.CLIENT_MAC.replace(":", "")), "back to the frame's sender"
    too_big = two_arm.run(P.sized_tcp_to(P.VIP4, P.MTU, sport=41001))
    assert (too_big.verdict, too_big.reason) == ("XDP_TX", "TX_ICMP_TOO_BIG")
    assert too_big.out[:6] == bytes.fromhex(P.CLIENT_MAC.replace(":", ""))


def test_without_its_devmap_entry_a_frame_drops_with_its_reason(two_arm: RunBalancer) -> None:
    two_arm.dp.maps["lb_egress"].delete(b"\0" * 4)
    try:
        out = two_arm.run(P.tcp_to(P.VIP4, sport=41002, flags="S"))
        assert (out.verdict, out.reason) == ("XDP_DROP", "DROP_NO_EGRESS")
        assert two_arm.run(P.ICMP4_ECHO_TO_VIP).reason == "TX_ICMP_ECHO", "echo needs no egress"
    finally:
        two_arm.dp.maps["lb_egress"].update(b"\0" * 4, EGRESS.ifindex.to_bytes(4, "little"))


def test_one_arm_is_unchanged_and_its_program_no_larger(balancer_factory: BalancerFactory) -> None:
    one = balancer_factory()
    out = one.run(P.tcp_to(P.VIP4, sport=41003, flags="S"))
    assert (out.verdict, out.reason) == ("XDP_TX", "TX_ENCAP")
    assert out.out[6:12] == bytes.fromhex(P.LB_MAC.replace(":", "")), "one-arm: from the MAC the frame came to"
    two = balancer_factory(egress=EGRESS)
    sizes = {}
    for name, b in (("one-arm", one), ("two-arm", two)):
        sizes[name] = program_insns(b.dp.programs["balancer_xdp"])
    print(f"(xlated, verified) instructions: {sizes}")
    assert sizes["one-arm"][0] < sizes["two-arm"][0], "the verifier removed the two-arm code from one-arm"
    assert 0 < sizes["two-arm"][1] <= KATRAN_IPIP_VERIFIED
