"""test_sessions.py: the session tables (IPv4, IPv6): stickiness, the SYN that creates no session, SYN
re-hash, RST without entry, UDP expiry, every CPU."""

from __future__ import annotations

import os
import socket
import time

import pytest

from balancer import _abi
from balancer.maplayout import SESSION_SETS, session_key, words_addr
from lab.harness import poll
from suites.sess4 import find_way, write_way

from . import packets as P
from .frames import decode_encap
from .rig import BalancerFactory, Outcome

VIP = "203.0.113.60"
CLOCK_MONOTONIC_COARSE = 6  # linux/time.h; the time module does not name it


def real_of(out: bytes) -> str:
    return str(decode_encap(out, P.GUE_PORT).outer.dst)


def test_established_flow_sticks_to_its_real(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    syn = b.run(P.tcp_to(VIP, flags="S"))
    assert real_of(syn.out) == P.REALS4[0] and syn.events == {"SYN_REHASH": 1}, "a SYN goes to the ring"
    first = b.run(P.tcp_to(VIP, flags="A"))
    assert real_of(first.out) == P.REALS4[0] and first.events == {"LRU_MISS": 1}, "the handshake's ACK inserts"
    b.ring(0, [P.REALS4[1]])
    ack = b.run(P.tcp_to(VIP, flags="A"))
    assert real_of(ack.out) == P.REALS4[0] and ack.events == {"LRU_HIT": 1}
    new = b.run(P.tcp_to(VIP, sport=40001, flags="S"))
    assert real_of(new.out) == P.REALS4[1], "a new flow follows the new ring"


def test_syn_rehashes_an_existing_session(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    """A SYN of a tuple that still has a session (a client reusing its port) goes to the ring, and the
    session is pointed at the ring's choice: the new connection's ACK follows its SYN."""
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    b.run(P.tcp_to(VIP, flags="S"))
    b.run(P.tcp_to(VIP, flags="A"))
    b.ring(0, [P.REALS4[1]])
    again = b.run(P.tcp_to(VIP, flags="S"))
    assert real_of(again.out) == P.REALS4[1] and again.events == {"SYN_REHASH": 1}
    [(_, _, _, sess)] = list(b.dp.sessions())
    assert sess.real_id == b.real_id(P.REALS4[1])
    ack = b.run(P.tcp_to(VIP, flags="A"))
    assert real_of(ack.out) == P.REALS4[1] and ack.events == {"LRU_HIT": 1}, "the re-hashed choice is remembered"


def test_in_a_syn_flood_a_syn_skips_its_lookup(balancer_factory: BalancerFactory) -> None:
    """Past cfg_syn_lookups SYNs in a CPU's window of the clock, a SYN goes to the ring without looking its
    session up: a reused tuple's session then keeps its old real (the price of a cheap SYN in a flood,
    Katran's too). Below it, the SYN is counted and the session pointed at the ring's choice."""
    b = balancer_factory(world=False, fresh=True)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    b.run(P.tcp_to(VIP, flags="S"))
    b.run(P.tcp_to(VIP, flags="A"))
    b.ring(0, [P.REALS4[1]])
    windows = b.dp.maps["lb_syn_window"]
    flood = _abi.SynWindow(window=(1 << 64) - 1, syns=1 << 40)  # a window ahead of the clock, far past the limit
    windows.update(b"\0" * 4, bytes(flood))
    syn = b.run(P.tcp_to(VIP, flags="S"))
    [(_, _, _, sess)] = list(b.dp.sessions())
    assert real_of(syn.out) == P.REALS4[1] and syn.events == {"SYN_REHASH": 1}
    assert sess.real_id == b.real_id(P.REALS4[0]), "in a flood the SYN did not look its session up"
    windows.update(b"\0" * 4, bytes(_abi.SynWindow()))
    b.run(P.tcp_to(VIP, flags="S"))
    [(_, _, _, sess)] = list(b.dp.sessions())
    assert sess.real_id == b.real_id(P.REALS4[1]), "out of the flood the SYN points the session at the ring"
    counted = [_abi.SynWindow.from_buffer_copy(v) for v in windows.lookup_percpu(b"\0" * 4) or []]
    assert sorted(w.syns for w in counted)[-1] == 1 and max(w.window for w in counted) > 0


def test_a_syn_creates_no_session(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0], P.REALS4[1]])
    for sport in range(40000, 40200):
        syn = b.run(P.tcp_to(VIP, sport=sport, flags="S"))
        assert syn.reason == "TX_ENCAP" and syn.events == {"SYN_REHASH": 1}
    assert list(b.dp.sessions()) == []
    assert b.run(P.tcp_to(VIP, sport=40000, flags="SA")).events == {"LRU_MISS": 1}, "a SYN-ACK is no new flow"
    assert len(list(b.dp.sessions())) == 1


