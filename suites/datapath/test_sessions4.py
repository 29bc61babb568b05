"""test_sessions4.py: the IPv4 session sets (bpf/include/session4.h): two choices of set, the
overflow bit, ways that keep their sessions until the table fills, and ways checked by a checksum of their
content (balancer.maplayout.sess4_check) so that a way torn by a writer is a miss."""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from balancer import _abi
from balancer.maplayout import SESSION_SETS, sess4_check, sess4_held
from suites.sess4 import find_way

from . import packets as P
from .rig import ROOT, XDP_VERDICTS, BalancerFactory, RunBalancer

VIP = "203.0.113.61"
OVERFLOW = int(_abi.Sess4.OVERFLOW) & 0xFFFFFFFF
CHECK = int(_abi.Sess4.CHECK)
PROTO = int(_abi.Sess4.PROTO)
WAYS = int(_abi.Sess4.WAYS)
WRITER_C = Path(__file__).parent / "native" / "sess4_writer.c"
IPIP_OUTER_DST = slice(14 + 16, 14 + 20)  # an IPIP frame's outer IPv4 destination (Ethernet, then IPv4)
RACE_RUNS = 200_000  # test runs of flow A's RST while the writer rewrites its way
RACE_SECONDS = 10.0  # at most, on a slow machine: fewer runs then


def sets_of(b: RunBalancer) -> list[_abi.Sess4Set]:
    """Every set of SESSION_SETS, copied out of the map's memory."""
    words = b.dp.maps[SESSION_SETS].mmap_words()
    return [_abi.Sess4Set.from_buffer_copy(words[i].tobytes()) for i in range(words.shape[0])]


def held(b: RunBalancer) -> npt.NDArray[np.bool_]:
    """The (sets, ways) mask of SESSION_SETS' ways that hold a session (maplayout.sess4_held)."""
    return sess4_held(b.dp.maps[SESSION_SETS].mmap_words())


def way_check(key: _abi.Sess4Key, sess: _abi.Session) -> int:
    """The check a way's content gives (balancer.maplayout.sess4_check), to compare with its tag's."""
    return sess4_check(key.src, key.dst, key.ports, key.tag & PROTO, sess.real_id, sess.hash)


