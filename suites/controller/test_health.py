"""Health probes and the monitor against real loopback servers: results, timeouts, rise/fall, concurrency."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import pytest
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether

from balancer import config as cfg
from balancer import health
from balancer.datapath import verify_abi
from balancer.errors import ConfigError
from balancer.health import hc_target_bytes
from balancer.libbpf import BpfObject, Map, Program
from lab.harness import poll

LOOP = "127.0.0.1"
REPO = Path(__file__).resolve().parents[2]


class _Server:
    """A loopback server on an ephemeral port whose reply is chosen by the test; closed at teardown."""

    def __init__(self, kind: int, reply: Callable[[bytes], bytes | None]) -> None:
        self.sock = socket.socket(socket.AF_INET, kind)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((LOOP, 0))
        self.port: int = self.sock.getsockname()[1]
        self.kind = kind
        self.reply = reply
        self._stop = threading.Event()
        self._held: list[socket.socket] = []
        if kind == socket.SOCK_STREAM:
            self.sock.listen(64)
        self.sock.settimeout(0.05)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.kind == socket.SOCK_STREAM:
                    conn, _ = self.sock.accept()
                    conn.settimeout(1.0)
                    try:
                        data = conn.recv(4096)
                    except OSError:
                        data = b""
                    out = self.reply(data)
                    if out is None:
                        self._held.append(conn)  # accept, never answer
                        continue
                    conn.sendall(out)
                    conn.close()
                else:
                    data, peer = self.sock.recvfrom(2048)
                    out = self.reply(data)
                    if out is not None:
                        self.sock.sendto(out, peer)
            except (TimeoutError, OSError):
                continue

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for c in self._held:
            c.close()
        self.sock.close()


@pytest.fixture
def servers() -> Iterator[Callable[[int, Callable[[bytes], bytes | None]], _Server]]:
    """Name: servers. Scope: function. Depends: loopback.

    A factory of loopback servers (TCP or UDP) replying as told; all closed afterwards::

        def test_x(servers):
            srv = servers(socket.SOCK_STREAM, lambda req: b"HTTP/1.0 200 OK\\r\\n\\r\\n")
            assert health.probe_http(LOOP, srv.port, "/", 0.5).ok
    """
    with ExitStack() as stack:
        def make(kind: int, reply: Callable[[bytes], bytes | None]) -> _Server:
            srv = _Server(kind, reply)
            stack.callback(srv.close)
            return srv
        yield make


def _closed_port(kind: int) -> int:
    """A loopback port nobody listens on (bound, read, released)."""
    with socket.socket(socket.AF_INET, kind) as s:
        s.bind((LOOP, 0))
        port: int = s.getsockname()[1]
    return port


def _status(code: int) -> Callable[[bytes], bytes]:
    return lambda _req: f"HTTP/1.1 {code} X\r\nContent-Length: 0\r\n\r\n".encode()


def test_tcp_probe_succeeds_on_a_listener_and_fails_on_a_closed_port(servers) -> None:  # type: ignore[no-untyped-def]
    srv = servers(socket.SOCK_STREAM, lambda _r: b"")
    ok = health.probe_tcp(LOOP, srv.port, 0.5)
    assert ok.ok and ok.detail == "connected"
    bad = health.probe_tcp(LOOP, _closed_port(socket.SOCK_STREAM), 0.5)
    assert not bad.ok
    assert bad.detail.endswith("connection refused")


@pytest.mark.parametrize("code, ok", [(200, True), (204, True), (302, True), (404, False), (500, False)])
def test_http_probe_accepts_2xx_and_3xx_only(servers, code: int, ok: bool) -> None:  # type: ignore[no-untyped-def]
    seen: list[bytes] = []

    def reply(req: bytes) -> bytes:
        seen.append(req)
        return _status(code)(req)

    srv = servers(socket.SOCK_STREAM, reply)
    out = health.probe_http(LOOP, srv.port, "/healthz", 0.5)
    assert out.ok is ok, out.detail
    assert seen and seen[0].startswith(b"GET /healthz HTTP/1.0\r\n")
    if not ok:
        assert f"status {code} (expected 2xx or 3xx)" in out.detail


def test_http_probe_fails_on_garbage_and_on_silence(servers) -> None:  # type: ignore[no-untyped-def]
    garbage = servers(socket.SOCK_STREAM, lambda _r: b"SSH-2.0-OpenSSH\r\n")
    out = health.probe_http(LOOP, garbage.port, "/", 0.5)
    assert not out.ok and "not an HTTP status line" in out.detail
    silent = servers(socket.SOCK_STREAM, lambda _r: None)
    t0 = time.monotonic()
    out = health.probe_http(LOOP, silent.port, "/", 0.3)
    took = time.monotonic() - t0
    assert not out.ok and out.detail.endswith("no answer within 0.3 s")
    assert took >= 0.25, took  # its own timeout, not less (the detail says so; no upper bound on a shared CPU)


def test_udp_probe_needs_a_reply(servers) -> None:  # type: ignore[no-untyped-def]
    echo = servers(socket.SOCK_DGRAM, lambda data: data)
    assert health.probe_udp(LOOP, echo.port, 0.5).ok
    refused = health.probe_udp(LOOP, _closed_port(socket.SOCK_DGRAM), 0.5)
    assert not refused.ok and refused.detail.endswith("port unreachable")
    silent = servers(socket.SOCK_DGRAM, lambda _d: None)
    out = health.probe_udp(LOOP, silent.port, 0.2)
    assert not out.ok and out.detail.endswith("no answer within 0.2 s")


def _check(port: int, **kw: object) -> cfg.HealthCheck:
    args: dict[str, object] = {"type": "tcp", "interval_s": 0.1, "timeout_s": 0.1, "rise": 2, "fall": 3}
    args.update(kw)
    return cfg.HealthCheck(port=port, **args)  # type: ignore[arg-type]


POLL_S = 20.0  # a deadline for state that takes a few probe intervals: generous, as the CPUs are shared


class _Numbered:
    """A probe function that runs the real probe and numbers each outcome in its detail ("#7 ...").

    A Transition carries the detail of the probe that caused it, so the test reads exactly which
    probe turned a real down or up, with no clock involved."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.outcomes: list[health.Outcome] = []

    def __call__(self, target: health.Target) -> health.Outcome:
        out = health.probe(target)
        with self._lock:
            self.outcomes.append(out)
            return replace(out, detail=f"#{len(self.outcomes)} {out.detail}")

    @staticmethod
    def number(detail: str) -> int:
        return int(detail.split(" ", 1)[0].removeprefix("#"))


