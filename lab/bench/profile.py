"""`l4lab bench --profile ENCAP`: where the balancer's time per live frame goes, by source line.

The live loop of lab/bench/testbed.py (one thread sends 64-byte frames of 1024 flows unpaced
from the highest CPU; on veth the generator, the balancer serving ENCAP, its XDP_TX and the sink
all run in that thread's softirqs) runs while `perf record -e cpu-clock` samples that CPU: a timer
event, so no PMU is needed (this VM has none). Each sample inside the balancer's JIT image is
charged to the source line of the BPF instruction it landed on, through the kernel's line info for
the loaded program (bpf_prog_info's jited_line_info and line_info, the strings from the program's
BTF); every other sample to its symbol (the kernel's, or another BPF program's such as the
generator's). A share times the loop's CPU time per frame is that
line's nanoseconds per frame. The figures are the sampler's estimate over some thousand samples:
they point at where to look, and a change is then measured with `l4lab bench --katran --baseline`.
"""

from __future__ import annotations

import bisect
import collections
import ctypes
import os
import shutil
import struct
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from balancer.libbpf import lib
from lab.bench.baseline import baseline_object
from lab.bench.model import lb_config
from lab.bench.proginfo import (
    BTF_ID,
    JITED_PROG_LEN,
    LINE_INFO_REC_SIZE,
    NR_JITED_FUNC_LENS,
    NR_JITED_KSYMS,
    NR_JITED_LINE_INFO,
    NR_LINE_INFO,
    prog_info,
    u32_at,
)
from lab.bench.testbed import live_generator, testbed
from lab.errors import LabError

PERF_HOW = "bash scripts/setup.sh --extra perf (Debian's linux-perf)"
# Sampling rate: each cpu-clock sample costs this VM several microseconds (at 20 kHz the loop's 114 ns
# per frame became 180-190; at 2 kHz it was 114-116 against 110-114 without perf), so the rate stays
# low and the run long instead.
SAMPLE_HZ = 2_000

@dataclass(frozen=True)
class SourceLine:
    """A run of JIT code from `addr` to the next row's address, compiled from one source line."""

    addr: int
    file: str  # base name: balancer.bpf.c, session.h, ...
    line: int
    text: str  # the line's source text, from the program's BTF

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class JitImage:
    """A loaded program's JIT code: its functions' [start, end) ranges and the line of every run."""

    funcs: tuple[tuple[int, int], ...]
    lines: tuple[SourceLine, ...]  # sorted by address

    def contains(self, addr: int) -> bool:
        return any(start <= addr < end for start, end in self.funcs)

    def line_at(self, addr: int) -> SourceLine | None:
        """The line whose code holds addr, or None outside the image."""
        if not self.contains(addr):
            return None
        i = bisect.bisect_right([r.addr for r in self.lines], addr) - 1
        return self.lines[i] if i >= 0 else None