def test_a_syn_flood_evicts_no_established_session(balancer_factory: BalancerFactory) -> None:
    """A flood of SYNs from new sources, many times the table's size, inserts nothing: the established
    flows' sessions are all there after it and still choose their real after the ring changes. (The
    kernel's LRU would keep sessions hit since their insert even if the flood inserted: the count of
    sessions is what tells the designs apart.)"""
    b = balancer_factory(world=False, fresh=True, lru_size=256)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    established = range(41000, 41050)
    for sport in established:
        b.run(P.tcp_to(VIP, sport=sport, flags="S"))
        b.run(P.tcp_to(VIP, sport=sport, flags="A"))
    for n in range(4096):  # 16 x the table's entries per CPU, every SYN a new source
        flood = b.run(P.tcp_to(VIP, sport=1024, flags="S", src=f"10.0.{n >> 8}.{n & 255}"))
        assert flood.events == {"SYN_REHASH": 1}
    assert len(list(b.dp.sessions())) == len(established), "the flood inserted nothing"
    b.ring(0, [P.REALS4[1]])
    for sport in established:
        ack = b.run(P.tcp_to(VIP, sport=sport, flags="A"))
        assert real_of(ack.out) == P.REALS4[0] and ack.events == {"LRU_HIT": 1}, sport


def test_a_ring_change_between_syn_and_ack_sends_the_ack_to_the_new_ring(balancer_factory: BalancerFactory) -> None:
    """The price of a SYN that inserts nothing (docs/architecture.md, decisions): a handshake whose ring
    slot changes owner between its SYN and its ACK sends the ACK to the new owner, which answers it
    with a reset, as if the session had been lost."""
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    assert real_of(b.run(P.tcp_to(VIP, flags="S")).out) == P.REALS4[0]
    b.ring(0, [P.REALS4[1]])
    ack = b.run(P.tcp_to(VIP, flags="A"))
    assert real_of(ack.out) == P.REALS4[1] and ack.events == {"LRU_MISS": 1}


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


def test_a_udp_session_time_is_written_once_a_sixteenth_of_the_timeout_old(
        balancer_factory: BalancerFactory) -> None:
    """A hit writes a UDP session's time back only when it is at least timeout / 16 old (one line write per
    flow per sixteenth, not per tick: every CPU serving the flow re-reads the line after a write), and the
    session expires only past timeout + timeout / 16, so the lag never expires a flow early. Timeout 16 s:
    the session's time is set back by hand, by half a second on either side of each bound."""
    b = balancer_factory(world=False, udp_timeout_s=16)
    b.vip(VIP, 53, "udp", 0, [P.REALS4[0]])
    b.run(P.udp_to(VIP, dport=53))
    [(_, _, flow, sess)] = list(b.dp.sessions())
    now = sess.atime_ns
    if now < 20 * 10**9:
        pytest.skip(f"the coarse clock reads {now} ns: the machine has been up less than the 20 s this sets back")
    way = find_way(b.dp, flow)

    def hit_with_time(age_s: float) -> tuple[Outcome, int]:
        write_way(b.dp, *way, flow, _abi.Session(real_id=sess.real_id, hash=sess.hash,
                                                 atime_ns=now - int(age_s * 1e9)))
        out = b.run(P.udp_to(VIP, dport=53))
        [(_, _, _, after)] = list(b.dp.sessions())
        return out, after.atime_ns

    out, atime = hit_with_time(0.5)
    assert out.events == {"LRU_HIT": 1} and atime == now - 500_000_000, "younger than a sixteenth: not written"
    out, atime = hit_with_time(1.5)
    assert out.events == {"LRU_HIT": 1} and atime >= now, "older than a sixteenth: written"
    out, atime = hit_with_time(16.5)
    assert out.events == {"LRU_HIT": 1} and atime >= now, "past the timeout, within its sixteenth: still held"
    out, _ = hit_with_time(17.5)
    assert out.events == {"UDP_EXPIRED": 1}


