"""The software traffic generator: UDP flows sent by the kernel's XDP live-frames test mode, paced.

BPF_PROG_TEST_RUN with BPF_F_TEST_XDP_LIVE_FRAMES runs bpf/trafficgen.bpf.c once per frame
(repeat = frame count) and transmits what it returns out of the interface named in the context's
ingress_ifindex, which resolves in the calling thread's network namespace. Each worker thread
enters the generator's namespace, pins itself to one CPU and sends chunks of a few milliseconds'
worth of frames, waiting between chunks to hold its share of the rate. IMIX sends the three sizes
through three loaded programs, interleaved in the 28:16:4 proportion.

The frames come back (or not) to a counter the caller supplies (`sink`): received = the counter's
increase after the trial, read once it has stopped moving.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from balancer.btf import read_contract
from balancer.libbpf import BPF_F_TEST_XDP_LIVE_FRAMES, BpfObject, Link, Program
from lab.bench.gen.base import (
    Endpoints,
    Family,
    FrameSpec,
    Generator,
    GeneratorError,
    TrialResult,
    build_frame,
    check_trial,
    frame_mix,
)
from lab.nsexec import entered
from lab.poll import poll

OBJECT = Path(__file__).resolve().parents[3] / "build" / "bpf" / "trafficgen.o"
PROGRAM = "trafficgen_xdp"
TEMPLATE_LEN = 64
MAX_BATCH = 256  # the kernel's limit for live frames (TEST_XDP_MAX_BATCH)
# A test-run call with repeat > 1 puts the program into the kernel's XDP dispatcher and takes it
# out again, each time waiting for an RCU grace period (10-30 ms measured here) unless the program
# is already there because it is attached to some interface. So the generator "parks" every
# program on an idle interface of its namespace when given one, and sends 2 ms chunks; without
# one it sends 50 ms chunks (calls of 32768 frames at least) from two threads per CPU, so that one
# thread sends while the other waits.
PARKED_CHUNK_S = 0.002
UNPARKED_CHUNK_S = 0.05
UNPARKED_MIN_CHUNK = 32768
MAX_CHUNK = 1 << 20
SETTLE_POLL_S = 0.002
SETTLE_QUIET_POLLS = 5
SETTLE_DEADLINE_S = 1.0


def _xdp_md(ifindex: int, frame_len: int) -> bytes:
    """struct xdp_md (UAPI): data, data_end, data_meta, ingress_ifindex, rx_queue_index, egress_ifindex."""
    return struct.pack("=6I", 0, frame_len, 0, ifindex, 0, 0)


class TrafficgenProgram:
    """One loaded trafficgen program: its template frame, its flows, and XDP_TX or a redirect to egress."""

    def __init__(self, frame: bytes, family: Family, flows: int, src_addrs: int = 16,
                 egress_ifindex: int = 0, object_path: str | Path = OBJECT) -> None:
        if len(frame) < TEMPLATE_LEN:
            raise GeneratorError(f"the generator rewrites the first {TEMPLATE_LEN} bytes of every frame; "
                                 f"a {len(frame)}-byte frame is too short")
        if not Path(object_path).is_file():
            raise GeneratorError(f"BPF object {object_path} does not exist; run `make bpf`")
        l4_check = 16 if frame[14 + (9 if family == 4 else 6)] == socket.IPPROTO_TCP else 6
        if 14 + (20 if family == 4 else 40) + l4_check + 2 > TEMPLATE_LEN:
            raise GeneratorError(f"an IPv{family} TCP frame has its checksum beyond the {TEMPLATE_LEN} bytes "
                                 "the generator rewrites from its template: send TCP over IPv4")
        addrs = max(1, min(src_addrs, flows))
        sport = struct.unpack_from("!H", frame, 14 + (20 if family == 4 else 40))[0]
        if sport + (flows - 1) // addrs > 0xFFFF:
            raise GeneratorError(f"{flows} flows over {addrs} source addresses need source ports up to "
                                 f"{sport + (flows - 1) // addrs}; use fewer flows or more addresses")
        self.frame = frame
        self.family = family
        self.flows = flows
        self.src_addrs = addrs
        offsets = {v.name: (v.offset, v.size) for v in read_contract(object_path).rodata}
        self._obj = BpfObject(str(object_path))
        try:
            image = self._obj.rodata()
            values = {"cfg_family": family, "cfg_flows": flows, "cfg_src_addrs": addrs,
                      "cfg_redirect": 1 if egress_ifindex else 0, "cfg_l4_check": l4_check}
            for name, value in values.items():
                off, size = offsets[name]
                image[off: off + size] = value.to_bytes(size, "little")
            off, size = offsets["cfg_template"]
            image[off: off + size] = frame[:size]
            self._obj.set_rodata(bytes(image))
            self._obj.load()
            self.program: Program = self._obj.program(PROGRAM)
            if egress_ifindex:
                self._obj.map("tg_egress").update(b"\0" * 4, egress_ifindex.to_bytes(4, "little"))
        except BaseException:
            self._obj.close()
            raise

    def run_once(self) -> tuple[int, bytes]:
        """One ordinary test run (no live frames): (XDP action, the frame as it would be sent)."""
        res = self.program.test_run(self.frame)
        return res.retval, res.data

    def send(self, frames: int, ctx: bytes, batch_size: int) -> None:
        """Send `frames` live frames out of the interface named in ctx (this thread's namespace)."""
        self.program.test_run(self.frame, repeat=frames, ctx=ctx, flags=BPF_F_TEST_XDP_LIVE_FRAMES,
                              batch_size=batch_size)

    def close(self) -> None:
        self._obj.close()


class Sender(Protocol):
    """What pace() drives: a loaded generator program (or a stand-in in tests)."""

    def send(self, frames: int, ctx: bytes, batch_size: int) -> None: ...


@dataclass
class Stream:
    """One frame size of a trial on one thread: what sends it, its context, its share of the mix."""

    program: Sender
    ctx: bytes
    share: int
    sent: int = 0


@dataclass(frozen=True)
class Pacing:
    """How a thread cuts its frames into test-run calls."""

    chunk_s: float
    min_chunk: int
    batch_size: int


def pace(streams: Sequence[Stream], total: int, rate: float, duration_s: float, how: Pacing) -> int:
    """Send `total` frames at `rate` until done or `duration_s` is over; returns frames sent.

    A chunk is `chunk_s` of frames at the asked rate, but never more than this thread managed to
    send in `chunk_s` so far, so the last chunk ends near the deadline. The stream furthest behind
    its share of the mix goes next. The deadline has a grace of two chunks (or 2 %) so that a late
    wake-up does not count as loss.
    """
    deadline = duration_s + max(2 * how.chunk_s, 0.02 * duration_s)
    chunk = max(how.batch_size, min(MAX_CHUNK, int(rate * how.chunk_s)))
    floor = min(chunk, how.min_chunk)
    cap = min(chunk, 2 * floor)
    shares = sum(s.share for s in streams)
    sent = 0
    t0 = time.monotonic()
    while sent < total:
        elapsed = time.monotonic() - t0
        if elapsed >= deadline:
            break  # the rate was not sustained: what is left counts as lost
        ahead = sent - rate * elapsed
        if ahead >= cap:
            time.sleep((ahead - cap + 1) / rate)  # pacing the send rate, not synchronising
            continue
        n = min(cap, total - sent)
        stream = min(streams, key=lambda s: s.sent * shares - sent * s.share)
        t_call = time.monotonic()
        stream.program.send(n, stream.ctx, how.batch_size)
        took = time.monotonic() - t_call
        stream.sent += n
        sent += n
        cap = max(floor, min(chunk, int(n / max(took, 1e-6) * how.chunk_s)))
    return sent


@dataclass(frozen=True)
class ChainCost:
    """What XdpLiveGenerator.chain_cost measured: frames sent and counted by the sink, CPU and wall seconds."""

    frames: int
    received: int
    cpu_s: float
    wall_s: float
    warm: int = 0  # frames sent before the measured ones (page pool, caches, sessions)

    @property
    def cpu_ns_per_frame(self) -> float:
        return self.cpu_s / self.frames * 1e9

    @property
    def delivered(self) -> float:
        return self.received / self.frames


class XdpLiveGenerator(Generator):
    """Live-frames generator out of `ifname` in netns `netns`; `sink()` returns the receive counter's total.

    `cpus` are the CPUs the worker threads pin to (`threads_per_cpu` each; default all this process
    may use). `park_ifnames` are idle interfaces in `netns` (veths left down) where the programs
    in use are attached, one each, so that test runs skip the XDP dispatcher update (see
    PARKED_CHUNK_S); IMIX uses three at once. With `egress_ifname` the program redirects every frame
    through its devmap to that interface instead of XDP_TX out of `ifname`.
    Loaded programs are cached per (frame size, flows, family) until close().
    """

    name = "xdp-live"

    def __init__(self, netns: str, ifname: str, endpoints: Endpoints, sink: Callable[[], int],
                 cpus: Sequence[int] | None = None, threads_per_cpu: int | None = None,
                 batch_size: int = 64, src_addrs: int = 16, park_ifnames: Sequence[str] = (),
                 egress_ifname: str | None = None, object_path: str | Path = OBJECT) -> None:
        if not 1 <= batch_size <= MAX_BATCH:
            raise GeneratorError(f"batch size must be 1..{MAX_BATCH} but got {batch_size}")
        self.netns = netns
        self.ifname = ifname
        self.endpoints = endpoints
        self.sink = sink
        self.cpus = list(cpus) if cpus is not None else sorted(os.sched_getaffinity(0))
        if threads_per_cpu is None:
            threads_per_cpu = 1 if park_ifnames else 2
        if not self.cpus or threads_per_cpu < 1:
            raise GeneratorError(f"the generator needs at least one CPU and one thread per CPU but got "
                                 f"cpus={self.cpus}, threads_per_cpu={threads_per_cpu}")
        self.threads = [cpu for cpu in self.cpus for _ in range(threads_per_cpu)]
        self.batch_size = batch_size
        self.src_addrs = src_addrs
        self.object_path = object_path
        self._programs: dict[tuple[int, int, int], TrafficgenProgram] = {}
        self.ifindex = self._ifindex(ifname)
        self.egress_ifindex = self._ifindex(egress_ifname) if egress_ifname else 0
        self._spots = [(name, self._ifindex(name)) for name in park_ifnames]
        self._parked: dict[int, tuple[int, Link]] = {}  # id(program) -> (spot, link), oldest first
        self.chunk_s = PARKED_CHUNK_S if park_ifnames else UNPARKED_CHUNK_S
        self.min_chunk = batch_size if park_ifnames else UNPARKED_MIN_CHUNK

    def _ifindex(self, ifname: str) -> int:
        with entered(self.netns):
            try:
                return socket.if_nametoindex(ifname)
            except OSError as exc:
                raise GeneratorError(f"generator interface '{ifname}' does not exist in netns "
                                     f"'{self.netns}'; build the topology first") from exc

    def _program(self, size: int, flows: int, family: Family) -> TrafficgenProgram:
        key = (size, flows, family)
        if key not in self._programs:
            frame = build_frame(size, family, self.endpoints)
            with entered(self.netns):  # a devmap's ifindex resolves in the updater's namespace
                self._programs[key] = TrafficgenProgram(frame, family, flows, self.src_addrs,
                                                        self.egress_ifindex, self.object_path)
        return self._programs[key]

    def _park(self, prog: TrafficgenProgram) -> None:
        """Attach prog to a free parking interface, unparking the longest-parked program if none is free."""
        if not self._spots or id(prog) in self._parked:
            return
        used = {spot for spot, _ in self._parked.values()}
        free = [i for i in range(len(self._spots)) if i not in used]
        if free:
            spot = free[0]
        else:
            oldest = next(iter(self._parked))
            spot, link = self._parked.pop(oldest)
            link.close()
        name, index = self._spots[spot]
        with entered(self.netns):
            self._parked[id(prog)] = (spot, prog.program.attach_xdp(index, "native", name))

    def run(self, rate_pps: float, duration_s: float, frame_size: FrameSpec, flows: int,
            family: Family) -> TrialResult:
        check_trial(rate_pps, duration_s, flows, family)
        mix = frame_mix(frame_size)
        programs = [(self._program(size, flows, family), share) for size, share in mix]
        for prog, _ in programs:
            self._park(prog)
        nthreads = len(self.threads)
        offered = round(rate_pps * duration_s)
        per_thread = [offered // nthreads + (1 if i < offered % nthreads else 0) for i in range(nthreads)]
        sent = [0] * nthreads
        waited = [0.0] * nthreads
        errors: list[BaseException] = []
        start = threading.Barrier(nthreads + 1)
        how = Pacing(self.chunk_s, self.min_chunk, self.batch_size)
        before = self.sink()

        def worker(i: int) -> None:
            try:
                streams = [Stream(p, _xdp_md(self.ifindex, len(p.frame)), share) for p, share in programs]
                with entered(self.netns):
                    os.sched_setaffinity(0, {self.threads[i]})
                    start.wait()
                    w0 = run_queue_wait()
                    sent[i] = pace(streams, per_thread[i], rate_pps / nthreads, duration_s, how)
                    waited[i] = run_queue_wait() - w0
            except BaseException as exc:  # handed to the caller below
                errors.append(exc)
                start.abort()

        threads = [threading.Thread(target=worker, args=(i,), name=f"xdplive-{i}") for i in range(nthreads)]
        try:
            for t in threads:
                t.start()
            with contextlib.suppress(threading.BrokenBarrierError):
                start.wait()
            t0 = time.monotonic()
            for t in threads:
                t.join()
        except BaseException:
            # An interrupt here would leave workers at the barrier for ever, and exit waits for them.
            start.abort()
            for t in threads:
                if t.is_alive():
                    t.join()
            raise
        elapsed = time.monotonic() - t0
        if errors:
            raise errors[0]
        received = self._settled() - before
        return TrialResult(offered=offered, sent=sum(sent), received=received, duration=elapsed, waited=max(waited))

    def chain_cost(self, frames: int, frame_size: int, flows: int, family: Family, cpu: int) -> ChainCost:
        """CPU time per frame of the whole loop: `frames` sent unpaced by one thread pinned to `cpu`.

        On veth the loop runs in the sending thread: each 64-frame batch goes out when the test run
        re-enables softirqs, and the receiving veth's NAPI (the LB program, its XDP_TX, the sink's
        NAPI) runs right there, on that CPU. The thread's CPU time (time.thread_time) over the frames
        is therefore the cost of the generator, the veths, the LB program and the sink per frame,
        without the time the scheduler gave to other processes (which the wall clock would count).
        """
        check_trial(1.0, 1.0, flows, family)
        prog = self._program(frame_size, flows, family)
        self._park(prog)
        ctx = _xdp_md(self.ifindex, len(prog.frame))
        call = min(frames, 1 << 16)
        out: dict[str, float] = {}
        errors: list[BaseException] = []

        def worker() -> None:
            try:
                with entered(self.netns):
                    os.sched_setaffinity(0, {cpu})
                    prog.send(call, ctx, self.batch_size)  # warm: page pool, caches, sessions
                    before = self._settled()
                    c0, t0 = time.thread_time(), time.perf_counter()
                    sent = 0
                    while sent < frames:
                        n = min(call, frames - sent)
                        prog.send(n, ctx, self.batch_size)
                        sent += n
                    out["cpu"], out["wall"] = time.thread_time() - c0, time.perf_counter() - t0
                    out["received"] = self._settled() - before
            except BaseException as exc:  # handed to the caller below
                errors.append(exc)

        thread = threading.Thread(target=worker, name="xdplive-cost")
        thread.start()
        thread.join()
        if errors:
            raise errors[0]
        return ChainCost(frames=frames, received=int(out["received"]), cpu_s=out["cpu"], wall_s=out["wall"],
                         warm=call)

    def _settled(self) -> int:
        """The sink's count once it has stopped moving (frames still in flight have arrived)."""
        last, quiet = [self.sink()], [-1]  # poll reads once at once: that reading counts no quiet interval

        def still() -> bool:
            now = self.sink()
            quiet[0] = quiet[0] + 1 if now == last[0] else 0
            last[0] = now
            return quiet[0] >= SETTLE_QUIET_POLLS

        poll(SETTLE_DEADLINE_S, still, "the sink's count still", check=False, interval_s=SETTLE_POLL_S)
        return last[0]

    def close(self) -> None:
        for _, link in self._parked.values():
            link.close()
        self._parked.clear()
        for prog in self._programs.values():
            prog.close()
        self._programs.clear()


def run_queue_wait() -> float:
    """Seconds this thread has waited on a run queue, ready but not running (0.0 without schedstats)."""
    try:
        fields = Path("/proc/thread-self/schedstat").read_text().split()
    except OSError:
        return 0.0
    return int(fields[1]) / 1e9 if len(fields) >= 2 else 0.0


def percpu_total(values: Sequence[bytes] | None) -> int:
    """The sum of a per-CPU __u64 counter's values."""
    return sum(ctypes.c_uint64.from_buffer_copy(v[:8]).value for v in values or [])
