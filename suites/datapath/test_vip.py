"""test_vip.py: VIP matching (exact, port-0 wildcard, protocol, the VIP index)
and the per-VIP hashing and LRU flags."""

from __future__ import annotations

import itertools
import os
import random
import select
from collections.abc import Sequence

import numpy as np
import pytest
from scapy.layers.inet import ICMP, IP
from scapy.packet import Packet

from balancer import _abi
from balancer.maplayout import SLOT_SHARED, vip_index_from, vip_key, vip_slot

from . import packets as P
from .frames import decode_encap
from .rig import BalancerFactory, RunBalancer, frame_bytes

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


def test_the_wildcard_and_the_address_entry_are_found_through_their_own_slots(
        balancer_factory: BalancerFactory) -> None:
    """A port that has no VIP of its own costs a second slot, the port-0 wildcard's: emptying that slot
    (lb_vips keeps the key) turns the wildcard's traffic into non-VIP traffic, and an ICMP echo to the
    address is answered only while the address-only entry's slot holds it."""
    b = balancer_factory(world=False)
    b.vip(VIP, 0, "tcp", 0, [P.REALS4[0]])
    index = b.dp.vip_index()
    wildcard = P.tcp_to(VIP, dport=8443, flags="S")
    echo = P.eth() / IP(src=P.CLIENT4, dst=VIP) / ICMP(type=8, id=7, seq=1) / P.PAYLOAD
    cases = [(vip_slot(vip_key(VIP, 0, "tcp")), wildcard, "TX_ENCAP", "PASS_NOT_VIP"),
             (vip_slot(vip_key(VIP, 0, _abi.VipMatch.ADDR_ONLY)), echo, "TX_ICMP_ECHO", "PASS_ICMP_NOT_VIP")]
    for slot, frame, served, missed in cases:
        assert b.run(frame).reason == served
        saved = index[slot].copy()
        index[slot] = 0  # empty: a definite miss, lb_vips is not asked
        assert b.run(frame).reason == missed, f"the program read slot {slot}"
        index[slot] = saved
        assert b.run(frame).reason == served
    assert b.dp.del_vip(VIP, 0, "tcp") and b.dp.del_vip(VIP, 0, _abi.VipMatch.ADDR_ONLY)
    assert not index.any(), "the last VIP's slots are empty again"
    assert b.run(wildcard).reason == "PASS_NOT_VIP"


def index_from_vips(b: RunBalancer) -> np.ndarray:
    """lb_vip_index as built afresh from lb_vips' entries."""
    return vip_index_from(list(b.dp.maps["lb_vips"].items()))


def to(addr: str, port: int, proto: str) -> Packet:
    """A first packet of a flow to (addr, port, proto); port 0 (a wildcard VIP): to port 53."""
    return P.tcp_to(addr, dport=port or 53, flags="S") if proto == "tcp" else P.udp_to(addr, dport=port or 53)


def colliding(port: int, proto: str, count: int = 2, skip: int = 0) -> list[str]:
    """`count` IPv4 addresses in 10.0.0.0/16 whose VIP keys (port, proto) have one lb_vip_index slot."""
    by_slot: dict[int, list[str]] = {}
    for n in itertools.count(1):
        addr = f"10.0.{n >> 8}.{n & 255}"
        same = by_slot.setdefault(vip_slot(vip_key(addr, port, proto)), [])
        same.append(addr)
        if len(same) == count + skip:
            return same[skip:]
    raise AssertionError("unreachable")


def test_the_program_finds_a_vip_in_the_slot_python_computes(balancer_factory: BalancerFactory) -> None:
    """C and Python place keys alike: each VIP is found in its slot, and only there (an emptied slot
    is a definite miss although lb_vips still has the key); a slot forced SHARED sends the program to
    lb_vips, where it finds the VIP."""
    b = balancer_factory(world=False)
    cases = [("203.0.113.50", 80, "tcp"), ("198.51.100.7", 5353, "udp"), ("2001:db8:f::50", 443, "tcp"),
             ("2001:db8:f::1:2", 8080, "udp")]
    index = b.dp.vip_index()
    for num, (addr, port, proto) in enumerate(cases):
        reals = P.REALS4 if ":" not in addr else P.REALS6
        b.vip(addr, port, proto, num, [reals[num % 3]])
        frame = to(addr, port, proto)
        slot = vip_slot(vip_key(addr, port, proto))
        assert bytes(index[slot, 3:]) == vip_key(addr, port, proto), f"{addr}: the key sits in its slot"
        out = b.run(frame)
        assert out.reason == "TX_ENCAP" and real_of(out.out) == reals[num % 3], f"{addr}:{port} found"
        saved = index[slot].copy()
        index[slot, -1] = 0  # empty: a definite miss, lb_vips is not asked
        assert b.run(frame).reason == "PASS_NOT_VIP", f"{addr}: the program read slot {slot}"
        index[slot] = 0
        index[slot, -1] = SLOT_SHARED
        assert b.run(frame).reason == "TX_ENCAP", f"{addr}: a SHARED slot is looked up in lb_vips"
        index[slot] = saved
    assert np.array_equal(index, index_from_vips(b))
    assert b.dp.sync_vip_index() == 0


