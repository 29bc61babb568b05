"""test_katran_side_by_side.py: the Katran adapter (lab/dut/katran.py) and `l4lab bench --katran` (lab/bench/katran.py).

The adapter's tests build Katran from the checkout that L4LAB_KATRAN_SRC names and are skipped,
saying so, elsewhere. What they check: Katran programmed by our code forwards a flow to a real of
its ring in IPIP and in GUE (outer UDP checksum valid), its counters tell a new flow from a session
hit, and the side-by-side bench's path checks hold on every call of a short run, a --baseline
object's too. Refusing a baseline needs no checkout; nor does a baseline of another contract (the
object before issue 30, built from git history), programmed by its own checkout's controller.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from scapy.layers.inet import IP
from scapy.layers.l2 import Ether
from scapy.utils import checksum

from balancer.maplayout import SESSION_SETS, sess4_held
from lab import procs
from lab.bench import cli as bench_cli
from lab.bench import katran as katranbench
from lab.bench import model
from lab.bench.baseline import check_baseline
from lab.bench.foreign import ForeignBaseline
from lab.bench.order import Order
from lab.dut import katran
from lab.errors import LabError
from lab.harness.signalled import signal_inside_popen
from lab.packets.decode import decapsulate
from lab.signals import sigterm_unwinds
from reports.schema import BenchPayload, load_results

NEEDS_ROOT = pytest.mark.skipif(os.geteuid() != 0, reason="loading BPF programs needs root")


@pytest.fixture(scope="module")
def checkout() -> katran.Checkout:
    """Name: checkout. Scope: module. Depends: $L4LAB_KATRAN_SRC.

    The user's Katran checkout, or a skip that says how to get one.
        def test_x(checkout: katran.Checkout) -> None: ...
    """
    if not os.environ.get(katran.ENV):
        pytest.skip(f"{katran.ENV} is not set: {katran.HOW_TO_GET}")
    return katran.Checkout.find(None)


@pytest.fixture(scope="module")
def objects(checkout: katran.Checkout, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("katran")
    return {flavour: katran.build(checkout, flavour, out) for flavour in katran.FLAVOURS}


@pytest.fixture
def pinned() -> Iterator[None]:
    """Test runs execute on the caller's CPU; Katran's session tables are per CPU."""
    with katranbench.pinned():
        yield


def programmed(obj: Path, gue: bool) -> katran.Katran:
    kt = katran.Katran(obj, lru_size=1024).load()
    kt.set_router_mac(katranbench.CLIENT_MAC)
    if gue:
        kt.set_sources(katranbench.SRC4)
    kt.add_vip(katranbench.VIP, katranbench.VIP_PORT, socket.IPPROTO_TCP, 0)
    for i, addr in enumerate(katranbench.REALS):
        kt.add_real(i + 1, addr)
    kt.set_ring(0, list(katranbench.ring()))
    return kt


def test_without_a_checkout_the_bench_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv(katran.ENV, raising=False)
    with pytest.raises(LabError, match="git clone https://github.com/facebookincubator/katran"):
        katran.Checkout.find(None)
    if os.geteuid() == 0 and os.path.ismount("/sys/fs/bpf"):
        assert bench_cli.main(["--katran"]) == 1
        assert "no Katran checkout given" in capsys.readouterr().err


def test_a_path_that_is_no_checkout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(LabError, match="is not a Katran checkout"):
        katran.Checkout.find(tmp_path)


BUILD = Path(__file__).resolve().parents[2] / "build" / "bpf"


def test_baseline_without_katran_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_cli.main(["--baseline", str(BUILD / "balancer.o")]) == 2
    assert "it needs --katran" in capsys.readouterr().err


def test_prefill_needs_katran_and_a_fraction_a_table_can_take(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_cli.main(["--prefill", "0.5"]) == 2
    assert "it needs --katran" in capsys.readouterr().err
    if os.geteuid() == 0 and os.path.ismount("/sys/fs/bpf"):
        for bad in ("0.95", "-0.1"):
            assert bench_cli.main(["--katran", "/nonexistent", "--prefill", bad]) == 2
            assert "--prefill must be 0 to 0.9" in capsys.readouterr().err


def test_a_baseline_the_controller_cannot_program_is_refused_before_katran_is_built(tmp_path: Path) -> None:
    """Another object's contract, a file that is no BPF object, a missing file: each a clear error,
    raised before the bench looks for Katran (no checkout is given here)."""
    (tmp_path / "notes.o").write_text("not an object")
    for path, says in ((BUILD / "decap.o", "differs from this checkout's balancer/_abi.py"),
                       (tmp_path / "notes.o", "not a BPF object with BTF"),
                       (tmp_path / "gone.o", "no such file")):
        with pytest.raises(LabError, match=says):
            katranbench.run(katranbench.Options(katran=tmp_path, baseline=path, ndr=False))


@NEEDS_ROOT
@pytest.mark.parametrize("flavour", list(katran.FLAVOURS))
def test_katran_programmed_by_us_forwards_new_flows_and_hits_sessions(objects: dict[str, Path], flavour: str,
                                                                     pinned: None) -> None:
    gue = flavour == "gue"
    with programmed(objects[flavour], gue) as kt:
        syn = katranbench.tcp_frame(katranbench.CLIENT, 45000, katranbench.VIP, 0x02)
        ack = katranbench.tcp_frame(katranbench.CLIENT, 45000, katranbench.VIP, 0x10)
        first = kt.program.test_run(syn)
        assert first.retval == katranbench.XDP_TX
        assert kt.counter(katran.LRU_MISS_CNTR) == (1, 0), "a SYN is a session miss of a new connection"
        second = kt.program.test_run(ack)
        assert second.retval == katranbench.XDP_TX
        lru = kt.counter(katran.LRU_CNTRS)
        assert lru == (2, 1), f"two VIP packets, one miss: {lru}"
        for out in (first.data, second.data):
            enc = decapsulate(out, katran.GUE_PORT)
            assert enc is not None, f"not an encapsulated frame: {Ether(out).summary()}"
            assert enc.frame.dst_mac == katranbench.CLIENT_MAC
            assert enc.outer.version == 4 and enc.outer.dst in katranbench.REALS
            if gue:
                assert enc.kind == "gue1", enc.kind
                assert enc.udp_dport == katran.GUE_PORT and enc.outer.src == katranbench.SRC4
                raw = enc.outer.raw
                pseudo = raw[12:20] + bytes([0, 17]) + len(raw[20:]).to_bytes(2, "big")
                assert enc.udp_checksum != 0 and checksum(pseudo + raw[20:]) == 0, "Katran computes the UDP checksum"
            else:
                assert enc.outer.proto == 4
            assert enc.inner.raw == (syn if out is first.data else ack)[14:], "the client's packet, byte for byte"
        assert Ether(first.data)[IP].dst == Ether(second.data)[IP].dst, "the ACK follows its session"
        assert sum(kt.real_counter(i + 1)[0] for i in range(len(katranbench.REALS))) == 2


@NEEDS_ROOT
def test_side_by_side_checks_every_path(checkout: katran.Checkout, tmp_path: Path) -> None:
    """A short run: every call's action and every round's path counters are checked by the bench itself."""
    opts = katranbench.Options(katran=checkout.root, runs=300, rounds=3, lru_size=4096, ndr=False,
                               results=tmp_path)
    lines: list[str] = []
    result = katranbench.run(opts, lines.append)
    for encap in model.KATRAN_ENCAPS:
        for case in ("session-hit", "new-syn", "new-ack"):
            for who in ("l4lab", "katran"):
                assert result.medians[f"{who}:{encap}:{case}"] > 0
        assert result.insns[f"l4lab:{encap}"][1] > 0 and result.insns[f"katran:{encap}"][1] > 0
    assert sum("actions and path counters checked" in line for line in lines) == 3
    assert any(line.startswith("IPIP session hit") for line in lines)
    assert f"order: seed {result.seed} " in "\n".join(lines)
    assert result.first_loaded == ["l4lab", "katran", "l4lab"], "each program's tables created first in turn"
    assert {len(r) for r in result.round_medians.values()} == {3}
    assert any(line.startswith("  session tables, katran: 2 tables (one per CPU) of 4,096 entries")
               for line in lines) or os.cpu_count() != 2
    assert result.results_file is not None and result.results_file.is_file()
    (written,) = load_results(tmp_path)
    assert isinstance(written.payload, BenchPayload) and written.payload.side_by_side is not None
    sbs = written.payload.side_by_side
    assert len(sbs.cases) == 1 + 3 * len(model.KATRAN_ENCAPS) and {c.calls for c in sbs.cases} == {300}
    hit = next(c for c in sbs.cases if (c.encap, c.case) == ("ip4-ipip", "session-hit"))
    assert (hit.ns, hit.other_ns) == (result.medians["l4lab:ip4-ipip:session-hit"],
                                      result.medians["katran:ip4-ipip:session-hit"])
    assert (hit.path_counter, hit.other_path_counter) == ("LRU_HIT", "LRU hits")
    assert [z.encap for z in sbs.sizes] == list(model.KATRAN_ENCAPS)
    assert written.payload.points == [], "no live frames in this run (ndr=False)"
    assert (sbs.seed, sbs.first_loaded) == (result.seed, ["l4lab", "katran", "l4lab"])
    assert all(len(c.round_ratios) == 3 for c in sbs.cases)
    tables = {t.program: t for t in sbs.session_tables}
    assert tables["katran"].entries == 4096 and tables["katran"].tables == tables["l4lab"].entries // 4096
    assert tables["l4lab"].tables == 1 and tables["l4lab"].bytes > 0


def ways_held(table: Any) -> int:
    """The sessions in l4lab's IPv4 sets (bpf/include/session4.h): ways whose check is neither empty nor
    "being written"."""
    assert table.name == SESSION_SETS, table.name
    return int(sess4_held(table.mmap_words()).sum())


@NEEDS_ROOT
def test_prefill_fills_each_table_the_same_fraction(checkout: katran.Checkout, objects: dict[str, Path],
                                                    pinned: None) -> None:
    """Half of l4lab's one table and half of Katran's table on this CPU hold other flows' sessions
    before timing, each inserted by the program itself."""
    with ExitStack() as stack:
        ours = katranbench.l4lab_side(stack, "ip4-ipip", 4096)
        theirs = katranbench.katran_side(stack, "ip4-ipip", objects["ipip"], 4096)
        _, ours_entries, _ = katranbench.table_sizes(ours)
        sent = {"l4lab": katranbench.prefill(ours, 0.5), "katran": katranbench.prefill(theirs, 0.5)}
        assert sent == {"l4lab": ours_entries // 2, "katran": 2048}
        held = ways_held(ours.tables[0])
        cpu = max(os.sched_getaffinity(0))
        katran_held = len(list(theirs.tables[cpu].keys()))
    print(f"prefill: l4lab sent {sent['l4lab']}, holds {held}; katran sent 2048, its CPU {cpu} table holds "
          f"{katran_held}")
    assert held == sent["l4lab"], "every prefill flow's session is in l4lab's IPv4 table"
    assert katran_held == 2048, "every prefill flow's session is in Katran's table of this CPU"


@NEEDS_ROOT
def test_a_seed_replays_the_same_order(checkout: katran.Checkout, tmp_path: Path) -> None:
    """Two runs with one seed time the cases in one order: the same permutation every iteration."""
    real = katranbench.Order.iterations

    def timed_in(seen: list[list[str]]) -> Any:
        def spy(self: katranbench.Order, items: Any, count: int) -> Any:
            for turn in real(self, items, count):
                seen.append([c.name for c in turn])
                yield turn
        return spy

    orders: list[list[list[str]]] = [[], []]
    for seen in orders:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(katranbench.Order, "iterations", timed_in(seen))
            katranbench.run(katranbench.Options(katran=checkout.root, runs=40, rounds=2, lru_size=1024, ndr=False,
                                                seed=99, results=tmp_path), lambda _line: None)
    assert orders[0] == orders[1] and len(orders[0]) == 40
    assert len({tuple(o) for o in orders[0]}) > 1, "a new order every iteration"


@NEEDS_ROOT
def test_a_baseline_is_timed_in_the_same_rounds(checkout: katran.Checkout, tmp_path: Path) -> None:
    """This build under another name as the baseline: its cases take their paths on every call (the
    same counter checks), it prints beside l4lab, and its private copy is gone afterwards."""
    older = tmp_path / "older-build.o"
    shutil.copyfile(BUILD / "balancer.o", older)
    copies = glob.glob(os.path.join(tempfile.gettempdir(), "l4lab-baseline-*"))
    lines: list[str] = []
    opts = katranbench.Options(katran=checkout.root, runs=200, rounds=2, lru_size=4096, ndr=False,
                               baseline=older)
    result = katranbench.run(opts, lines.append)
    for encap in model.KATRAN_ENCAPS:
        for case in ("session-hit", "new-syn", "new-ack"):
            assert result.medians[f"base:{encap}:{case}"] > 0
    assert sum("actions and path counters checked" in line for line in lines) == 2
    start = lines.index(next(line for line in lines if line.startswith("l4lab against --baseline")))
    rows = lines[start + 1:start + 1 + 7]
    assert sorted(r.split()[0] for r in rows) == sorted(
        ["non-vip"] + [f"{e}:{c}" for e in model.KATRAN_ENCAPS for c in ("new-ack", "new-syn", "session-hit")])
    assert all(len(r.split()) == 9 for r in rows), rows  # name, ns twice, 3 ratios, 2 time ratios, rounds
    for row in rows:  # the same program twice: ratios near 1, in every round too (100 calls a round)
        low, high = map(float, row.split()[8].split("-"))
        assert 0.5 < low <= high < 2 and all(0.5 < float(x) < 2 for x in row.split()[6:8]), row
    assert glob.glob(os.path.join(tempfile.gettempdir(), "l4lab-baseline-*")) == copies


@NEEDS_ROOT
def test_the_live_loop_checks_every_frame_and_catches_one_that_went_elsewhere(objects: dict[str, Path]) -> None:
    """Every live case's loop round on the bench veth: all frames delivered, each program's own counters
    moved by every frame (lab/bench/katran_live.py). Then the check itself: l4lab loaded for the SYN
    flood (a TCP VIP) fed the UDP flows passes them to the stack, and the round says so."""
    from contextlib import ExitStack

    from lab.bench import katran_live as live
    from lab.bench import testbed

    plan = live.live_plan(list(model.KATRAN_ENCAPS))
    cpu = max(os.sched_getaffinity(0))
    with testbed.testbed() as bed, ExitStack() as stack:
        loaded = live.load_all(stack, bed, plan, objects, ["katran", "l4lab"], "test")
        for case in plan:
            cost = live.loop_round(bed, case, loaded[case.name], 1 << 14, cpu)
            assert cost.received == cost.frames == 1 << 14 and cost.warm > 0, case.name
        assert loaded["l4lab:syn-flood"].sessions() == 0, "SYNs insert no session"  # type: ignore[misc]
        assert loaded["katran:syn-flood"].sessions() > 0, "Katran's SYNs insert (below its flood rate)"  # type: ignore[misc]
        with pytest.raises(LabError, match="the sink counted 0 of 16384 frames"):
            live.loop_round(bed, live.LiveCase("l4lab", "ip4-ipip"), loaded["l4lab:syn-flood"], 1 << 14, cpu)


@NEEDS_ROOT
def test_the_live_ndr_is_searched_in_every_round_and_reported_as_medians(objects: dict[str, Path],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The live part in its quick form with a search cut short: two rounds, each loading the programs afresh
    (l4lab's tables first, then Katran's), every case searched in both; each NDR and ratio is the median of
    the rounds, printed with its spread, and the results file gets every round."""
    from types import SimpleNamespace

    from lab.bench import katran_live as live
    from lab.bench.ndr import SearchSettings

    tiny = SearchSettings(max_rate_pps=12e6, short_s=0.05, full_s=0.05, width=0.25, max_trials=10)  # no confirmation
    monkeypatch.setattr(live.Options, "search_settings", lambda self, max_rate=None: tiny)
    result = katranbench.Result(seed=11)
    lines: list[str] = []
    live.measure(SimpleNamespace(quick=True), objects, result, lines.append)

    plan = [c.name for c in live.live_plan(list(model.KATRAN_ENCAPS))]
    assert result.live_first == ["l4lab", "katran"]
    assert sorted(result.live) == sorted(plan) and {len(runs) for runs in result.live.values()} == {2}
    for name, runs in result.live.items():
        ndrs = [m.result.ndr_pps / 1e6 for m in runs]
        assert all(x > 0 for x in ndrs), f"{name}: a round found no rate without loss: {ndrs}"
        assert result.ndr[name] == pytest.approx(statistics.median(ndrs))
    assert sum(line.startswith("  round ") for line in lines) == 2
    for what in (*model.KATRAN_ENCAPS, live.FLOOD):
        (line,) = [x for x in lines if x.startswith(f"  {what}: NDR l4lab ")]
        ratios = live.round_ratios(result, f"l4lab:{what}", f"katran:{what}")
        assert f"NDR l4lab ÷ Katran {statistics.median(ratios):.2f}; rounds {min(ratios):.2f}-" in line, line
        assert "l4lab first" in line and "katran first" in line, line
    assert max(result.flood_sessions["l4lab"]) == 0 < min(result.flood_sessions["katran"])

    rounds = katranbench.live_rounds(result)
    assert [r.first_loaded for r in rounds] == ["l4lab", "katran"]
    assert all(sorted(n.case for n in r.ndr) == sorted(plan) for r in rounds)
    ipip = next(p for p in katranbench.live_points(result) if p.encap == "ip4-ipip")
    assert ipip.ndr_mpps == result.ndr["l4lab:ip4-ipip"] and ipip.versus[0].ndr_mpps == result.ndr["katran:ip4-ipip"]
    assert len(ipip.trials) == sum(len(m.result.trials) for m in result.live["l4lab:ip4-ipip"])