def test_half_a_table_of_flows_keeps_every_session(balancer_factory: BalancerFactory) -> None:
    """Flows filling 40 % of the ways all find their session again: a full first set sends a flow to its
    second, and the first set's overflow bit sends the lookup after it."""
    b = balancer_factory(world=False, fresh=True, lru_size=256)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    ways = b.dp.maps[SESSION_SETS].max_entries * WAYS
    flows = [(f"10.1.{n >> 8}.{n & 255}", 1024 + n) for n in range(ways * 2 // 5)]
    for src, sport in flows:
        assert b.run(P.tcp_to(VIP, sport=sport, flags="A", src=src)).events == {"LRU_MISS": 1}
    assert held(b).sum() == len(flows), "every ACK took a way of its own"
    sets = sets_of(b)
    assert any(s.keys[0].tag & OVERFLOW for s in sets), "some flow went to its second set"
    for src, sport in flows:
        assert b.run(P.tcp_to(VIP, sport=sport, flags="A", src=src)).events == {"LRU_HIT": 1}, (src, sport)


def test_a_first_set_with_three_empty_ways_takes_a_new_flow(balancer_factory: BalancerFactory) -> None:
    """SESS4_FIRST_FREE: a new flow goes into its first set while that has 3 empty ways, though its second
    is emptier; with 2 empty ways it reads the second and takes the emptier. Two sets: every flow's sets are
    set 0 and set 1, its first one found by inserting it alone."""
    b = balancer_factory(world=False, fresh=True, lru_size=1)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    assert b.dp.maps[SESSION_SETS].max_entries == 2

    def held_per_set() -> list[int]:
        return held(b).sum(axis=1).tolist()

    def first_set(n: int) -> int:
        words = b.dp.maps[SESSION_SETS].mmap_words()
        words[:] = 0
        del words
        assert b.run(P.tcp_to(VIP, sport=1024 + n, flags="A", src=f"10.3.0.{n}")).events == {"LRU_MISS": 1}
        return held_per_set().index(1)

    firsts = {n: first_set(n) for n in range(1, 40)}
    same = [n for n, s in firsts.items() if s == 0][:3]
    assert len(same) == 3, f"three flows whose first set is set 0: {firsts}"
    words = b.dp.maps[SESSION_SETS].mmap_words()
    words[:] = 0
    del words
    counts = []
    for n in same:
        assert b.run(P.tcp_to(VIP, sport=1024 + n, flags="A", src=f"10.3.0.{n}")).events == {"LRU_MISS": 1}
        counts.append(held_per_set())
    assert counts == [[1, 0], [2, 0], [2, 1]], \
        f"ways held in (set 0, set 1) after each flow: {counts}; the first set keeps flows while 3 ways are empty"
    for n in same:
        assert b.run(P.tcp_to(VIP, sport=1024 + n, flags="A", src=f"10.3.0.{n}")).events == {"LRU_HIT": 1}


def test_the_datapath_checks_its_ways_as_maplayout_does(balancer_factory: BalancerFactory) -> None:
    """Every way the datapath writes (TCP at the handshake's ACK, UDP at the first packet; way 0, by atomic
    AND / OR under its set's overflow bit, too) carries in its tag the check balancer.maplayout.sess4_check
    computes from its content: the C checksum and its Python twin cannot drift apart."""
    b = balancer_factory(world=False, lru_size=1)  # the fewest sets (2 on up to 8 CPUs): flows fill way 0 soon
    b.vip(VIP, 80, "tcp", 0, P.REALS4)
    b.vip(VIP, 53, "udp", 1, P.REALS4)
    ways = b.dp.maps[SESSION_SETS].max_entries * WAYS
    for n in range(ways):  # as many flows as ways: sets fill to way 0, flows spill into their second set
        src = f"10.2.{n >> 8}.{n & 255}"
        if n % 2:
            b.run(P.udp_to(VIP, sport=3000 + n, dport=53, src=src))
            continue
        b.run(P.tcp_to(VIP, sport=2000 + n, flags="S", src=src))
        b.run(P.tcp_to(VIP, sport=2000 + n, flags="A", src=src))
    used = [(i, w, s.keys[w], s.sess[w]) for i, s in enumerate(sets_of(b)) for w in range(WAYS)
            if s.keys[w].tag & CHECK]
    assert {k.tag & PROTO for _, _, k, _ in used} == {6, 17}, "TCP and UDP ways"
    assert any(w == 0 for _, w, _, _ in used), "ways 0 filled (by atomic AND / OR)"
    assert any(w == 0 and k.tag & OVERFLOW for _, w, k, _ in used), "a way 0 under its set's overflow bit"
    wrong = [(i, w, hex(k.tag), hex(way_check(k, s))) for i, w, k, s in used if k.tag & CHECK != way_check(k, s)]
    assert not wrong, f"ways whose tag's check is not sess4_check of their content (set, way, tag, check): {wrong}"
    print(f"\n{len(used)} ways of {ways} checked")


class WayImage(ctypes.Structure):
    """struct sess4_image of native/sess4_writer.c: a way's key (its final tag in it), then its session."""

    _fields_ = [("key", _abi.Sess4Key), ("sess", _abi.Session)]


def build_writer(tmp_path: Path) -> Callable[..., int]:
    """native/sess4_writer.c compiled into tmp_path, its l4lab_sess4_rewrite ready to call."""
    lib = tmp_path / "sess4_writer.so"
    cmd = ["clang", "-O2", "-Wall", "-Werror", "-shared", "-fPIC", "-I", str(ROOT / "bpf" / "include"),
           "-o", str(lib), str(WRITER_C)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except FileNotFoundError:
        pytest.fail(f"cannot compile {WRITER_C}: clang is not installed; install clang (the datapath needs it too)")
    if done.returncode:
        pytest.fail(f"cannot compile {WRITER_C}: `{' '.join(cmd)}` said:\n{done.stderr}")
    rewrite = ctypes.CDLL(str(lib)).l4lab_sess4_rewrite
    rewrite.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(WayImage), ctypes.c_uint32,
                        ctypes.POINTER(ctypes.c_int)]
    rewrite.restype = ctypes.c_uint64
    return rewrite


@pytest.mark.parametrize("keep_proto", [False, True], ids=["writing-proto-0", "writing-proto-kept"])
def test_a_way_rewritten_meanwhile_never_sends_a_flow_to_another_flows_real(
        balancer_factory: BalancerFactory, tmp_path: Path, keep_proto: bool) -> None:
    """A native writer on another CPU rewrites flow A's way through the map's memory, in a tight loop, with
    two whole, valid images in the writer's order ("being written", key and session, the final tag): A to
    real X, then flow B (every key word another) to real Y. Meanwhile A's RSTs, which follow a session and
    insert nothing (session.h; a SYN would go to the ring and write its choice over the way), find A's
    session (X) or miss (the ring's real, Z): never Y, which only a way read half old, half new can give.
    Both X and Z must be seen, or the writer did not race the reader and the test proved nothing.

    The "being written" tag: protocol 0 as sess4_write stores it for ways 1-3 (no key matches under it, so
    only a reader that reads the keys before a write and the session after it goes astray: a window of a
    few stores, rarely hit), or with the protocol kept (A's key matches during every write of it, and only
    the check, which is never "being written", keeps the way out: a build without the check fails often)."""
    others = set(range(os.cpu_count() or 1)) - os.sched_getaffinity(0)
    if not others:
        pytest.skip("the writer needs a CPU other than the test runs': this machine has one")
    rewrite = build_writer(tmp_path)
    b = balancer_factory(world=False, lru_size=256)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    b.run(P.tcp_to(VIP, sport=50000, flags="S"))
    b.run(P.tcp_to(VIP, sport=50000, flags="A"))
    real_x, real_y, _ = (b.real_id(r) for r in P.REALS4)  # Y in lb_reals: a hit on it would go there
    b.ring(0, [P.REALS4[2]])  # a miss now goes to Z
    [(_, _, flow_a, _)] = list(b.dp.sessions())
    s, w = find_way(b.dp, flow_a)
    assert w != 0, "the first flow of a set takes way 3 (the writer's plain tag stores would clear way 0's bit)"
    a = WayImage(sets_of(b)[s].keys[w], sets_of(b)[s].sess[w])  # as the datapath wrote it
    assert a.sess.real_id == real_x, f"A's way holds real {a.sess.real_id}, not X ({real_x})"
    assert a.key.tag & CHECK == way_check(a.key, a.sess), "A's way as the datapath wrote it checks (maplayout)"
    proto = a.key.tag & PROTO
    b_key = _abi.Sess4Key(src=a.key.src ^ 0x01000000, dst=a.key.dst ^ 0x02000000, ports=a.key.ports ^ 0x01000100)
    b_sess = _abi.Session(real_id=real_y, hash=a.sess.hash ^ 0x5A5A5A5A, atime_ns=a.sess.atime_ns)
    b_key.tag = proto | way_check(b_key, b_sess)
    images = (WayImage * 2)(a, WayImage(b_key, b_sess))
    writing = CHECK | (proto if keep_proto else 0)
    torn_to_y = {sess4_check(a.key.src, a.key.dst, a.key.ports, proto, real_y, h) for h in (a.sess.hash, b_sess.hash)}
    assert not torn_to_y & {a.key.tag & CHECK, b_key.tag & CHECK}, "no torn mix of the images checks as A to Y"

    words = b.dp.maps[SESSION_SETS].mmap_words()
    set_address = words[s].ctypes.data  # words stays until the writer is done
    stop = ctypes.c_int(0)
    written: list[int] = []
    failed: list[BaseException] = []

    def writer() -> None:
        try:
            os.sched_setaffinity(0, others)  # this thread only: the test's runs stay on their CPU
            written.append(rewrite(set_address, w, images, writing, ctypes.byref(stop)))
        except BaseException as exc:  # handed to the test's thread
            failed.append(exc)

    frame = bytes(P.tcp_to(VIP, sport=50000, flags="R"))
    reals = {socket.inet_aton(r): r for r in P.REALS4}
    counters_before = {r: b.dp.real_stats(b.real_id(r))[0] for r in P.REALS4}
    seen: Counter[tuple[str, str]] = Counter()
    thread = threading.Thread(target=writer, name="sess4-writer")
    thread.start()
    started = time.monotonic()
    try:
        for n in range(RACE_RUNS):
            action, out = b.dp.run(frame)
            seen[XDP_VERDICTS.get(action, str(action)), reals.get(out[IPIP_OUTER_DST], out.hex())] += 1
            if n % 4096 == 4095 and time.monotonic() - started > RACE_SECONDS:
                break
    finally:
        stop.value = 1
        thread.join()
        del words
    elapsed = time.monotonic() - started
    assert not failed, f"the writer thread failed: {failed[0]!r}"
    x, y, z = (seen["XDP_TX", r] for r in P.REALS4)
    runs = sum(seen.values())
    print(f"\n{runs} RSTs of A in {elapsed:.1f} s while {written[0]} images were written: X {x}, Z {z}, Y {y}")
    assert x + y + z == runs, f"every RST sent on to a real by IPIP: {dict(seen)}"
    counted = [b.dp.real_stats(b.real_id(r))[0] - counters_before[r] for r in P.REALS4]
    assert counted == [x, y, z], f"lb_real_stats moved by {counted} for X, Y, Z; the frames said {[x, y, z]}"
    assert y == 0, f"{y} of A's packets went to B's real Y: a torn way was taken (X {x}, Z {z})"
    assert x and z, f"both hits (X {x}) and misses (Z {z}), or the writer did not race the reader"


def test_the_controller_reads_a_way_only_while_its_check_is_its_content(balancer_factory: BalancerFactory) -> None:
    """The tag the datapath writes holds sess4_check of the way's key, protocol, real and hash, so the
    controller's walk lists the way; the same way with one word changed under its tag (a torn or stale
    way), or with the "being written" check, is no session; put back, it is one again."""
    b = balancer_factory(world=False, fresh=True, lru_size=256)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    assert b.run(P.tcp_to(VIP, sport=50001, flags="A")).events == {"LRU_MISS": 1}
    [(table, key, flow, sess)] = list(b.dp.sessions())
    assert table == SESSION_SETS and sess.real_id == b.real_id(P.REALS4[0]) and sess.hash
    s, w = find_way(b.dp, flow)
    words = b.dp.maps[SESSION_SETS].mmap_words()
    src, dst, ports, tag = (int(x) for x in words[s, 4 * w:4 * w + 4])
    assert (tag & CHECK) == sess4_check(src, dst, ports, tag & 0xFF, sess.real_id, sess.hash), \
        "the datapath's check is sess4_check of the way's content"
    assert key == struct.pack("<4I", src, dst, ports, socket.IPPROTO_TCP)
    for at, changed in ((16 + 4 * w, sess.real_id ^ 1), (16 + 4 * w + 1, sess.hash ^ 0x100),
                        (4 * w, src ^ 0x01000000), (4 * w + 2, ports ^ 1), (4 * w + 3, CHECK | socket.IPPROTO_TCP)):
        was = int(words[s, at])
        words[s, at] = changed
        assert list(b.dp.sessions()) == [], f"word {at} of the set changed under the tag, the way still listed"
        words[s, at] = was
        assert [k for _, k, _, _ in b.dp.sessions()] == [key]
    del words


def test_a_flush_empties_the_ways_and_keeps_the_overflow_bits(balancer_factory: BalancerFactory) -> None:
    """flush_sessions empties every way of the VIP's real (its count, then no session left, each flow's
    next packet a miss) and leaves each set's overflow bit as it was: the flows still in second sets are
    found after new inserts."""
    b = balancer_factory(world=False, fresh=True, lru_size=256)
    b.vip(VIP, 80, "tcp", 0, [P.REALS4[0]])
    b.vip(VIP, 81, "tcp", 1, [P.REALS4[1]])
    ways = b.dp.maps[SESSION_SETS].max_entries * int(_abi.Sess4.WAYS)
    flows = [(f"10.2.{n >> 8}.{n & 255}", 1024 + n, 80 + n % 2) for n in range(ways * 3 // 5)]
    for src, sport, dport in flows:
        assert b.run(P.tcp_to(VIP, sport=sport, dport=dport, flags="A", src=src)).events == {"LRU_MISS": 1}
    words = b.dp.maps[SESSION_SETS].mmap_words()
    overflow = words[:, 3] & OVERFLOW
    both = (overflow != 0) & (words[:, 3] & CHECK != 0) & (words[:, 16] == b.real_id(P.REALS4[0]))
    assert both.any(), "some set holds an overflow bit and, in its way 0, a session the flush empties"
    flushed = b.dp.flush_sessions(VIP, 80, "tcp", b.real_id(P.REALS4[0]))
    assert flushed == sum(1 for _, _, dport in flows if dport == 80)
    assert {socket.ntohs(f.dport) for _, _, f, _ in b.dp.sessions()} == {81}
    assert sum(1 for _ in b.dp.sessions()) == len(flows) - flushed
    assert ((words[:, 3] & OVERFLOW) == overflow).all(), "a flush cleared or set an overflow bit"
    del words
    for src, sport, dport in flows:
        want = {"LRU_MISS": 1} if dport == 80 else {"LRU_HIT": 1}
        assert b.run(P.tcp_to(VIP, sport=sport, dport=dport, flags="A", src=src)).events == want, (src, sport)
    for src, sport, dport in flows:
        assert b.run(P.tcp_to(VIP, sport=sport, dport=dport, flags="A", src=src)).events == {"LRU_HIT": 1}


def test_a_check_is_never_empty_nor_being_written() -> None:
    """sess4_check moves the two checks a content may hash to that mean something else: 0 (empty) to
    0x100, all ones (being written) to all ones but bit 8."""
    assert sess4_check(0, 0, 0, 0, 0, 0) == 0x100, "content all zero hashes to 0"
    x = 0xFFFFFFFF
    x0 = x ^ (x >> 15) ^ (x >> 30)  # the inverse of x ^= x >> 15 on 32 bits
    assert x0 ^ (x0 >> 15) == x
    hash32 = x0 * pow(0x165667B1, -1, 1 << 32) & 0xFFFFFFFF
    assert sess4_check(0, 0, 0, 0, 0, hash32) == CHECK ^ 0x100
    assert sess4_check(0, 0, 0, 0, 0, hash32 ^ 1) not in (0, CHECK)
