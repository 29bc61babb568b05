"""test_profile.py: `l4lab bench --profile` (lab/bench/profile.py), samples charged to source lines.

The JIT image's line table is checked against the source files themselves: a row that named the
wrong line would carry another line's text. The attribution is checked on samples whose lines are
known, and one short profile of the live loop must find the balancer and its session lookup.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from lab.bench import cli as bench_cli
from lab.bench import profile
from lab.errors import LabError

ROOT = Path(__file__).resolve().parents[2]
NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="loading BPF programs needs root")


def source_text(file: str, line: int) -> str | None:
    for folder in (ROOT / "bpf", ROOT / "bpf" / "include"):
        path = folder / file
        if path.is_file():
            lines = path.read_text().splitlines()
            return lines[line - 1].strip() if 0 < line <= len(lines) else ""
    return None  # a kernel or libbpf header


@NEEDS_ROOT
def test_the_jit_image_maps_the_balancers_code_to_its_source_lines() -> None:
    from balancer.datapath import Datapath

    dp = Datapath.load(str(ROOT / "build" / "bpf" / "balancer.o"), max_vips=4, max_reals=16, ring_size=257,
                       lru_size=256)
    try:
        image = profile.jit_image(dp.programs["balancer_xdp"].fd)
    finally:
        dp.close()
    assert len(image.funcs) >= 2, "balancer_xdp and its global functions (forward, ...)"
    assert {"balancer.bpf.c", "parse.h", "session.h", "encap.h"} <= {r.file for r in image.lines}
    assert all(image.contains(r.addr) for r in image.lines)
    ours = [(r, source_text(r.file, r.line)) for r in image.lines]
    ours = [(r, text) for r, text in ours if text is not None]
    wrong = [(r.where, r.text, text) for r, text in ours if r.text != text]
    assert len(ours) > 100 and not wrong, wrong[:5]
    runs = list(zip(image.lines, image.lines[1:], strict=False))
    row, after = next((r, n) for r, n in runs if r.file == "session.h" and n.addr > r.addr + 1)
    assert image.line_at(row.addr) == row
    assert image.line_at(after.addr - 1) == row, "an address inside a run is that run's line"
    assert image.line_at(0) is None and image.line_at(image.funcs[0][1] + (1 << 40)) is None


def test_samples_are_charged_to_lines_inside_the_image_and_to_symbols_outside() -> None:
    a, b = profile.SourceLine(0x1000, "x.c", 3, "a();"), profile.SourceLine(0x1010, "x.c", 4, "b();")
    image = profile.JitImage(((0x1000, 0x1040),), (a, b))
    text = "\n".join(["    1000 bpf_prog_1_f", "    100f bpf_prog_1_f", "    1010 bpf_prog_1_f",
                      "    103f bpf_prog_1_f", "    1040 next_thing", "ffffffff81000000 veth_poll",
                      "", "garbage line"])
    samples = profile.parse_perf_script(text)
    assert len(samples) == 6
    p = profile.attribute(samples, image, ns_per_frame=60.0)
    assert (p.samples, p.in_program) == (6, 4)
    assert p.by_line == {a: 2, b: 2}
    assert p.by_symbol == {"next_thing": 1, "veth_poll": 1}
    assert p.ns(2) == pytest.approx(20.0)
    lines = profile.table(p, "ip4-ipip")
    assert lines[0].startswith("ip4-ipip: 60.0 ns per frame") and "4 (66.7 %) in the balancer" in lines[0]
    assert any("x.c:3" in line and "a();" in line and "20.0" in line for line in lines)


def test_without_perf_the_profile_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(LabError, match="scripts/setup.sh --extra perf"):
        profile.perf_binary()
    if os.geteuid() == 0 and os.path.ismount("/sys/fs/bpf"):
        assert bench_cli.main(["--profile", "ip4-ipip"]) == 1
        assert "--extra perf" in capsys.readouterr().err


@NEEDS_ROOT
def test_a_profile_of_the_live_loop_finds_the_balancer_and_its_session_lookup() -> None:
    if not shutil.which("perf"):
        pytest.skip(f"perf is not installed: {profile.PERF_HOW}")
    p = profile.profile("ip4-ipip", seconds=2.0)
    assert p.samples > 0.4 * 2.0 * profile.SAMPLE_HZ, f"{p.samples} samples in 2 s at {profile.SAMPLE_HZ} Hz"
    assert p.unsampled_ns > 0 and p.ns_per_frame < 1.5 * p.unsampled_ns, \
        f"sampling must not distort the loop: {p.ns_per_frame:.1f} ns sampled, {p.unsampled_ns:.1f} without perf"
    share = p.in_program / p.samples
    assert 0.02 < share < 0.9, f"the balancer's share of the loop: {share:.3f}"
    files = {line.file for line in p.by_line}
    assert "balancer.bpf.c" in files or "parse.h" in files, files
    assert "session4.h" in files, f"the IPv4 session lookup runs in the program (session4.h): {sorted(files)}"
    assert sum(p.ns(n) for n in [*p.by_line.values(), *p.by_symbol.values()]) == pytest.approx(p.ns_per_frame)


def test_profile_and_katran_are_separate_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_cli.main(["--katran", "/nowhere", "--profile", "ip4-ipip"]) == 2
    assert "separate runs" in capsys.readouterr().err


@NEEDS_ROOT
def test_profiling_an_object_of_another_contract_is_refused_before_the_testbed(tmp_path: Path) -> None:
    if not shutil.which("perf"):
        pytest.skip(f"perf is not installed: {profile.PERF_HOW}")
    with pytest.raises(LabError, match="differs from this checkout's balancer/_abi.py"):
        profile.profile("ip4-ipip", seconds=1, obj=ROOT / "build" / "bpf" / "decap.o")