def test_session_to_a_removed_real_is_chosen_again(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    b.run(P.tcp_to(VIP, flags="A"))
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
        assert b.run(P.tcp_to(VIP, flags="A")).reason == "TX_ENCAP"
        b.ring(0, [P.REALS4[1]])
        os.sched_setaffinity(0, {cpus[1]})
        hit = b.run(P.tcp_to(VIP, flags="A"))
    finally:
        os.sched_setaffinity(0, before)
    assert real_of(hit.out) == P.REALS4[0] and hit.events == {"LRU_HIT": 1}


def test_each_family_has_its_own_table_under_the_key_python_computes(balancer_factory: BalancerFactory) -> None:
    """IPv4 sessions live in lb_sess4_sets (a way's 16-byte key), IPv6 ones in lb_sessions; the program
    writes the key that session_key computes, session_flow reads it back as the flow, and each table alone
    decides its family's hits: the IPv4 session's way emptied by the controller's flush, the next IPv4
    packet misses while the IPv6 one still hits."""
    b = balancer_factory(world=False)
    vip6 = "2001:db8:f::60"
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    b.vip(vip6, 80, "tcp", 1, [P.REALS6[0]])
    for dst in (VIP, vip6):
        assert b.run(P.tcp_to(dst, sport=40123, flags="A")).reason == "TX_ENCAP"
    found = {table: (key, flow, sess) for table, key, flow, sess in b.dp.sessions()}
    assert sorted(found) == [SESSION_SETS, "lb_sessions"], found
    for table, dst, src, real in ((SESSION_SETS, VIP, P.CLIENT4, P.REALS4[0]),
                                  ("lb_sessions", vip6, P.CLIENT6, P.REALS6[0])):
        key, flow, sess = found[table]
        assert session_key(flow) == (table, key)
        assert words_addr(bytes(flow.src), flow.family) == src and words_addr(bytes(flow.dst), flow.family) == dst
        assert (socket.ntohs(flow.sport), socket.ntohs(flow.dport), flow.proto) == (40123, 80, socket.IPPROTO_TCP)
        assert sess.real_id == b.real_id(real)
    assert b.dp.flush_sessions(VIP, 80, "tcp", b.real_id(P.REALS4[0])) == 1
    assert [t for t, _, _, _ in b.dp.sessions()] == ["lb_sessions"], "the flush emptied the IPv4 way"
    assert b.run(P.tcp_to(VIP, sport=40123)).events == {"LRU_MISS": 1}, "the IPv4 session was in lb_sess4_sets"
    assert b.run(P.tcp_to(vip6, sport=40123)).events == {"LRU_HIT": 1}, "the IPv6 one in lb_sessions"


def test_a_hit_encapsulates_with_the_hash_its_session_was_made_with(balancer_factory: BalancerFactory) -> None:
    """The session keeps the flow hash (GUE source port, flow label, outer source need it), so a hit does
    not hash the flow again: a session rewritten with another hash moves the hit's GUE source port to
    that hash; a session without one (hash 0, e.g. written by an older program) is hashed afresh."""
    b = balancer_factory(world=False)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]], mode="GUE1")

    def sport(out: bytes) -> int:
        return int.from_bytes(decode_encap(out, P.GUE_PORT).udp[0:2], "big")

    syn = sport(b.run(P.tcp_to(VIP, flags="S")).out)
    assert sport(b.run(P.tcp_to(VIP)).out) == syn, "the handshake's ACK inserts the session"
    [(_, _, flow, sess)] = list(b.dp.sessions())
    assert sess.hash and syn == 0xC000 | (sess.hash & 0x3FFF), "the session holds the hash the SYN used"
    assert sport(b.run(P.tcp_to(VIP)).out) == syn
    other = sess.hash ^ 0x1555
    way = find_way(b.dp, flow)
    write_way(b.dp, *way, flow, _abi.Session(real_id=sess.real_id, hash=other, atime_ns=sess.atime_ns))
    hit = b.run(P.tcp_to(VIP))
    assert hit.events == {"LRU_HIT": 1} and sport(hit.out) == 0xC000 | (other & 0x3FFF)
    write_way(b.dp, *way, flow, _abi.Session(real_id=sess.real_id, atime_ns=sess.atime_ns))
    assert [s.hash for _, _, _, s in b.dp.sessions()] == [0], "the controller reads the rewritten way"
    assert sport(b.run(P.tcp_to(VIP)).out) == syn, "hash 0: the flow is hashed again, to the same port"


def test_udp_session_time_is_the_coarse_monotonic_clock(balancer_factory: BalancerFactory) -> None:
    """The datapath times UDP sessions from jiffies (balancer/kclock.py gives it HZ and the jiffies at
    boot); what it writes must read as CLOCK_MONOTONIC_COARSE, to a tick or so, like the helper it
    replaces: sessions written by an older program stay valid across a reload, and back."""
    from balancer import kclock

    tick = kclock.tick()
    if tick is None:
        pytest.skip("this kernel tells its HZ neither in its config nor in /proc/timer_list: the datapath "
                    "keeps bpf_ktime_get_coarse_ns()")
    b = balancer_factory(world=False, udp_timeout_s=3600)
    b.vip(VIP, 53, "udp", 0, [P.REALS4[0]])
    before = time.clock_gettime_ns(CLOCK_MONOTONIC_COARSE)
    b.run(P.udp_to(VIP, dport=53))
    after = time.clock_gettime_ns(CLOCK_MONOTONIC_COARSE)
    [(_, _, _, sess)] = list(b.dp.sessions())
    slack = 2 * tick.ns_per_jiffy + 500_000_000  # the tick, and how far apart the two clocks began
    assert before - slack <= sess.atime_ns <= after + slack, \
        f"session time {sess.atime_ns} ns, the coarse clock {before}..{after} ns (HZ {tick.hz} from {tick.source})"