# --- a baseline of another contract, programmed by its own checkout ---------------------------------

REPO = Path(__file__).resolve().parents[2]
# The last commit before issue 30 added maps and fields (lb_server_ids, lb_src_routes, settings.cidr_vips):
# its object is one this checkout's controller cannot program.
BEFORE_SERVER_IDS = "8a72040a15c0e6da308f1e1e01a742727be09cfe"


@pytest.fixture(scope="module")
def older_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Name: older_checkout. Scope: module. Depends: git history with BEFORE_SERVER_IDS, clang.

    That commit's Makefile, bpf/ and balancer/, its balancer.o built by its own Makefile.
        def test_x(older_checkout: Path) -> None: ...
    """
    out = tmp_path_factory.mktemp("older")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", BEFORE_SERVER_IDS, "Makefile", "bpf", "balancer"],
                             capture_output=True)
    if archive.returncode != 0:
        why = f"commit {BEFORE_SERVER_IDS[:7]} is not in this clone's history: {archive.stderr.decode().strip()}"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)  # git's own archive
    subprocess.run(["make", "-C", str(out), "build/bpf/balancer.o"], check=True, capture_output=True)
    return out


def leftovers() -> list[str]:
    return glob.glob("/sys/fs/bpf/l4lab-baseline-*") + [
        str(p.pid) for p in procs.walk() if any(b"sidespec.py" in a for a in p.argv)]


@NEEDS_ROOT
def test_a_baseline_of_another_contract_is_programmed_by_its_own_checkout(older_checkout: Path) -> None:
    """The object before issue 30, with its own checkout: each encap's cases prime, take their paths on
    every call (counters read through the child, in the old layout), and nothing is left: no pin, no child."""
    obj = older_checkout / "build" / "bpf" / "balancer.o"
    base = check_baseline(obj, foreign=True)
    assert base == ForeignBaseline(obj, older_checkout.resolve())
    with ExitStack() as stack:
        sides = [katranbench.foreign_side(stack, encap, 4096, base) for encap in model.KATRAN_ENCAPS]
        cases = [c for n, side in enumerate(sides) for c in katranbench.side_cases(side, n << 20)]
        katranbench.time_round(cases, sides, 50, Order(7))  # raises unless every path counter moved by 50
        assert all(len(c.samples) == 50 and min(c.samples) > 0 for c in cases)
        assert all(katranbench.table_sizes(s)[:1] == (1,) and katranbench.table_sizes(s)[1] >= 4096 for s in sides)
    assert leftovers() == []


def test_another_contract_needs_the_checkout_that_built_it(older_checkout: Path, tmp_path: Path) -> None:
    """Moved out of its checkout, or without `foreign` (the profile), the older object is refused."""
    moved = tmp_path / "balancer.o"
    shutil.copyfile(older_checkout / "build" / "bpf" / "balancer.o", moved)
    with pytest.raises(LabError, match="the build/bpf/balancer.o of the checkout that built it"):
        check_baseline(moved, foreign=True)
    with pytest.raises(LabError, match="a commit with the same contract$"):
        check_baseline(older_checkout / "build" / "bpf" / "balancer.o")


@NEEDS_ROOT
def test_a_checkout_that_cannot_program_its_object_is_a_clear_error(older_checkout: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(older_checkout, broken)
    (broken / "balancer" / "encaps.py").write_text("raise RuntimeError('this checkout is broken')\n")
    base = ForeignBaseline(broken / "build" / "bpf" / "balancer.o", broken)
    with ExitStack() as stack, pytest.raises(LabError, match="(?s)--baseline .*this checkout is broken"):
        katranbench.foreign_side(stack, next(iter(model.KATRAN_ENCAPS)), 4096, base)
    assert leftovers() == []


@NEEDS_ROOT
def test_a_signal_while_the_baseline_child_starts_leaves_nothing(older_checkout: Path) -> None:
    """A SIGTERM that lands inside the child's Popen: the child is still stopped with the bench's stack,
    not left waiting for its spec (or pinning into a removed folder)."""
    obj = older_checkout / "build" / "bpf" / "balancer.o"
    base = check_baseline(obj, foreign=True)
    with (ExitStack() as stack, signal_inside_popen(signal.SIGTERM, "sidespec.py"),
          pytest.raises(KeyboardInterrupt, match="SIGTERM"), sigterm_unwinds()):
        katranbench.foreign_side(stack, next(iter(model.KATRAN_ENCAPS)), 4096, base)
    assert leftovers() == []


def test_the_trimmed_mean_sees_a_change_smaller_than_the_clocks_step() -> None:
    """Samples in 10 ns steps: a shift of a quarter step leaves the median where it was but moves the
    trimmed mean by it, and an interrupt's outlier moves neither."""
    before = [400] * 700 + [410] * 300 + [90_000]
    after = [400] * 600 + [410] * 400 + [90_000]
    assert statistics.median(before) == statistics.median(after) == 400
    assert katranbench.trimmed_mean(after) - katranbench.trimmed_mean(before) == pytest.approx(1.25, abs=0.01)
    assert katranbench.trimmed_mean(before) < 410