def test_monitor_turns_down_after_fall_and_up_after_rise() -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((LOOP, 0))
    port = listener.getsockname()[1]
    listener.listen(64)
    changes: list[tuple[float, health.Transition]] = []
    probes = _Numbered()
    mon = health.Monitor(lambda t: changes.append((time.monotonic(), t)), probe_fn=probes)
    check = _check(port)
    target = health.Target("198.51.100.100:80/tcp", LOOP, check)
    try:
        mon.set_targets([target])
        mon.start()
        poll(POLL_S, lambda: mon.snapshot()[0].checks_ok >= 3, "three good probes")
        assert changes == [] and mon.down() == {}
        t_kill = time.monotonic()
        listener.close()
        poll(POLL_S, lambda: bool(changes), "a down transition")
        took, ch = changes[0][0] - t_kill, changes[0][1]
        assert ch.healthy is False and ch.target == target and "connection refused" in ch.detail
        # Down with exactly the fall-th failed probe in a row, counted from the outcomes, not the clock.
        n = _Numbered.number(ch.detail)
        run = probes.outcomes[:n]
        failed_in_a_row = len(run) - max((i + 1 for i, o in enumerate(run) if o.ok), default=0)
        assert failed_in_a_row == check.fall, [o.detail for o in run]
        # fall = 3 probes at 0.1 s: the third failure cannot come before 2 intervals (the first may be immediate)
        assert took >= 0.15, took
        assert mon.down() == {"198.51.100.100:80/tcp": [LOOP]}
        st = mon.snapshot()[0]
        assert st.failures >= 3 and not st.healthy
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOP, port))
        listener.listen(64)
        t_up = time.monotonic()
        poll(POLL_S, lambda: len(changes) == 2, "an up transition")
        assert changes[1][1].healthy is True
        # Up with exactly the rise-th good probe in a row.
        n = _Numbered.number(changes[1][1].detail)
        run = probes.outcomes[:n]
        ok_in_a_row = len(run) - max((i + 1 for i, o in enumerate(run) if not o.ok), default=0)
        assert ok_in_a_row == check.rise, [o.detail for o in run]
        assert changes[1][0] - t_up >= 0.05
        assert mon.down() == {}
        assert len(changes) == 2  # no flapping while the server stays up
    finally:
        mon.stop()
        listener.close()