def jit_image(prog_fd: int) -> JitImage:
    """The JIT image of a loaded program: needs root, the JIT on, and a program loaded with BTF."""
    first = prog_info(prog_fd)
    if not u32_at(first, JITED_PROG_LEN):
        raise LabError("the program is not JIT-compiled (net.core.bpf_jit_enable = 0?)")
    nr_ksyms, nr_lens = u32_at(first, NR_JITED_KSYMS), u32_at(first, NR_JITED_FUNC_LENS)
    nr_lines, nr_jited = u32_at(first, NR_LINE_INFO), u32_at(first, NR_JITED_LINE_INFO)
    rec = u32_at(first, LINE_INFO_REC_SIZE)
    if not nr_lines or nr_lines != nr_jited or rec < 16:
        raise LabError("the program has no line info (built without clang -g?)")
    ksyms, lens = (ctypes.c_uint64 * nr_ksyms)(), (ctypes.c_uint32 * nr_lens)()
    line_info, jited = ctypes.create_string_buffer(nr_lines * rec), (ctypes.c_uint64 * nr_jited)()

    def prepare(buf: ctypes.Array[ctypes.c_char]) -> None:
        struct.pack_into("<IIQQ", buf, NR_JITED_KSYMS, nr_ksyms, nr_lens, ctypes.addressof(ksyms),
                         ctypes.addressof(lens))
        struct.pack_into("<IQQ", buf, NR_LINE_INFO, nr_lines, ctypes.addressof(line_info),
                         ctypes.addressof(jited))
        struct.pack_into("<IIII", buf, NR_JITED_LINE_INFO, nr_jited, rec, 8, 0)

    second = prog_info(prog_fd, prepare)
    btf_id = u32_at(second, BTF_ID)
    lib().btf__load_from_kernel_by_id.restype = ctypes.c_void_p
    lib().btf__load_from_kernel_by_id.argtypes = [ctypes.c_uint32]
    lib().btf__name_by_offset.restype = ctypes.c_char_p
    lib().btf__name_by_offset.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
    lib().btf__free.argtypes = [ctypes.c_void_p]
    btf = lib().btf__load_from_kernel_by_id(btf_id)
    if not btf:
        raise LabError(f"cannot load the program's BTF (id {btf_id}) from the kernel")
    try:
        rows = []
        for i in range(nr_lines):
            _insn, file_off, line_off, line_col = struct.unpack_from("<IIII", line_info.raw, i * rec)
            name = (lib().btf__name_by_offset(btf, file_off) or b"").decode(errors="replace")
            text = (lib().btf__name_by_offset(btf, line_off) or b"").decode(errors="replace")
            rows.append(SourceLine(jited[i], os.path.basename(name), line_col >> 10, text.strip()))
    finally:
        lib().btf__free(btf)
    funcs = tuple((ksyms[i], ksyms[i] + lens[i]) for i in range(min(nr_ksyms, nr_lens)))
    return JitImage(funcs, tuple(sorted(rows, key=lambda r: r.addr)))


@dataclass
class Profile:
    samples: int                                  # on the loop's CPU while the loop ran
    in_program: int                               # of them inside the balancer's JIT image
    by_line: collections.Counter[SourceLine]
    by_symbol: collections.Counter[str]           # every other sample, by kernel symbol
    ns_per_frame: float                           # the loop's CPU time per frame meanwhile
    unsampled_ns: float = 0.0                     # the same loop just before, without perf

    def ns(self, count: int) -> float:
        return self.ns_per_frame * count / self.samples if self.samples else 0.0


def attribute(samples: Iterable[tuple[int, str]], image: JitImage, ns_per_frame: float) -> Profile:
    """(address, symbol) samples: those in the image by line, the rest by symbol."""
    by_line: collections.Counter[SourceLine] = collections.Counter()
    by_symbol: collections.Counter[str] = collections.Counter()
    total = 0
    for addr, sym in samples:
        total += 1
        line = image.line_at(addr)
        if line is not None:
            by_line[line] += 1
        else:
            by_symbol[sym or "[unknown]"] += 1
    return Profile(total, sum(by_line.values()), by_line, by_symbol, ns_per_frame)


def parse_perf_script(text: str) -> list[tuple[int, str]]:
    """`perf script -F ip,sym` lines ("ffffffffc0123456 bpf_prog_…_forward") as (address, symbol)."""
    out = []
    for line in text.splitlines():
        parts = line.split(None, 1)
        if not parts:
            continue
        try:
            addr = int(parts[0], 16)
        except ValueError:
            continue
        out.append((addr, parts[1].strip() if len(parts) > 1 else ""))
    return out


def perf_binary() -> str:
    perf = shutil.which("perf")
    if not perf:
        raise LabError(f"`l4lab bench --profile` samples with perf, which is not installed: {PERF_HOW}")
    # Debian's /usr/bin/perf is a wrapper that looks for perf_<kernel version>; name the real one.
    versioned = sorted(Path("/usr/bin").glob("perf_*"))
    probe = subprocess.run([perf, "--version"], capture_output=True, text=True)
    if probe.returncode != 0 and versioned:
        return str(versioned[-1])
    if probe.returncode != 0:
        raise LabError(f"perf does not run here ({(probe.stderr or probe.stdout).strip()}): {PERF_HOW}")
    return perf


