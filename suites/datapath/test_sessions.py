"""test_sessions.py: session tables: stickiness, SYN re-hash, RST without entry, UDP expiry, fallback."""

from __future__ import annotations

import time

from balancer.libbpf import num_possible_cpus

from . import packets as P
from .conftest import BalancerFactory
from .frames import decode_encap

VIP = "203.0.113.60"


def real_of(out: bytes) -> str:
    return str(decode_encap(out, P.GUE_PORT).outer.dst)


def test_established_flow_sticks_to_its_real(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    syn = b.run(P.tcp_to(VIP, flags="S"))
    assert real_of(syn.out) == P.REALS4[0] and syn.events == {"LRU_MISS": 1}
    b.ring(0, [P.REALS4[1]])
    ack = b.run(P.tcp_to(VIP, flags="A"))
    assert real_of(ack.out) == P.REALS4[0] and ack.events == {"LRU_HIT": 1}
    new = b.run(P.tcp_to(VIP, sport=40001, flags="S"))
    assert real_of(new.out) == P.REALS4[1], "a new flow follows the new ring"


def test_syn_rehashes_an_existing_session(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    b.run(P.tcp_to(VIP, flags="S"))
    b.ring(0, [P.REALS4[1]])
    again = b.run(P.tcp_to(VIP, flags="S"))
    assert real_of(again.out) == P.REALS4[1] and again.events == {"SYN_REHASH": 1}
    ack = b.run(P.tcp_to(VIP, flags="A"))
    assert real_of(ack.out) == P.REALS4[1], "the re-hashed choice is remembered"


def test_rst_never_creates_a_session(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    rst = b.run(P.tcp_to(VIP, flags="R"))
    assert rst.reason == "TX_ENCAP" and rst.events == {"LRU_MISS": 1, "RST_NO_ENTRY": 1}
    b.ring(0, [P.REALS4[1]])
    ack = b.run(P.tcp_to(VIP, flags="A"))
    assert real_of(ack.out) == P.REALS4[1] and ack.events == {"LRU_MISS": 1}


def test_udp_session_expires_after_the_timeout(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False, udp_timeout_s=0.000001)
    b.vip(VIP, 53, "udp", 0, [P.REALS4[0]])
    assert real_of(b.run(P.udp_to(VIP, dport=53)).out) == P.REALS4[0]
    b.ring(0, [P.REALS4[1]])
    # The idle time comes from the coarse clock: once a clock tick (at most 10 ms) has passed since
    # the last packet, the 1 us timeout has expired. Until then a packet still hits its session.
    deadline = time.monotonic() + 1.0
    later = b.run(P.udp_to(VIP, dport=53))
    while later.events == {"LRU_HIT": 1} and time.monotonic() < deadline:
        assert real_of(later.out) == P.REALS4[0]
        time.sleep(0.002)  # the interval between packets; the loop waits for the tick
        later = b.run(P.udp_to(VIP, dport=53))
    assert real_of(later.out) == P.REALS4[1] and later.events == {"UDP_EXPIRED": 1}


def test_udp_session_holds_within_the_timeout(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False, udp_timeout_s=3600)
    b.vip(VIP, 53, "udp", 0, [P.REALS4[0]])
    b.run(P.udp_to(VIP, dport=53))
    b.ring(0, [P.REALS4[1]])
    later = b.run(P.udp_to(VIP, dport=53))
    assert real_of(later.out) == P.REALS4[0] and later.events == {"LRU_HIT": 1}


def test_session_to_a_removed_real_is_chosen_again(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    b.run(P.tcp_to(VIP, flags="S"))
    b.dp.del_real(b.real_id(P.REALS4[0]))
    b.ring(0, [P.REALS4[1]])
    assert real_of(b.run(P.tcp_to(VIP, flags="A")).out) == P.REALS4[1]


def test_empty_cpu_slot_uses_the_fallback_table(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    outer = b.dp.maps["lb_sessions"]
    cpus = min(num_possible_cpus(), 128)
    inner_fds = [outer.lookup(c.to_bytes(4, "little")) for c in range(cpus)]
    assert all(fd is not None for fd in inner_fds), "the loader fills every possible CPU's slot"
    for c in range(cpus):
        outer.delete(c.to_bytes(4, "little"))
    first = b.run(P.tcp_to(VIP, flags="S"))
    assert first.events == {"LRU_MISS": 1}
    b.ring(0, [P.REALS4[1]])
    hit = b.run(P.tcp_to(VIP, flags="A"))
    assert real_of(hit.out) == P.REALS4[0] and hit.events == {"LRU_HIT": 1}, "fallback is the table"
    for c, m in enumerate(b.dp.session_tables[:cpus]):
        outer.update(c.to_bytes(4, "little"), m.fd.to_bytes(4, "little"))
    back = b.run(P.tcp_to(VIP, flags="A"))
    assert real_of(back.out) == P.REALS4[0] and back.events == {"FALLBACK_HIT": 1}
