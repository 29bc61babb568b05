"""The generator's template rewriting, checked frame by frame with BPF_PROG_TEST_RUN (repeat = 1), and its pacing.

Each run of bpf/trafficgen.bpf.c must write the template's first 64 bytes back (live-frames pages
come back with whatever the device under test left in them), step to the next flow of its per-CPU
sequence (source address base + f % addresses, source port base + f // addresses) and leave every
checksum valid, in IPv4 and IPv6.
"""

from __future__ import annotations

import ipaddress
import os
import time
from pathlib import Path

import pytest

from lab.bench.gen.base import IMIX, Endpoints, GeneratorError, build_frame
from lab.bench.gen.xdplive import OBJECT, TEMPLATE_LEN, Pacing, Stream, TrafficgenProgram, pace

EP = Endpoints(src_mac="02:00:00:00:0b:01", dst_mac="02:00:00:00:0b:02")
CPU_SPREAD = 0x9E3779B1  # TG_CPU_SPREAD in trafficgen.bpf.c: where each CPU's sequence starts
XDP_TX, XDP_REDIRECT = 3, 4


def _needs_bpf() -> None:
    if os.geteuid() != 0:
        pytest.skip("loading BPF programs needs root: run as root, e.g. sudo make test")
    if not Path(OBJECT).is_file():
        pytest.skip(f"{OBJECT} is missing: run make bpf")


def program(size: int, family: int, flows: int, addrs: int, egress: int = 0) -> TrafficgenProgram:
    _needs_bpf()
    return TrafficgenProgram(build_frame(size, family, EP), family, flows, addrs,  # type: ignore[arg-type]
                             egress_ifindex=egress)


def expected(family: int, flow: int, addrs: int) -> tuple[str, int]:
    base = ipaddress.ip_address(EP.src4 if family == 4 else EP.src6)
    return str(base + flow % addrs), EP.sport + flow // addrs


