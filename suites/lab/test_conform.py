"""`l4lab conform` and the DUT machinery: four verdicts, the data files, the registry, one run's matrix.

The checks themselves run against l4lab in the default run (suites/conformance) and against IPVS in
`make test`'s `l4lab conform --dut ipvs`; here the pieces are checked with real schema results and
the real plugin, and a deliberately broken IPVS adapter must give an error, never a finding.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lab import procs
from lab.dut import DUTS, IpvsDut, capabilities_of, conform, dut_class, make_dut
from lab.dut.base import EVIDENCE_CHARS, GRADED, Capability, encap_capability
from lab.dut.fleet import evidence_limit, member_evidence
from lab.dut.keepalived import RealServer, VirtualServer, render
from lab.dut.spec import DutSpec, DutSpecError
from lab.dut.verdict import POLL, combine, failure_verdict, skip_verdict
from lab.errors import LabNotFoundError, UsageError
from lab.harness.signalled import signal_when
from lab.nsexec import NETNS_DIR
from lab.state import LabState, state_dir
from reports.conformance import Matrix, changes
from reports.schema import ConformancePayload, Kind, case_id, load_results, write_result
from suites.lab import probes

REPO = conform.REPO
CHECKS = REPO / "suites" / "conformance"
LAB = REPO / "lab" / "harness" / "labs.py"


def _write(tmp: Path, test: str, encap: str | None, dut: str, outcome: str, detail: str = "", run: str = "r1",
           reference: str = "") -> None:
    payload = ConformancePayload(test=test, encap=encap, outcome=outcome, dut=dut, detail=detail,  # type: ignore[arg-type]
                                 duration_s=0.1, run=run, reference=reference)
    write_result(Kind.CONFORMANCE, case_id(test, encap, dut), payload, tmp)


# ---- the four verdicts


def test_only_an_assertion_of_the_check_itself_is_a_finding() -> None:
    check = CHECKS / "test_dut.py"
    assert failure_verdict(AssertionError("ttl"), [check], CHECKS) == "finding"
    # a poll that timed out on the check's behalf: the check's frame decides
    assert failure_verdict(AssertionError("never"), [check, POLL], CHECKS) == "finding"
    # an assertion inside the harness, and any other exception, is ours
    assert failure_verdict(AssertionError("ss -K exited 1"), [check, LAB], CHECKS) == "error"
    assert failure_verdict(AssertionError("poll"), [LAB, POLL], CHECKS) == "error"
    assert failure_verdict(RuntimeError("ipvsadm failed"), [check], CHECKS) == "error"
    assert failure_verdict(TimeoutError(), [check], CHECKS) == "error"


def test_a_skip_is_not_applicable_only_when_the_dut_lacks_what_the_check_needs() -> None:
    assert skip_verdict("not applicable: encap:ip4-gue1") == "not-applicable"
    assert skip_verdict("tshark is not installed") == "error"
    assert combine("pass", "pass", "pass") == "pass"
    assert combine("not-applicable", None, "pass") == "not-applicable"
    assert combine("error", None, "pass") == "error"
    assert combine("pass", "finding", "pass") == "finding"
    assert combine("pass", "finding", "error") == "error"  # a failing teardown is ours
    assert combine() == "error"


# ---- the data files and the registry


def test_every_dut_has_a_data_file_whose_not_applicable_entries_cite_a_reference_and_their_line() -> None:
    for name in DUTS:
        spec = DutSpec.load(name)
        assert spec.product
        lines = spec.path.read_text().splitlines()
        for entry in spec.not_applicable:
            assert entry.reference and entry.capability in GRADED | set(Capability)
            assert lines[entry.line - 1].strip() == "[[not_applicable]]", (name, entry)
            assert spec.reference(entry.capability, entry.variant).startswith(f"lab/dut/{name}.toml:{entry.line}: ")
        for deviation in spec.deviations:
            assert deviation.what and deviation.why


def test_capabilities_come_from_the_data_files_and_the_variant() -> None:
    assert capabilities_of("l4lab") >= GRADED | set(Capability)
    ipvs = capabilities_of("ipvs")
    assert encap_capability("ip4-gue1") not in ipvs and encap_capability("ip4-gue0") in ipvs
    assert {Capability.HEALTH_CHECKS, Capability.HITLESS_RESTART, Capability.MULTI_LB} <= ipvs
    bare = capabilities_of("ipvs", {"control": "ipvsadm"})
    assert Capability.HEALTH_CHECKS not in bare and Capability.HITLESS_RESTART not in bare
    rr = capabilities_of("ipvs", {"scheduler": "rr"})
    assert Capability.WEIGHTS not in rr and Capability.CONSISTENT_HASHING not in rr
    katran = capabilities_of("katran")
    assert encap_capability("ip4-gue0") not in katran and Capability.HEALTH_CHECKS not in katran
    assert Capability.PMTU_GENERATION in katran  # built with ICMP_TOOBIG_GENERATION where a check needs it
    assert IpvsDut.variant({}) == "keepalived mh"


def test_a_bad_data_file_is_refused_naming_the_key(tmp_path: Path) -> None:
    (tmp_path / "bad.toml").write_text('product = "x"\n[[not_applicable]]\ncapability = "teleport"\nreference = "r"\n')
    with pytest.raises(DutSpecError, match=r"bad.toml: not_applicable\[0\].capability must be one of"):
        DutSpec.load("bad", tmp_path)
    (tmp_path / "bare.toml").write_text('product = "x"\n[[not_applicable]]\ncapability = "weights"\n')
    with pytest.raises(DutSpecError, match=r"bare.toml: not_applicable\[0\].reference must be a non-empty string"):
        DutSpec.load("bare", tmp_path)


def test_one_registry_names_the_duts_everywhere(tmp_path: Path) -> None:
    dut_option = next(a for a in conform._parser()._actions if "--dut" in a.option_strings)
    assert tuple(dut_option.choices or ()) == tuple(DUTS)
    with pytest.raises(UsageError, match="unknown DUT 'haproxy': choose one of l4lab, ipvs, katran"):
        dut_class("haproxy")
    with pytest.raises(UsageError, match="unknown DUT"):
        make_dut("haproxy", lab=None, workdir=tmp_path)  # type: ignore[arg-type]


def test_keepalived_accepts_the_config_the_adapter_writes(tmp_path: Path) -> None:
    from lab.dut.base import HealthCheck

    if shutil.which("keepalived") is None:
        pytest.skip("keepalived is not installed: run bash scripts/setup.sh --extra vm")
    reals = (RealServer("203.0.113.18"), RealServer("203.0.113.34", 0))
    text = render([VirtualServer("198.51.100.100", 80, "tcp", tunnel="gue", reals=reals, check=HealthCheck(8080)),
                   VirtualServer("2001:db8:100::100", 9000, "udp", reals=(RealServer("2001:db8:e1::2"),),
                                 check=HealthCheck(8080, "tcp"))])
    conf = tmp_path / "keepalived.conf"
    conf.write_text(text)
    done = subprocess.run(["keepalived", "--config-test", "-f", str(conf)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert "lvs_sched mh\n    mh-port\n    mh-fallback\n    lvs_method TUN type gue port 6080 nocsum" in text
    assert "inhibit_on_failure" in text and "retry 1" in text and "connect_port 8080" in text


# ---- one run's matrix


def test_the_matrix_counts_one_run_only_and_a_missing_cell_is_an_error(tmp_path: Path) -> None:
    _write(tmp_path, "test_gone", "ip4-ipip", "ipvs", "pass", run="r0")  # an older run: not counted
    _write(tmp_path, "test_dsr", "ip4-ipip", "l4lab", "pass")
    _write(tmp_path, "test_dsr", "ip4-ipip", "ipvs", "finding", "E   AssertionError: ttl 63 -> 62")
    _write(tmp_path, "test_dsr", "ip4-gue1", "l4lab", "pass")
    _write(tmp_path, "test_dsr", "ip4-gue1", "ipvs", "not-applicable", "not applicable: encap:ip4-gue1",
           reference="lab/dut/ipvs.toml:29: ipvs_gue_encap()")
    _write(tmp_path, "test_churn", "ip4-ipip", "l4lab", "pass")
    _write(tmp_path, "test_health", "ip4-ipip", "l4lab", "pass")
    _write(tmp_path, "test_health", "ip4-ipip", "ipvs", "error", "E   lab.errors.CommandError: ipvsadm exited 2")
    _write(tmp_path, "test_plain", None, "l4lab", "pass", run="")  # outside a conform run
    matrix = Matrix.of(load_results(tmp_path))
    assert matrix.run == "r1" and matrix.duts == ["l4lab", "ipvs"]
    assert ("test_gone", "ip4-ipip") not in matrix.rows and ("test_plain", "-") not in matrix.rows
    assert matrix.cell(("test_churn", "ip4-ipip"), "ipvs").verdict == "error"  # not run
    assert matrix.summary("ipvs").line("ipvs") == "conform: ipvs pass 0 applicable 3 findings 1 errors 2 na 1"
    assert matrix.summary("l4lab").column == "pass 4 / applicable 4 (findings 0, errors 0, n/a 0)"
    assert matrix.na_share("ipvs") == (0, 3)  # the encap it has not at all is left aside
    text = matrix.text()
    assert "n/a lab/dut/ipvs.toml:29" in text and "pass 0 / applicable 3 (findings 1, errors 2, n/a 1)" in text
    assert "finding ipvs test_dsr[ip4-ipip]: AssertionError: ttl 63 -> 62" in text
    report = matrix.report("ipvs")
    assert report["summary"] == {"pass": 0, "applicable": 3, "findings": 1, "errors": 2, "not_applicable": 1}
    na = next(c for c in report["checks"] if c["verdict"] == "not-applicable")
    assert na["reference"].startswith("lab/dut/ipvs.toml:29")


def test_an_na_without_reference_is_reported_and_changed_cells_are_listed(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    _write(old, "test_dsr", "ip4-ipip", "ipvs", "finding", "E   x", run="a")
    _write(old, "test_pmtu", "ip4-ipip", "ipvs", "pass", run="a")
    _write(new, "test_dsr", "ip4-ipip", "ipvs", "pass", run="b")
    _write(new, "test_pmtu", "ip4-ipip", "ipvs", "pass", run="b")
    _write(new, "test_rss", "ip4-ipip", "ipvs", "not-applicable", "not applicable: weights", run="b")
    a, b = Matrix.of(load_results(old)), Matrix.of(load_results(new))
    assert b.unreferenced() == ["ipvs test_rss[ip4-ipip]"]
    assert changes(a, b) == ["ipvs test_dsr[ip4-ipip]: finding -> pass",
                             "ipvs test_rss[ip4-ipip]: absent -> n/a (no reference)"]
    done = subprocess.run([sys.executable, "-m", "lab.cli", "conform", "--compare", str(old), str(new)],
                          cwd=REPO, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["conform: 2 cells changed from run a to run b",
                                        "  ipvs test_dsr[ip4-ipip]: finding -> pass",
                                        "  ipvs test_rss[ip4-ipip]: absent -> n/a (no reference)"]


def test_the_report_opens_with_one_runs_dut_matrix_linking_each_na_to_its_line(tmp_path: Path) -> None:
    from reports import render

    _write(tmp_path, "test_inner", "ip4-ipip", "l4lab", "pass", run="r0")
    _write(tmp_path, "test_inner", "ip4-ipip", "ipvs", "finding", "E   AssertionError: ttl 63 -> 62", run="r0")
    _write(tmp_path, "test_inner", "ip4-ipip", "l4lab", "pass", run="r1")
    _write(tmp_path, "test_inner", "ip4-ipip", "ipvs", "pass", run="r1")
    _write(tmp_path, "test_inner", "ip4-gue1", "ipvs", "not-applicable", "not applicable: encap:ip4-gue1", run="r1",
           reference="lab/dut/ipvs.toml:29: variant 0 only")
    page = render.render_html(load_results(tmp_path))
    sections = page.split("<section ")[1:]
    assert sections[0].startswith('id="duts"'), "the DUT matrix is not the first section"
    matrix = sections[0]
    assert "ttl 63" not in matrix, "a cell of an older run is in the matrix"
    assert "n/a lab/dut/ipvs.toml:29" in matrix and "variant 0 only" in matrix
    assert "pass 1 / applicable 1 (findings 0, errors 0, n/a 1)" in matrix


def test_without_a_foreign_dut_the_report_has_no_dut_matrix(tmp_path: Path) -> None:
    from reports import render

    _write(tmp_path, "test_inner", "ip4-ipip", "l4lab", "pass")
    assert 'id="duts"' not in render.render_html(load_results(tmp_path))


# ---- the real plugin and the real conform


def test_a_check_the_dut_cannot_do_is_na_with_its_reference_before_any_lab_is_built(tmp_path: Path) -> None:
    """IPVS has no GUE variant 1: every check in those encaps is decided n/a up front (no lab, no VM)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(CHECKS), "--dut", "ipvs", "--conform", "-q", "-p", "no:cacheprovider",
         "-k", "gue1"], cwd=REPO, env=os.environ | {"L4LAB_RESULTS": str(tmp_path), "L4LAB_CONFORM_RUN": "t"},
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = load_results(tmp_path)
    collected = int(done.stdout.strip().splitlines()[-1].split()[0])
    assert len(results) == collected >= 10, done.stdout[-1000:]
    matrix = Matrix.of(results)
    cells = [c for _, c in matrix.cells("ipvs")]
    assert {c.verdict for c in cells} == {"not-applicable"} and not matrix.unreferenced()
    assert {c.where for c in cells} == {"lab/dut/ipvs.toml:" + str(n.line) for n in DutSpec.load("ipvs").not_applicable
                                        if n.capability.endswith("gue1")}


