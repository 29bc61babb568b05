"""test_sessions.py: the session table: stickiness, SYN re-hash, RST without entry, UDP expiry, every CPU."""

from __future__ import annotations

import os

import pytest

from lab.harness import poll

from . import packets as P
from .frames import decode_encap
from .rig import BalancerFactory, Outcome

VIP = "203.0.113.60"


def real_of(out: bytes) -> str:
    return str(decode_encap(out, P.GUE_PORT).outer.dst)


def test_established_flow_sticks_to_its_real(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    syn = b.run(P.tcp_to(VIP, flags="S"))
    assert real_of(syn.out) == P.REALS4[0] and syn.events == {"SYN_REHASH": 1}, "a SYN never looks up"
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
    def again() -> Outcome:
        out = b.run(P.udp_to(VIP, dport=53))
        if out.events == {"LRU_HIT": 1}:
            assert real_of(out.out) == P.REALS4[0]
        return out

    later = poll(1.0, again, "the session expired", until=lambda o: o.events != {"LRU_HIT": 1}, check=False,
                 interval_s=0.002)  # the interval between packets; the loop waits for the tick
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


def test_a_flow_hits_its_session_on_every_cpu(balancer_factory: BalancerFactory) -> None:
    """One table for all CPUs (per-CPU LRU lists only): a flow that moves CPU keeps its real."""
    cpus = list(range(os.cpu_count() or 1))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs to move a flow between them")
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, {cpus[0]})
        assert b.run(P.tcp_to(VIP, flags="S")).reason == "TX_ENCAP"
        b.ring(0, [P.REALS4[1]])
        os.sched_setaffinity(0, {cpus[1]})
        hit = b.run(P.tcp_to(VIP, flags="A"))
    finally:
        os.sched_setaffinity(0, before)
    assert real_of(hit.out) == P.REALS4[0] and hit.events == {"LRU_HIT": 1}