def parse(frame: bytes, family: int) -> tuple[str, int]:
    """(source address, source port) after checking that every checksum is valid."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Ether

    pkt = Ether(frame)
    rebuilt = pkt.copy()
    del rebuilt[UDP].chksum
    if family == 4:
        del rebuilt[IP].chksum
    assert bytes(rebuilt) == frame, "a checksum is wrong:\n" + pkt.show(dump=True)
    ip = pkt[IP] if family == 4 else pkt[IPv6]
    return str(ip.src), int(pkt[UDP].sport)


@pytest.mark.parametrize("family", [4, 6])
@pytest.mark.parametrize(("flows", "addrs"), [(40, 16), (7, 7), (1, 1), (300, 16)])
def test_successive_frames_walk_the_flows_with_valid_checksums(one_cpu: int, family: int, flows: int,
                                                               addrs: int) -> None:
    prog = program(128, family, flows, addrs)
    try:
        first = (one_cpu * CPU_SPREAD) % flows
        for k in range(2 * flows + 3):
            action, out = prog.run_once()
            assert action == XDP_TX
            assert len(out) == 128
            assert parse(out, family) == expected(family, (first + k) % flows, prog.src_addrs)
            assert out[TEMPLATE_LEN:] == prog.frame[TEMPLATE_LEN:], "the payload must not be written"
    finally:
        prog.close()


@pytest.mark.parametrize("family", [4, 6])
def test_a_recycled_page_with_a_devices_leftovers_is_rewritten(one_cpu: int, family: int) -> None:
    prog = program(64, family, flows=16, addrs=16)
    try:
        first = (one_cpu * CPU_SPREAD) % 16
        # What a balancer leaves: an outer header written over the Ethernet/IP header.
        dirty = bytes(range(0xA0, 0xA0 + 40)) + prog.frame[40:]
        out = prog.program.test_run(dirty).data
        assert out[:12] == prog.frame[:12]  # MACs back from the template
        assert parse(out, family) == expected(family, first, 16)
        clean_next = prog.run_once()[1]
        assert parse(clean_next, family) == expected(family, (first + 1) % 16, 16)
    finally:
        prog.close()


def test_syn_flood_frames_are_new_tcp_syns_with_valid_checksums(one_cpu: int) -> None:
    """l4 = "tcp-syn": every frame a TCP SYN (MSS and SACK-permitted options) of the next flow, its TCP
    checksum (offset 16, where UDP's is at 6) updated with the address and port."""
    from scapy.layers.inet import IP, TCP
    from scapy.layers.l2 import Ether

    _needs_bpf()
    syn = Endpoints(src_mac=EP.src_mac, dst_mac=EP.dst_mac, l4="tcp-syn")
    family = 4
    prog = TrafficgenProgram(build_frame(64, family, syn), family, 5000, 50)
    try:
        first = (one_cpu * CPU_SPREAD) % 5000
        for k in range(60):
            action, out = prog.run_once()
            pkt = Ether(out)
            rebuilt = pkt.copy()
            del rebuilt[TCP].chksum
            if family == 4:
                del rebuilt[IP].chksum
            assert action == XDP_TX and bytes(rebuilt) == out, "a checksum is wrong:\n" + pkt.show(dump=True)
            ip = pkt[IP]
            assert pkt[TCP].flags == "S" and [o[0] for o in pkt[TCP].options][:2] == ["MSS", "NOP"]
            assert (str(ip.src), int(pkt[TCP].sport)) == expected(family, (first + k) % 5000, 50)
    finally:
        prog.close()


def test_tcp_over_ipv6_is_refused_its_checksum_lies_beyond_the_template() -> None:
    syn = Endpoints(src_mac=EP.src_mac, dst_mac=EP.dst_mac, l4="tcp-syn")
    with pytest.raises(GeneratorError, match="checksum beyond the 64 bytes"):
        TrafficgenProgram(build_frame(82, 6, syn), 6, 10, 10)


def test_imix_sizes_and_1518_byte_frames_are_rewritten_too(one_cpu: int) -> None:
    for size, _share in IMIX:
        prog = program(size, 4, flows=4, addrs=2)
        try:
            action, out = prog.run_once()
            assert action == XDP_TX and len(out) == size
            parse(out, 4)
        finally:
            prog.close()


def test_redirect_mode_returns_xdp_redirect(one_cpu: int) -> None:
    prog = program(64, 4, flows=4, addrs=4, egress=1)  # loopback's ifindex: the run does not transmit
    try:
        assert prog.run_once()[0] == XDP_REDIRECT
    finally:
        prog.close()


def test_frames_shorter_than_the_template_are_refused() -> None:
    with pytest.raises(GeneratorError, match="first 64 bytes"):
        TrafficgenProgram(build_frame(62, 6, EP), 6, 1)
    with pytest.raises(GeneratorError, match="too short for its headers"):
        build_frame(60, 6, EP)


def test_too_many_flows_for_the_port_range_are_refused() -> None:
    with pytest.raises(GeneratorError, match="source ports up to"):
        TrafficgenProgram(build_frame(64, 4, EP), 4, flows=200_000, src_addrs=1)


class _Recorder:
    """A stand-in for a loaded program: records how many frames each call asked for."""

    def __init__(self, delay_per_frame: float = 0.0) -> None:
        self.calls: list[int] = []
        self.delay = delay_per_frame

    def send(self, frames: int, ctx: bytes, batch_size: int) -> None:
        self.calls.append(frames)
        if self.delay:
            deadline = time.monotonic() + frames * self.delay
            while time.monotonic() < deadline:  # a busy device, not a wait for state
                pass


def test_pacing_mixes_imix_in_its_proportion_and_holds_the_rate() -> None:
    senders = [_Recorder() for _ in IMIX]
    streams = [Stream(s, b"", share) for s, (_, share) in zip(senders, IMIX, strict=True)]
    started = time.monotonic()
    sent = pace(streams, total=48_000, rate=200_000, duration_s=2.0, how=Pacing(0.002, 64, 64))
    took = time.monotonic() - started
    assert sent == 48_000
    assert [sum(s.calls) for s in senders] == pytest.approx([28_000, 16_000, 4_000], rel=0.02)
    assert 0.2 <= took <= 1.5  # 48 000 frames at 200 000/s take 0.24 s: paced, not blasted


def test_pacing_stops_at_the_deadline_when_the_rate_cannot_be_sustained() -> None:
    slow = _Recorder(delay_per_frame=1e-5)  # a device that manages 100 000 frames/s
    sent = pace([Stream(slow, b"", 1)], total=1_000_000, rate=1e6, duration_s=0.2, how=Pacing(0.002, 64, 64))
    assert 1_000 <= sent <= 40_000  # ~20 000 in 0.2 s, fewer when other work takes the CPU
    assert sent == sum(slow.calls)


def test_trial_loss_counts_a_shortfall_beyond_the_tolerance_as_lost() -> None:
    from lab.bench.gen.base import TrialResult

    held = TrialResult(offered=10_000, sent=9_950, received=9_950, duration=1.0)
    assert held.sustained and held.loss == 0.0
    lossy = TrialResult(offered=10_000, sent=10_000, received=9_900, duration=1.0)
    assert lossy.loss == pytest.approx(0.01)
    short = TrialResult(offered=10_000, sent=5_000, received=5_000, duration=1.0)
    assert not short.sustained and short.loss == pytest.approx(0.5)
    assert TrialResult(offered=0, sent=0, received=0, duration=0.0).loss == 0.0