def test_keys_that_share_a_slot_are_found_through_lb_vips(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    first, second = colliding(80, "tcp")
    slot = vip_slot(vip_key(first, 80, "tcp"))
    index = b.dp.vip_index()
    b.vip(first, 80, "tcp", 0, [P.REALS4[0]])
    b.vip(second, 80, "tcp", 1, [P.REALS4[1]])
    assert index[slot, -1] == SLOT_SHARED and not index[slot, :-1].any()
    for addr, real in ((first, P.REALS4[0]), (second, P.REALS4[1])):
        out = b.run(P.tcp_to(addr, dport=80, flags="S"))
        assert out.reason == "TX_ENCAP" and real_of(out.out) == real, addr
    assert b.dp.del_vip(first, 80, "tcp")
    assert bytes(index[slot, 3:]) == vip_key(second, 80, "tcp"), "the slot holds the one key left"
    assert real_of(b.run(P.tcp_to(second, dport=80, flags="S")).out) == P.REALS4[1]
    assert b.run(P.tcp_to(first, dport=80, flags="S")).reason == "PASS_NOT_VIP"
    assert np.array_equal(index, index_from_vips(b))


def test_the_index_after_puts_and_deletes_is_a_fresh_build(balancer_factory: BalancerFactory) -> None:
    """Random puts (new keys, changed metas) and deletes, with keys that collide: after each step the
    mapped index equals lb_vip_index built afresh from lb_vips, and every VIP is served as its meta says."""
    b = balancer_factory(world=False)
    rng = random.Random(11)
    pool = [(a, 80, "tcp") for a in colliding(80, "tcp", 3)] + [(a, 0, "udp") for a in colliding(0, "udp", 2)]
    pool += [(f"2001:db8:e::{n:x}", 443, "tcp") for n in range(1, 6)]
    live: dict[tuple[str, int, str], int] = {}
    for step in range(60):
        key = rng.choice(pool)
        if key in live and rng.random() < 0.4:
            assert b.dp.del_vip(*key)
            del live[key]
        else:
            live[key] = rng.randrange(16)
            b.dp.put_vip(*key, vip_num=live[key], encap=_abi.Encap.IPIP)
        assert np.array_equal(b.dp.vip_index(), index_from_vips(b)), f"step {step}"
    for num in range(16):
        b.ring(num, [P.REALS4[num % 3] if num % 2 else P.REALS6[num % 3]])
    for (addr, port, proto), num in live.items():
        out = b.run(to(addr, port, proto))
        if ":" in addr and num % 2:  # an IPv6 VIP with an IPv4 real
            assert out.reason == "DROP_FAMILY_MISMATCH", addr
        else:
            real = P.REALS4[num % 3] if num % 2 else P.REALS6[num % 3]
            assert out.reason == "TX_ENCAP" and real_of(out.out) == real, f"{addr}:{port} is VIP #{num}"
    for key in set(pool) - set(live):
        assert b.run(to(*key)).reason == "PASS_NOT_VIP", key


def test_a_reader_never_misreads_the_index_while_the_controller_rewrites_it(
        balancer_factory: BalancerFactory) -> None:
    """A forked process runs VIP K's packets through the program back to back on another CPU, while this
    one rewrites K's slot: K's meta flips between VIP #0 and #1, and a key that shares the slot comes
    and goes (single -> SHARED -> K published afresh into a zeroed slot). Every packet is encapsulated
    for K by one of its two metas, none is missed, and both metas served packets (the reads overlapped
    the writes)."""
    mine = os.sched_getaffinity(0)
    other = sorted(set(range(os.cpu_count() or 1)) - mine)
    if not other:
        pytest.skip("needs a second CPU for the reading process")
    b = balancer_factory(world=False)
    k, k2 = colliding(80, "tcp", skip=2)
    b.vip(k, 80, "tcp", 0, [P.REALS4[0]], flags=_abi.VipFlag.NO_LRU)
    b.ring(1, [P.REALS4[1]])
    prog = b.dp.programs["balancer_xdp"]
    frame = frame_bytes(P.tcp_to(k, dport=80, flags="S"))
    before = b.dp.reasons()
    stop_r, stop_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the reader: one packet per run (a repeated run would see its own output)
        try:
            os.sched_setaffinity(0, {other[0]})
            while not select.select([stop_r], [], [], 0)[0]:
                for _ in range(32):
                    prog.test_run(frame)
        finally:
            os._exit(0)
    try:
        for i in range(1, 61):
            b.dp.put_vip(k, 80, "tcp", vip_num=i % 2, flags=_abi.VipFlag.NO_LRU)
            b.dp.put_vip(k2, 80, "tcp", vip_num=2)
            b.dp.del_vip(k2, 80, "tcp")
    finally:
        os.write(stop_w, b"x")
        os.waitpid(pid, 0)
        os.close(stop_r)
        os.close(stop_w)
    moved = {r: n - before[r] for r, n in b.dp.reasons().items() if n != before[r]}
    runs = sum(moved.values())
    assert moved == {"TX_ENCAP": runs}, f"{runs} packets, read while the index changed: {moved}"
    served = (b.dp.vip_stats(0)[0], b.dp.vip_stats(1)[0])
    assert min(served) > 0 and sum(served) == runs, f"packets per meta: {served}"


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


def test_flows_reach_every_ring_slot_evenly(balancer_factory: BalancerFactory) -> None:
    """Flows spread over the whole ring, however the hash is scaled to it: each slot of a 13-slot ring
    has its own real, and 1,300 new flows reach all 13, the first and the last slot included, about 100
    each (a binomial's standard deviation is 9.6: the bounds are 4 of them)."""
    b = balancer_factory(world=False)
    reals = [f"10.0.9.{i + 1}" for i in range(b.dp.ring_size)]
    b.vip(VIP, 80, "tcp", 0, reals, flags=_abi.VipFlag.NO_LRU)
    counts = dict.fromkeys(reals, 0)
    for i in range(100 * len(reals)):
        out = b.run(P.tcp_to(VIP, sport=1024 + i % 50000, src=f"198.51.{100 + i // 250}.{i % 250 + 1}",
                             flags="S")).out
        counts[real_of(out)] += 1
    assert min(counts.values()) >= 60 and max(counts.values()) <= 140, f"flows per slot: {counts}"
