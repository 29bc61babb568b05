"""The demo's verdicts: each figure it prints holds only when what it measured says so (no lab needed).

The demo itself (`make demo`, ~40 s) is the acceptance run; these tests pin down how its
measurements become "held" or "FAILED", and that its results render as the report's first table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lab.demo import EncapRun, summary, write_outputs
from suites.reports._page import Page


def _good(encap: str = "ip4-gue1") -> EncapRun:
    spread = [{"name": n, "queues_used": 1 if n == "fixed-src-sd" else 8, "nqueues": 8,
               "max_over_mean": 8.0 if n == "fixed-src-sd" else 1.06, "held": True,
               "rss": {"name": f"gue-{n}", "queue_counts": [100] * 8, "nqueues": 8, "flows": 800,
                       "max_over_mean": 1.0, "chi2": 0.0, "p_value": 1.0, "counted": "flows", "source": "model"}}
              for n in ("fixed-src-sd", "fixed-src-sdfn", "flow-src-sd", "flow-src-sdfn")]
    return EncapRun(encap, requests=32, ok=32, reals={"real1": 10, "real2": 11, "real3": 11}, to_lb=100,
                    from_lb=100, lb_tx=100, spread=spread,
                    pmtu={"sent_bytes": 1500, "expected_mtu": 1472, "learnt_mtu": 1472, "lb_too_big": 1,
                          "resend": "EMSGSIZE"},
                    churn={"connections": 60, "on_removed": 20, "reset": 20, "collateral": 0, "new_flows": 20,
                           "new_to_removed": 0, "new_failed": 0, "ring_collateral_slots": 11, "ring_size": 65537})


def test_a_run_that_measured_everything_as_expected_holds() -> None:
    run = _good()
    assert run.held(3)
    line = summary([run], 3).splitlines()[2]
    assert line.startswith("ip4-gue1") and line.endswith("ok") and "✗" not in line
    assert "held (0)" in line and "1472 (want 1472)" in line and "20/20 reset, 0 collateral" in line


@pytest.mark.parametrize(("change", "column"), [
    ({"stray": ["from LB: 198.51.100.100 > 192.0.2.2"]}, "NO (1)"),  # a reply crossed the LB
    ({"from_lb": 99}, "NO (0)"),  # an encapsulated frame missing from the capture
    ({"ok": 31}, "31/32 ✗"),
    ({"reals": {"real1": 16, "real2": 16}}, "32/32 ✗"),  # a real never answered
    ({"pmtu": {"sent_bytes": 1500, "expected_mtu": 1472, "learnt_mtu": None, "lb_too_big": 0,
               "resend": "sent"}}, "none (want 1472) ✗"),
    ({"churn": {"connections": 60, "on_removed": 20, "reset": 20, "collateral": 2, "new_flows": 20,
                "new_to_removed": 0, "new_failed": 0, "ring_collateral_slots": 11, "ring_size": 65537}},
     "20/20 reset, 2 collateral ✗"),
    ({"churn": {"connections": 60, "on_removed": 20, "reset": 19, "collateral": 0, "new_flows": 20,
                "new_to_removed": 0, "new_failed": 0, "ring_collateral_slots": 11, "ring_size": 65537}},
     "19/20 reset, 0 collateral ✗"),
])
def test_any_figure_off_fails_the_run(change: dict[str, Any], column: str) -> None:
    run = _good()
    for key, value in change.items():
        setattr(run, key, value)
    assert not run.held(3)
    line = summary([run], 3).splitlines()[2]
    assert column in line and line.endswith("FAILED"), line


def test_a_spread_not_as_expected_fails_the_run() -> None:
    run = _good()
    run.spread[1] = run.spread[1] | {"held": False, "max_over_mean": 1.4}
    assert not run.spread_ok and not run.held(3)
    assert "sdfn 1.40" in summary([run], 3) and "✗" in summary([run], 3)


def test_outputs_render_as_the_first_table(tmp_path: Path) -> None:
    runs = [_good("ip4-gue1"), _good("ip6-gue1")]
    runs[1].pmtu = runs[1].pmtu | {"expected_mtu": 1452, "learnt_mtu": 1452}  # type: ignore[operator]
    out = write_outputs(runs, 3, results=tmp_path / "results", out=tmp_path / "index.html")
    assert out == tmp_path / "index.html"
    kinds = sorted(p.name.split(".")[0] for p in (tmp_path / "results").iterdir())
    assert kinds == ["demo", "pmtu", "pmtu", "rss", "rss"]
    page = Page(out.read_text())
    assert list(page.sections)[0] == "summary"
    table = next(t for t in page.tables if t.section == "summary")
    assert [r[0] for r in table.rows] == ["ip4-gue1", "ip6-gue1"]
    assert table.rows[1][2:6] == ["held (0)", "sd 1/8 q · sdfn 1.06", "sd 1.06 · sdfn 1.06", "1452 (1452)"]


def test_the_throughput_table_names_its_method_and_every_case() -> None:
    from lab.bench.model import Measured, Report
    from lab.bench.ndr import SearchResult
    from lab.demo_bench import METHOD, table

    report = Report()
    for name, mpps in (("xdp_drop", 5.0), ("xdp_tx", 4.0), ("ip4-ipip", 3.0), ("ip4-gue1", 2.0)):
        report.ndr[(name, "64")] = Measured(name, 64, SearchResult(ndr_pps=mpps * 1e6, pdr_pps=mpps * 1.1e6,
                                                                   trials=[]))
    lines = table(report)
    assert lines[0] == f"throughput: {METHOD}" and "live XDP frames" in METHOD and "make bench" in METHOD
    rows = {line.split()[0]: line.split()[1:] for line in lines[2:]}
    assert rows["ip4-ipip"] == ["3.000", "3.300", "0.75"] and rows["ip4-gue1"][2] == "0.50"


def test_the_report_lists_the_lb_shapes_the_demo_ran(tmp_path: Path) -> None:
    write_outputs([_good()], 3, results=tmp_path / "results", out=tmp_path / "index.html")
    out = write_outputs([_good()], 3, results=tmp_path / "results", out=tmp_path / "index.html",
                        shape="two-arm", topology_name="two-arm")
    assert out is not None
    text = out.read_text()
    assert "the LB two-arm (topology two-arm)." in text, "the newest run's shape"
    listed = text.split("LB shapes the demo ran (newest run of each): ", 1)[1].split("<", 1)[0]
    assert listed.count("topology") == 2 and "one-arm (topology default" in listed and "two-arm (topology two-arm" \
        in listed, listed


def test_the_demo_refuses_a_topology_whose_lb_is_a_vm() -> None:
    from lab.demo import main
    from lab.errors import UsageError

    with pytest.raises(UsageError, match="topology 'bond-vlan' has it in a VM: run its checks with `pytest "
                                         "suites/conformance/test_bond_vlan.py`"):
        main(["--topology", "bond-vlan", "--name", "i31b-never-built"])