def test_monitor_keeps_state_across_set_targets_and_starts_listed_down_reals_down() -> None:
    port = _closed_port(socket.SOCK_STREAM)
    changes: list[health.Transition] = []
    mon = health.Monitor(changes.append)
    a = health.Target("v", "127.0.0.2", _check(port, fall=1))
    b = health.Target("v", "127.0.0.3", _check(port, fall=1))
    try:
        mon.set_targets([a, b], down={("v", "127.0.0.3")})
        assert mon.down() == {"v": ["127.0.0.3"]}
        mon.start()
        poll(POLL_S, lambda: mon.down() == {"v": ["127.0.0.2", "127.0.0.3"]}, "a down")
        assert [(c.target.address, c.healthy) for c in changes] == [("127.0.0.2", False)]
        mon.set_targets([a])  # b leaves; a keeps its down state
        assert mon.down() == {"v": ["127.0.0.2"]}
    finally:
        mon.stop()


def test_monitor_probes_concurrently(servers) -> None:  # type: ignore[no-untyped-def]
    silent = servers(socket.SOCK_STREAM, lambda _r: None)
    chk = _check(silent.port, type="http", interval_s=0.4, timeout_s=0.3, fall=100)
    targets = [health.Target(f"v{i}", LOOP, chk) for i in range(12)]
    # Each probe waits at a barrier for all 12 before probing: it only opens if the monitor runs
    # the 12 probes at the same time (serially the first would wait alone and break it).
    together = threading.Barrier(len(targets), timeout=POLL_S)

    def probe(target: health.Target) -> health.Outcome:
        together.wait()
        return health.probe(target)

    mon = health.Monitor(lambda _t: None, workers=16, probe_fn=probe)
    try:
        mon.set_targets(targets)
        mon.start()
        poll(POLL_S, lambda: all(s.checks_failed >= 1 for s in mon.snapshot()), "one round")
        assert not together.broken, "the monitor did not run the 12 probes at once"
        assert all("no answer within 0.3 s" in s.last_detail for s in mon.snapshot())
    finally:
        together.abort()
        mon.stop()