def test_l4labs_extras_are_no_row_of_the_matrix() -> None:
    """Under a foreign DUT l4lab's white-box extras are deselected, not n/a; the checks all collect."""
    done = subprocess.run([sys.executable, "-m", "pytest", str(CHECKS), "--dut", "katran", "--collect-only", "-q",
                           "-p", "no:cacheprovider"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    collected = [ln for ln in done.stdout.splitlines() if "::" in ln]
    modules = {ln.split("::")[0].rsplit("/", 1)[-1] for ln in collected}
    assert {"test_dsr.py", "test_dut.py", "test_dut_churn.py", "test_dut_multilb.py"} <= modules, modules
    extras = {"test_churn.py", "test_stats.py", "test_reliability.py", "test_encap_wire.py", "test_pmtu.py"}
    assert not modules & extras, modules & extras
    assert not [ln for ln in collected if "test_katran_under_the_same_flood" in ln]  # l4lab_only
    assert "deselected" in done.stdout.splitlines()[-1]


def test_conform_refuses_a_path_without_the_suites(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="cannot find the conformance tests"):
        conform.main(["--tests", "no/such/tests.py", "--results", str(tmp_path)])


def test_a_fleets_finding_keeps_every_members_evidence() -> None:
    """Two IPVS nodes whose connection tables fill their evidence: the second node's dest list (the
    order its mh table is built in) still reaches the finding's report, each member cut alike."""
    first, second = "ipvsadm -Ln: rs 10.0.1.1, rs 10.0.1.2\n" + "c" * 4000, "ipvsadm -Ln: rs 10.0.1.2, rs 10.0.1.1\n"
    text = member_evidence([("veth-lb1", first), ("veth-lb2", second + "d" * 4000)])

    class Pair:
        members = [object(), object()]

    kept = text[:evidence_limit(Pair())]
    assert kept.startswith("--- member 0 (veth-lb1) ---\n" + first[:EVIDENCE_CHARS] + "\n--- member 1 (veth-lb2) ---\n")
    assert kept.endswith(second + "d" * (EVIDENCE_CHARS - len(second)))
    assert len(text[:evidence_limit(object())]) == EVIDENCE_CHARS + 80  # one device: as much as one member


def test_a_broken_adapter_mid_check_is_an_error_never_a_finding(tmp_path: Path) -> None:
    """The IPVS adapter's ipvsadm fails in the middle of a check (suites/lab/_broken_adapter.py):
    `l4lab conform` says errors 1, findings 0 and exits non-zero."""
    from lab.harness.vmlab import vm_skip_reason

    reason = vm_skip_reason()
    if reason:
        pytest.skip(reason)
    done = subprocess.run(
        [sys.executable, "-m", "lab.cli", "conform", "--dut", "ipvs", "--no-report", "--results", str(tmp_path),
         "--out", str(tmp_path / "out" / "index.html"),
         "-k", "test_removing_a_real_moves_only_its_flows_and_breaks_no_other and ip4-ipip"],
        cwd=REPO, env=os.environ | {"PYTEST_ADDOPTS": "-p suites.lab._broken_adapter"}, capture_output=True,
        text=True, timeout=600)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "conform: ipvs pass 0 applicable 1 findings 0 errors 1 na 0", \
        done.stdout[-3000:]
    (result,) = load_results(next((tmp_path / "conform").iterdir()))
    assert result.payload.outcome == "error" and "ipvsadm failed" in result.payload.detail, result.payload.detail


def _cf_labs() -> set[str]:
    """Conformance labs (`cf-<hex>`) with namespaces on the machine, whoever built them."""
    return {"-".join(p.name.split("-")[:2]) for p in NETNS_DIR.glob("cf-*")}


def _descendants(root: int) -> set[int]:
    """`root` and every process under it, zombies too: a builder that has exited but is not reaped yet
    still owns the lab its state names."""
    children: dict[int, list[int]] = {}
    for p in procs.walk(zombies=True):
        children.setdefault(p.ppid, []).append(p.pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def _new_labs(before: set[str], root: int) -> set[str]:
    """Conformance labs that appeared since `before` was taken and were built under process `root`
    (their state names the builder): other runs on the machine build `cf-` labs meanwhile."""
    tree = _descendants(root)
    built_here = set()
    for lab in _cf_labs() - before:
        with contextlib.suppress(LabNotFoundError):  # its state not written yet: the next poll sees it
            if LabState.load(lab).builder_pid in tree:
                built_here.add(lab)
    return built_here


def _built(labs: set[str]) -> bool:
    """The lab is up: the fixture goes on to start its tracer (seconds of BCC compiling)."""
    return any(LabState.load(lab).complete for lab in labs if (state_dir(lab) / "state.json").exists())


def _checking(labs: set[str]) -> bool:
    """The check's balancer is loaded (its lbctl instance `<lab>-lb` pinned): the check is running."""
    from balancer.controller import PIN_ROOT  # numpy, libbpf: only this test needs the controller's paths

    return any(any(Path(PIN_ROOT).glob(f"{lab}-*")) for lab in labs)


# No "while the lab is built" moment: test_build.py signals `l4lab up` mid-build, the same builder.
MOMENTS = {"built": _built, "checking": _checking}


@pytest.mark.parametrize(("signum", "moment"), [(signal.SIGINT, "built"), (signal.SIGTERM, "checking")])
def test_an_interrupted_conform_run_removes_its_labs(signum: int, moment: str, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) or SIGTERM to `l4lab conform` reaches its pytest run once, which removes the lab it
    was starting its tracer on or checking with before `l4lab conform` exits 130."""
    if os.geteuid() != 0:
        pytest.skip("the conformance lab needs root")
    before = _cf_labs()
    argv = [sys.executable, "-m", "lab.cli", "conform", "--dut", "l4lab", "--no-report", "--results",
            str(tmp_path), "-k", "test_removing_a_real_moves_only_its_flows_and_breaks_no_other and ip4-ipip"]
    labs: set[str] = set()

    def at_moment(pid: int) -> bool:
        labs.update(_new_labs(before, pid))
        return bool(labs) and bool(MOMENTS[moment](labs))

    ended = signal_when(argv, at_moment, signum, what=f"a conformance lab {moment}", cwd=REPO, deadline_s=120.0,
                        exit_s=conform.TEARDOWN_GRACE_S + 60)
    assert ended.returncode == 130, ended.stderr[-2000:]
    assert ended.last_line() == "l4lab: interrupted", ended.stderr[-2000:]
    assert [left for lab in labs for left in probes.leftovers(lab)] == []