def record(cpu: int, seconds: float, run_loop: Callable[[], float], workdir: Path) -> tuple[str, float]:
    """perf samples `cpu` for `seconds` while run_loop() runs there again and again (each call returns
    the loop's ns per frame); returns perf script's text and the median ns per frame."""
    perf = perf_binary()
    run_loop()  # the first round warms the sessions and the page pool
    data = workdir / "perf.data"
    proc = subprocess.Popen([perf, "record", "-q", "-C", str(cpu), "-e", "cpu-clock", "-F", str(SAMPLE_HZ),
                             "-o", str(data), "--", "sleep", f"{seconds:g}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    costs: list[float] = []
    try:
        deadline = time.monotonic() + 10  # perf writes its file's header once its events are open
        while proc.poll() is None and not (data.is_file() and data.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.01)
        while proc.poll() is None:
            costs.append(run_loop())
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if proc.returncode != 0 or not data.is_file():
        raise LabError(f"perf record failed (exit {proc.returncode}): {err.strip()[-300:]}")
    script = subprocess.run([perf, "script", "-i", str(data), "-F", "ip,sym"], capture_output=True, text=True)
    if script.returncode != 0:
        raise LabError(f"perf script failed: {script.stderr.strip()[-300:]}")
    if not costs:
        raise LabError("the live loop did not complete one round while perf sampled")
    return script.stdout, sorted(costs)[len(costs) // 2]


def profile(encap_id: str, seconds: float = 6.0, obj: Path | None = None) -> Profile:
    """The live loop with the balancer serving encap_id, sampled for `seconds`."""
    perf_binary()  # before the testbed is built
    cpu = max(os.sched_getaffinity(0))
    with ExitStack() as stack:
        copy = baseline_object(stack, obj) if obj else None  # checked: this checkout's contract
        bed = stack.enter_context(testbed())
        tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="l4lab-profile-"))
        bed.load_balancer(copy)
        bed.instance.apply(lb_config(encap_id))
        prog = bed.instance.dp.programs["balancer_xdp"]
        image = jit_image(prog.fd)
        bed.on_lb_program(prog)
        with live_generator(bed, bed.gen_count) as gen:
            def loop() -> float:
                cost = gen.chain_cost(1 << 19, 64, 1024, 4, cpu)
                if cost.delivered < 0.99:
                    raise LabError(f"the live loop delivered only {cost.delivered:.3f} of its frames")
                return float(cost.cpu_ns_per_frame)

            unsampled = sorted(loop() for _ in range(3))[1]
            text, ns = record(cpu, seconds, loop, Path(tmp))
    result = attribute(parse_perf_script(text), image, ns)
    result.unsampled_ns = unsampled
    return result


def table(p: Profile, encap_id: str, top: int = 25) -> list[str]:
    lines = [f"{encap_id}: {p.ns_per_frame:.1f} ns per frame of the whole loop while sampled "
             f"({p.unsampled_ns:.1f} without perf); {p.samples} samples at {SAMPLE_HZ} Hz, "
             f"{p.in_program} ({100 * p.in_program / max(p.samples, 1):.1f} %) in the balancer",
             f"{'share':>6} {'ns/frame':>8}  where"]
    rows: list[tuple[int, str]] = [(n, f"{line.where:<22} {line.text[:80]}") for line, n in p.by_line.items()]
    rows += [(n, f"{'[bpf]' if sym.startswith('bpf_prog_') else '[kernel]'} {sym}") for sym, n in p.by_symbol.items()]
    for n, label in sorted(rows, key=lambda r: -r[0])[:top]:
        lines.append(f"{100 * n / p.samples:5.1f}% {p.ns(n):8.1f}  {label}")
    return lines


def run(encap_id: str, say: Callable[[str], None] = print, seconds: float = 6.0, obj: Path | None = None) -> Any:
    result = profile(encap_id, seconds, obj)
    for line in table(result, encap_id):
        say(line)
    return result