def test_tunnel_checks_get_marks_and_4in6_is_refused() -> None:
    text = ('[[vips]]\naddress = "198.51.100.100"\nport = 80\nproto = "tcp"\n'
            'reals = [{ address = "203.0.113.18" }, { address = "REAL2" }]\n'
            '[vips.healthcheck]\nvia = "tunnel"\n')
    conf = cfg.loads(text.replace("REAL2", "203.0.113.34"), "lb.toml")
    health.require_supported(conf, "lb.toml")
    assert health.uses_tunnel(conf)
    marks = {("203.0.113.18", "ipip"): 0x4C480001, ("203.0.113.34", "ipip"): 0x4C480002}
    targets = health.targets_of(conf, lambda address, encap: marks[(address, encap)])
    assert [(t.key, t.vip_address, t.mark, t.encap) for t in targets] == [
        (("198.51.100.100:80/tcp", "203.0.113.18"), "198.51.100.100", 0x4C480001, "ipip"),
        (("198.51.100.100:80/tcp", "203.0.113.34"), "198.51.100.100", 0x4C480002, "ipip")]
    gue = cfg.loads(text.replace("REAL2", "203.0.113.34").replace('proto = "tcp"\n', 'proto = "tcp"\nencap = "gue0"\n'),
                    "lb.toml")
    asked: list[tuple[str, str]] = []
    health.targets_of(gue, lambda address, encap: asked.append((address, encap)) or 1)
    assert asked == [("203.0.113.18", "gue0"), ("203.0.113.34", "gue0")], "the VIP's encap picks the mark"
    with pytest.raises(ValueError, match="needs marks"):
        health.targets_of(conf)
    mixed = cfg.loads(text.replace("REAL2", "2001:db8::5"), "lb.toml")
    with pytest.raises(ConfigError) as err:
        health.require_supported(mixed, "lb.toml")
    assert str(err.value) == ('lb.toml: vips[0].healthcheck.via = "tunnel" cannot probe vips[0].reals[1] '
                              "(2001:db8::5) of 198.51.100.100:80/tcp: tunnel probes keep the VIP's family "
                              '(4in4, 6in6, GUE over the same family); use via = "direct" for this VIP')
    direct = cfg.loads(text.replace("REAL2", "2001:db8::5").replace('via = "tunnel"', ""), "lb.toml")
    health.require_supported(direct, "lb.toml")
    assert not health.uses_tunnel(direct)
    assert [t.mark for t in health.targets_of(direct)] == [0, 0]


