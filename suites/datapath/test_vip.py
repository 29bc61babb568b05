"""test_vip.py: VIP matching (exact, port-0 wildcard, protocol, the VIP address filter) and the per-VIP
hashing and LRU flags."""

from __future__ import annotations

from collections.abc import Sequence

from scapy.packet import Packet

from balancer import _abi
from balancer.datapath import vip_filter_bit, vip_key

from . import packets as P
from .frames import decode_encap
from .rig import BalancerFactory, RunBalancer

VIP = "203.0.113.50"


def real_of(out: bytes) -> str:
    return str(decode_encap(out, P.GUE_PORT).outer.dst)


def test_exact_port_wins_over_the_wildcard(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    b.vip(VIP, 0, "tcp", 1, [P.REALS4[1]])
    table = [  # (description, frame, expected real)
        ("port 80 has its own VIP", P.tcp_to(VIP, dport=80, flags="S"), P.REALS4[0]),
        ("any other port falls to the wildcard", P.tcp_to(VIP, dport=8443, flags="S"), P.REALS4[1]),
        ("port 0 itself is the wildcard", P.tcp_to(VIP, dport=0, flags="S"), P.REALS4[1]),
    ]
    for description, frame, real in table:
        out = b.run(frame)
        assert out.reason == "TX_ENCAP" and real_of(out.out) == real, description
    assert b.dp.vip_stats(0)[0] == 1 and b.dp.vip_stats(1)[0] == 2


def test_the_address_filter_gates_the_wildcard_and_follows_the_vips(balancer_factory: BalancerFactory) -> None:
    """lb_vip_filter has exactly the bits of the VIP addresses (computed alike in C and Python); the
    datapath looks for a wildcard VIP only where the address's bit is set."""
    b = balancer_factory(world=False)
    b.vip(VIP, 0, "tcp", 0, [P.REALS4[0]])
    b.vip("2001:db8:f::50", 443, "tcp", 1, [P.REALS6[0]])
    flt = b.dp.maps["lb_vip_filter"]

    def bits() -> set[int]:
        words = flt.lookup(b"\0" * 4) or b""
        return {i for i in range(len(words) * 8) if words[i // 8] >> (i % 8) & 1}

    wanted = {vip_filter_bit(vip_key(a, 0, 0)) for a in (VIP, "2001:db8:f::50")}
    assert bits() == wanted
    wildcard = P.tcp_to(VIP, dport=8443, flags="S")
    assert b.run(wildcard).reason == "TX_ENCAP"
    saved = flt.lookup(b"\0" * 4)
    flt.update(b"\0" * 4, bytes(len(saved or b"")))  # a filter without the bit: the wildcard is not looked up
    assert b.run(wildcard).reason == "PASS_NOT_VIP"
    flt.update(b"\0" * 4, b.dp.vip_filter_with())  # rebuilt from lb_vips
    assert bits() == wanted and b.run(wildcard).reason == "TX_ENCAP"
    assert b.dp.del_vip(VIP, 0, "tcp") and b.dp.del_vip(VIP, 0, _abi.VipMatch.ADDR_ONLY)
    assert bits() == {vip_filter_bit(vip_key("2001:db8:f::50", 0, 0))}, "a removed VIP's address leaves"


def test_protocol_is_part_of_the_vip(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 53, "udp", 0, [P.REALS4[0]])
    assert b.run(P.udp_to(VIP, dport=53)).reason == "TX_ENCAP"
    assert b.run(P.tcp_to(VIP, dport=53)).reason == "PASS_NOT_VIP"


def reals_for_flows(b: RunBalancer, frames: Sequence[Packet]) -> set[str]:
    return {real_of(b.run(f).out) for f in frames}


def test_hash_without_source_port_keeps_a_client_on_one_real(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, P.REALS4, flags=_abi.VipFlag.HASH_NO_SPORT | _abi.VipFlag.NO_LRU)
    b.vip("203.0.113.51", 80, "tcp", 1, P.REALS4, flags=_abi.VipFlag.NO_LRU)
    same_client = [P.tcp_to(VIP, sport=45000 + i, flags="S") for i in range(24)]
    assert len(reals_for_flows(b, same_client)) == 1
    control = [P.tcp_to("203.0.113.51", sport=45000 + i, flags="S") for i in range(24)]
    assert len(reals_for_flows(b, control)) > 1, "without the flag the source port spreads flows"


def test_hash_on_destination_port_only(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 0, "tcp", 0, P.REALS4, flags=_abi.VipFlag.HASH_DPORT_ONLY | _abi.VipFlag.NO_LRU)
    clients = [P.tcp_to(VIP, dport=8000, sport=45000 + i, src=f"198.51.100.{10 + i}", flags="S")
               for i in range(24)]
    assert len(reals_for_flows(b, clients)) == 1, "every client of one port reaches one real"
    ports = [P.tcp_to(VIP, dport=8000 + i, flags="S") for i in range(24)]
    assert len(reals_for_flows(b, ports)) > 1, "different ports spread"


def test_lru_bypass_follows_the_ring_at_once(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]], flags=_abi.VipFlag.NO_LRU)
    first = b.run(P.tcp_to(VIP, flags="S"))
    assert real_of(first.out) == P.REALS4[0] and first.events == {}, "no session lookups"
    b.ring(0, [P.REALS4[1]])
    second = b.run(P.tcp_to(VIP, flags="A"))
    assert real_of(second.out) == P.REALS4[1] and second.events == {}
