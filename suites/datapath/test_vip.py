"""test_vip.py: VIP matching (exact, port-0 wildcard, protocol) and the per-VIP hashing and LRU flags."""

from __future__ import annotations

from collections.abc import Sequence

from scapy.packet import Packet

from balancer import _abi

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