@pytest.fixture
def hc_encap() -> Iterator[tuple[Program, Map]]:
    """Name: hc_encap. Scope: function. Depends: root, build/bpf/healthcheck.o.

    The tunnel health-check program loaded (not attached) with its mark map, closed afterwards::

        def test_x(hc_encap):
            prog, marks = hc_encap
            assert prog.test_run(frame, ctx=_mark_ctx(0)).retval == TC_ACT_OK
    """
    path = REPO / "build" / "bpf" / "healthcheck.o"
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make bpf` first")
    verify_abi(str(path))
    obj = BpfObject(str(path))
    try:
        obj.load()
        yield obj.program("hc_encap"), obj.map("lb_hc_reals")
    finally:
        obj.close()


TC_ACT_UNSPEC, TC_ACT_OK, TC_ACT_SHOT = -1, 0, 2


def _mark_ctx(mark: int) -> bytes:
    """The head of a struct __sk_buff for a test run: len and pkt_type zero, then mark."""
    return bytes(8) + mark.to_bytes(4, "little")


def test_hc_encap_wraps_marked_probes_in_ipip_to_their_real(hc_encap: tuple[Program, Map]) -> None:
    prog, marks = hc_encap
    marks.update((0x4C480001).to_bytes(4, "little"), hc_target_bytes("203.0.113.18", "ipip", 6080))
    marks.update((0x4C480002).to_bytes(4, "little"), hc_target_bytes("2001:db8:e1::2", "ipip", 6080))
    eth = Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:01")
    probe4 = eth / IP(src="192.0.2.1", dst="198.51.100.100", tos=0x10, flags="DF") / TCP(sport=40000, dport=80)
    raw = bytes(probe4)

    assert prog.test_run(raw, ctx=_mark_ctx(0)).data == raw  # unmarked traffic is untouched
    untouched = prog.test_run(raw, ctx=_mark_ctx(7))  # a mark we did not write is someone else's
    assert (untouched.retval, untouched.data) == (TC_ACT_UNSPEC, raw)  # the next program decides

    res = prog.test_run(raw, ctx=_mark_ctx(0x4C480001))
    assert res.retval == TC_ACT_OK
    out = Ether(res.data)
    outer = out[IP]
    assert (outer.src, outer.dst, outer.proto, outer.ttl, outer.tos) == \
        ("192.0.2.1", "203.0.113.18", 4, 64, 0x10)
    assert outer.flags == "DF" and outer.len == len(raw) - 14 + 20
    words = sum(int.from_bytes(res.data[14 + i: 16 + i], "big") for i in range(0, 20, 2))
    assert (words & 0xFFFF) + (words >> 16) == 0xFFFF  # a valid IPv4 header checksum
    assert bytes(outer.payload) == raw[14:]  # the probe itself, unchanged, inside
    assert out.dst == "02:00:00:00:00:01"

    probe6 = eth / IPv6(src="2001:db8:1b::1", dst="2001:db8:100::100", tc=0x20, fl=7) / TCP(dport=80)
    raw6 = bytes(probe6)
    res6 = prog.test_run(raw6, ctx=_mark_ctx(0x4C480002))
    assert res6.retval == TC_ACT_OK
    outer6 = Ether(res6.data)[IPv6]
    assert (outer6.src, outer6.dst, outer6.nh, outer6.hlim, outer6.tc, outer6.fl) == \
        ("2001:db8:1b::1", "2001:db8:e1::2", 41, 64, 0x20, 7)
    assert outer6.plen == len(raw6) - 14 and bytes(outer6.payload) == raw6[14:]

    # A marked probe that cannot be wrapped is dropped, never sent to the VIP bare.
    assert prog.test_run(raw6, ctx=_mark_ctx(0x4C480001)).retval == TC_ACT_SHOT
    assert prog.test_run(raw, ctx=_mark_ctx(0x4C480002)).retval == TC_ACT_SHOT


@pytest.mark.parametrize("encap", ["gue1", "gue0"])
def test_hc_encap_wraps_probes_of_gue_vips_in_gue(hc_encap: tuple[Program, Map], encap: str) -> None:
    """GUE over IPv4 (UDP checksum 0) and IPv6 (checksum computed), to the configured port, variant 0 with
    its 4-byte header naming the inner protocol; the probe byte-identical inside."""
    prog, marks = hc_encap
    marks.update((0x4C480011).to_bytes(4, "little"), hc_target_bytes("203.0.113.18", encap, 7000))
    marks.update((0x4C480012).to_bytes(4, "little"), hc_target_bytes("2001:db8:e1::2", encap, 7000))
    eth = Ether(src="02:00:00:00:00:0a", dst="02:00:00:00:00:01")
    gue_len = 4 if encap == "gue0" else 0
    for mark, probe, inner_proto in (
            (0x4C480011, eth / IP(src="192.0.2.1", dst="198.51.100.100", flags="DF") / TCP(sport=40000, dport=80), 4),
            (0x4C480012, eth / IPv6(src="2001:db8:1b::1", dst="2001:db8:100::100") / TCP(sport=40001, dport=80)
             / (b"GET /health HTTP/1.0\r\n" * 9), 41)):
        raw = bytes(probe)
        res = prog.test_run(raw, ctx=_mark_ctx(mark))
        assert res.retval == TC_ACT_OK, f"{encap} probe of family {inner_proto} dropped"
        out = Ether(res.data)
        udp = out[UDP]
        assert udp.dport == 7000 and 0xC000 <= udp.sport <= 0xFFFF
        assert udp.len == 8 + gue_len + len(raw) - 14
        payload = bytes(udp.payload)
        if encap == "gue0":
            assert payload[:4] == bytes([0, inner_proto, 0, 0]), payload[:4].hex()
        assert payload[gue_len:] == raw[14:], "the probe must travel unchanged inside"
        if inner_proto == 4:
            assert (out[IP].dst, out[IP].proto, out[IP].src) == ("203.0.113.18", 17, "192.0.2.1")
            assert udp.chksum == 0  # allowed over IPv4 (RFC 768), as the balancer does
        else:
            assert (out[IPv6].dst, out[IPv6].nh, out[IPv6].src) == ("2001:db8:e1::2", 17, "2001:db8:1b::1")
            assert out[IPv6].plen == udp.len
            fresh = Ether(res.data)
            del fresh[UDP].chksum  # scapy computes it again over the pseudo-header and the datagram
            assert udp.chksum == Ether(bytes(fresh))[UDP].chksum, "a wrong IPv6 UDP checksum"
