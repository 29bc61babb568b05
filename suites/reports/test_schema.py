"""The results schema: what write_result writes, what load_results accepts, and how it refuses the rest."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reports.sample import SAMPLE_COMMIT, SAMPLE_MACHINE, SAMPLE_OLDER_COMMIT, write_sample
from reports.schema import (
    ENCAP_IDS,
    SCHEMA_VERSION,
    BenchPayload,
    ConformancePayload,
    Kind,
    ResultsError,
    RssPayload,
    case_id,
    load_results,
    parse_result,
    split_id,
    write_result,
)

Mutation = Callable[[dict[str, Any]], None]


def _conformance(test: str = "test_tcp_connect", encap: str = "ip4-gue1", outcome: str = "pass") -> Any:
    return ConformancePayload(test=test, encap=encap, outcome=outcome, duration_s=1.5)  # type: ignore[arg-type]


def test_sample_round_trips_every_kind(sample_results: Path) -> None:
    results = load_results(sample_results)
    assert {r.kind for r in results} == set(Kind)
    assert len(results) == len(list(sample_results.glob("*.json")))
    assert all(r.synthetic for r in results), "the sample must say it is synthetic in every file"
    assert {r.machine for r in results} == {SAMPLE_MACHINE}
    assert {r.commit for r in results} == {SAMPLE_COMMIT, SAMPLE_OLDER_COMMIT}, "two commits: the trends' points"
    # Every file holds exactly what its Result serialises to.
    by_run = {(r.kind.value, r.id, r.timestamp): r for r in results}
    assert len(by_run) == len(results)
    for path in sample_results.glob("*.json"):
        data = json.loads(path.read_text())
        assert by_run[(data["kind"], data["id"], data["timestamp"])].to_json() == data, path


def test_write_result_writes_one_versioned_file(tmp_path: Path) -> None:
    when = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
    path = write_result("conformance", case_id("test_tcp_connect", "ip4-gue1"), _conformance(), tmp_path,
                        timestamp=when)
    assert path.parent == tmp_path
    assert path.name == "conformance.test_tcp_connect+ip4-gue1@20260304T050607Z.json"
    assert path.stat().st_mode & 0o777 == 0o644
    data = json.loads(path.read_text())
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["kind"] == "conformance"
    assert data["id"] == "test_tcp_connect[ip4-gue1]"
    assert set(data["machine"]) == {"hostname", "kernel", "cpus"}
    assert data["synthetic"] is False
    assert datetime.fromisoformat(data["timestamp"]).tzinfo is not None
    assert data["payload"] == {
        "test": "test_tcp_connect",
        "encap": "ip4-gue1",
        "outcome": "pass",
        "duration_s": 1.5,
        "dut": "l4lab",
        "detail": "",
        "figures": [],
        "run": "",
        "reference": "",
        "build": "",
    }
    (result,) = load_results(tmp_path)
    assert result.test == "test_tcp_connect" and result.encap == "ip4-gue1"


def test_every_run_of_a_case_is_kept(tmp_path: Path) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    first = write_result("conformance", "test_x[ip4-ipip]", _conformance(outcome="fail"), tmp_path, timestamp=t0)
    second = write_result("conformance", "test_x[ip4-ipip]", _conformance(outcome="pass"), tmp_path,
                          timestamp=t0 + timedelta(hours=1))
    same_second = write_result("conformance", "test_x[ip4-ipip]", _conformance(outcome="skip"), tmp_path,
                               timestamp=t0 + timedelta(hours=1))
    assert len({first, second, same_second}) == 3, "a run never replaces another"
    assert same_second.name == second.name.replace(".json", "-1.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (first, second, same_second)), \
        "no temporary files may remain"
    outcomes = [r.payload.outcome for r in load_results(tmp_path) if isinstance(r.payload, ConformancePayload)]
    assert outcomes[0] == "fail" and sorted(outcomes[1:]) == ["pass", "skip"], "sorted by time"


def test_rss_source_is_model_nic_or_measured(tmp_path: Path) -> None:
    base = {"name": "gue-sd", "queue_counts": [1], "nqueues": 1, "flows": 1, "max_over_mean": 1.0, "chi2": 0,
            "p_value": 1}
    for source in ("model", "measured", "nic:virtio", "nic:mlx5_core"):
        write_result("rss", "test_r", {"scenarios": [base | {"source": source}]}, tmp_path)
    (default,) = load_results_of(write_result("rss", "test_d", {"scenarios": [base]}, tmp_path))
    assert default == "measured", "a scenario without source was measured (older files: the kernel's view)"
    with pytest.raises(ResultsError, match=r'payload\.scenarios\[0\]\.source: must be "model", "measured" or '
                       r'"nic:<driver>"'):
        write_result("rss", "test_r", {"scenarios": [base | {"source": "nic:"}]}, tmp_path)


def load_results_of(path: Path) -> list[str]:
    """The RSS sources of one results file."""
    result = parse_result(json.loads(path.read_text()), path)
    assert isinstance(result.payload, RssPayload)
    return [sc.source for sc in result.payload.scenarios]


def test_env_variable_chooses_the_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("L4LAB_RESULTS", str(tmp_path / "from-env"))
    path = write_result("conformance", "test_env[ip6-gue1]", _conformance(encap="ip6-gue1"))
    assert path.parent == tmp_path / "from-env"
    assert [r.id for r in load_results()] == ["test_env[ip6-gue1]"]


def test_load_sorts_by_kind_id_and_time(tmp_path: Path) -> None:
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    write_result("conformance", "test_b[ip4-ipip]", _conformance(), tmp_path, timestamp=t0)
    write_result("conformance", "test_a[ip4-ipip]", _conformance(), tmp_path, timestamp=t0 + timedelta(1))
    assert [r.id for r in load_results(tmp_path)] == ["test_a[ip4-ipip]", "test_b[ip4-ipip]"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("test_tcp", ("test_tcp", None)),
        ("test_tcp[ip4-gue1]", ("test_tcp", "ip4-gue1")),
        ("test_tcp[ip6-ip4ip6-1500]", ("test_tcp", "ip6-ip4ip6")),
        ("test_pmtu[blackhole]", ("test_pmtu", None)),
        ("test_tcp[ip4-gue10]", ("test_tcp", None)),
    ],
)
def test_split_id_finds_the_encap(value: str, expected: tuple[str, str | None]) -> None:
    assert split_id(value) == expected


def test_case_id_refuses_an_unknown_encap() -> None:
    assert case_id("test_tcp", "ip6-gue1", "64") == "test_tcp[ip6-gue1-64]"
    with pytest.raises(
        ResultsError, match=r"<value>: id: encap must be one of ip4-ipip, .* but got 'ip4-vxlan'"
    ):
        case_id("test_tcp", "ip4-vxlan")


def _set(path: str, value: Any) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        keys = path.split(".")
        target: Any = data
        for key in keys[:-1]:
            target = target[int(key)] if isinstance(target, list) else target[key]
        target[int(keys[-1]) if isinstance(target, list) else keys[-1]] = value

    return mutate


def _delete(path: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        target: Any = data
        for key in parents:
            target = target[key]
        del target[last]

    return mutate


@pytest.mark.parametrize(
    ("kind", "mutation", "field", "problem"),
    [
        (
            "bench",
            _set("payload.points.3.ndr_mpps", "fast"),
            "payload.points[3].ndr_mpps",
            'a number but got "fast"',
        ),
        (
            "bench",
            _set("payload.points.0.ndr_mpps", True),
            "payload.points[0].ndr_mpps",
            "a number but got true",
        ),
        (
            "bench",
            _set("payload.points.0.frame_size", 32),
            "payload.points[0].frame_size",
            "frame size 64..9018",
        ),
        (
            "bench",
            _set("payload.points.0.trials.1.loss", 1.5),
            "payload.points[0].trials[1].loss",
            "must be 0..1",
        ),
        ("bench", _set("payload.points.0.pdr_mpps", 0.1), "payload.points[0].pdr_mpps", "must be ≥ ndr_mpps"),
        ("bench", _set("payload.generator", "pktgen"), "payload.generator", '"xdp-live" or "trex"'),
        (
            "bench",
            _set("payload.points.0.ndr_mpps", float("nan")),
            "payload.points[0].ndr_mpps",
            "finite number",
        ),
        ("bench", _set("payload.colour", "red"), "payload.colour", "is not a field of BenchPayload"),
        ("bench", _delete("machine.kernel"), "machine.kernel", "is missing; it must be a string"),
        (
            "bench",
            _set("kind", "speed"),
            "kind",
            "must be one of conformance, bench, rss, pmtu, churn, failover, demo",
        ),
        ("bench", _set("schema_version", 99), "schema_version", "this reader knows version 1"),
        ("bench", _set("commit", "abc"), "commit", "40 lower-case hex digits"),
        ("bench", _set("timestamp", "2026-01-01T12:00:00"), "timestamp", "with a time zone"),
        ("bench", _set("id", "no spaces please"), "id", "must be a test name"),
        ("bench", _set("machine.cpus", 0), "machine.cpus", "must be ≥ 1 but got 0"),
        ("conformance", _set("payload.encap", "ip4-vxlan"), "payload.encap", '"ip4-ipip" or "ip4-gue1"'),
        ("conformance", _set("payload.outcome", "passed"), "payload.outcome",
         '"pass" or "finding" or "not-applicable" or "error"'),
        ("rss", _set("payload.scenarios.0.nqueues", 4), "payload.scenarios[0].queue_counts", "nqueues is 4"),
        ("rss", _set("payload.scenarios.1.p_value", 2), "payload.scenarios[1].p_value", "must be 0..1"),
        (
            "pmtu",
            _set("payload.scenarios.0.completed", "yes"),
            "payload.scenarios[0].completed",
            "true or false",
        ),
        (
            "churn",
            _set("payload.points.0.slots_changed", 10**6),
            "payload.points[0].slots_changed",
            "≤ ring_size",
        ),
        ("churn", _set("payload.points.0.katran", 3), "payload.points[0].katran", "an object or null"),
        ("failover", _set("payload.timeline", []), "payload.timeline", "must not be empty"),
        ("demo", _set("payload.encaps.0.ok", 61), "payload.encaps[0].ok", "must be ≤ requests (60)"),
    ],
)
def test_invalid_file_names_file_and_field(
    tmp_path: Path, kind: str, mutation: Mutation, field: str, problem: str
) -> None:
    write_sample(tmp_path, [kind])
    path = sorted(tmp_path.glob(f"{kind}.*.json"))[0]
    data = json.loads(path.read_text())
    mutation(data)
    path.write_text(json.dumps(data))
    with pytest.raises(ResultsError) as caught:
        load_results(tmp_path)
    assert caught.value.file == str(path)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{path}: {field}: ")
    assert problem in caught.value.problem


def test_not_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "bench.broken.json").write_text('{"schema_version": 1,')
    with pytest.raises(ResultsError, match=r"bench\.broken\.json: is not JSON \(Expecting .* at line 1"):
        load_results(tmp_path)


def test_missing_directory_says_how_to_fill_it(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match=r"nowhere: results directory does not exist; run the suites"):
        load_results(tmp_path / "nowhere")


def test_empty_directory_has_no_results(tmp_path: Path) -> None:
    assert load_results(tmp_path) == []


def test_write_refuses_a_payload_of_another_kind(tmp_path: Path) -> None:
    bench = BenchPayload(generator="trex", egress_mtu=1500, points=[])
    with pytest.raises(ResultsError, match=r"a rss result needs a RssPayload but got BenchPayload"):
        write_result("rss", "test_rss", bench, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_write_refuses_what_load_would_refuse(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match=r"<value>: payload\.points: must not be empty"):
        write_result(
            "bench", "test_ndr", BenchPayload(generator="trex", egress_mtu=1500, points=[]), tmp_path
        )
    with pytest.raises(ResultsError, match=r"<value>: payload\.duration_s: is missing"):
        write_result("conformance", "test_x", {"test": "t", "encap": "ip4-ipip", "outcome": "pass"}, tmp_path)
    with pytest.raises(ResultsError, match=r"<value>: kind: must be one of .* but got 'speed'"):
        write_result("speed", "test_x", {}, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_every_encap_id_is_accepted(tmp_path: Path) -> None:
    for encap in ENCAP_IDS:
        write_result("conformance", case_id("test_all", encap), _conformance(encap=encap), tmp_path)
    assert sorted(r.encap or "" for r in load_results(tmp_path)) == sorted(ENCAP_IDS)


def _leaves(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in _leaves(v, (*path, k))] or [path]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in _leaves(v, (*path, i))] or [path]
    return [path]


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@pytest.fixture(scope="module")
def sample_documents(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    directory = tmp_path_factory.mktemp("sample")
    write_sample(directory)
    return [json.loads(next(directory.glob(f"{kind.value}.*.json")).read_text()) for kind in Kind]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_corruption_loads_or_names_a_field(
    sample_documents: list[dict[str, Any]], data: st.DataObject
) -> None:
    """Any value of a valid file replaced by any JSON value gives a Result or a ResultsError, nothing else."""
    document = copy.deepcopy(data.draw(st.sampled_from(sample_documents)))
    path = data.draw(st.sampled_from(_leaves(document)))
    replacement = data.draw(_JSON)
    target: Any = document
    for key in path[:-1]:
        target = target[key]
    if path:
        target[path[-1]] = replacement
    else:
        document = replacement
    try:
        parse_result(document, "corrupt.json")
    except ResultsError as e:
        assert str(e).startswith("corrupt.json: ")
        top = str(path[0]) if path else ""
        assert e.field.split(".")[0].split("[")[0] in (top, "kind", "schema_version", ""), (path, e.field)


def _bench_with_latency(latency: list[dict[str, Any]]) -> dict[str, Any]:
    floor = {"xdp_tx_mpps": 14.2, "xdp_drop_mpps": 14.8}
    point = {"encap": "ip4-ipip", "frame_size": 64, "ndr_mpps": 12.0, "pdr_mpps": 12.1, "floor": floor,
             "egress_overhead_bytes": 20, "latency": latency}
    return {"generator": "trex", "egress_mtu": 1500, "points": [point]}


_LATENCY = [
    {"share_of_pdr": 10, "rate_mpps": 1.21, "min_us": 3.0, "avg_us": 4.5, "max_us": 20.0},
    {"share_of_pdr": 50, "rate_mpps": 6.05, "min_us": 3.5, "avg_us": 5.0, "max_us": 31.0, "p50_us": 4.8,
     "p99_us": 12.5},
    {"share_of_pdr": 90, "rate_mpps": 10.89, "min_us": 4.0, "avg_us": 9.0, "max_us": 80.0},
]


def test_bench_latency_round_trips(tmp_path: Path) -> None:
    path = write_result("bench", "test_trex", _bench_with_latency(_LATENCY), tmp_path)
    written = json.loads(path.read_text())["payload"]["points"][0]["latency"]
    # Optional percentiles are written as null when not measured; everything else as given.
    assert written == [{"p50_us": None, "p99_us": None, **f} for f in _LATENCY]
    (result,) = load_results(tmp_path)
    assert isinstance(result.payload, BenchPayload)
    (point,) = result.payload.points
    assert [(f.share_of_pdr, f.rate_mpps, f.min_us, f.avg_us, f.max_us) for f in point.latency] == [
        (10, 1.21, 3.0, 4.5, 20.0), (50, 6.05, 3.5, 5.0, 31.0), (90, 10.89, 4.0, 9.0, 80.0)]
    assert (point.latency[1].p50_us, point.latency[1].p99_us) == (4.8, 12.5)
    assert point.latency[0].p50_us is None
    assert result.to_json() == json.loads(path.read_text())


def test_a_bench_point_without_latency_still_loads(tmp_path: Path) -> None:
    payload = _bench_with_latency([])
    del payload["points"][0]["latency"]  # a file written before the schema had the field
    path = tmp_path / "bench.old.json"
    path.write_text(json.dumps({"schema_version": SCHEMA_VERSION, "kind": "bench", "id": "old",
                                "machine": {"hostname": "h", "kernel": "6.1", "cpus": 1},
                                "commit": "unknown", "timestamp": "2026-01-01T00:00:00+00:00",
                                "payload": payload}))
    (result,) = load_results(tmp_path)
    assert isinstance(result.payload, BenchPayload) and result.payload.points[0].latency == []


@pytest.mark.parametrize(("change", "field", "problem"), [
    ({"min_us": 5.0, "avg_us": 4.0}, "min_us", "must be ≤ avg_us (4.0) but got 5.0"),
    ({"max_us": 4.0}, "max_us", "must be ≥ avg_us (5.0) but got 4.0"),
    ({"p99_us": 40.0}, "p99_us", "must be between min_us (3.5) and max_us (31.0) but got 40.0"),
    ({"share_of_pdr": 0}, "share_of_pdr", "must be 1..100 but got 0"),
    ({"share_of_pdr": 10}, "share_of_pdr", "repeats 10 % of PDR"),
    ({"rate_mpps": -1.0}, "rate_mpps", "must be ≥ 0 but got -1.0"),
])
def test_bad_latency_is_refused_naming_the_field(tmp_path: Path, change: dict[str, Any], field: str,
                                                 problem: str) -> None:
    latency = copy.deepcopy(_LATENCY)
    latency[1].update(change)
    with pytest.raises(ResultsError) as caught:
        write_result("bench", "test_trex", _bench_with_latency(latency), tmp_path)
    assert caught.value.field == f"payload.points[0].latency[1].{field}"
    assert problem in caught.value.problem
    assert list(tmp_path.iterdir()) == [], "nothing may be written for a refused payload"


def test_imix_mean_matches_the_generators_mix() -> None:
    from lab.bench.gen.base import IMIX
    from reports.schema import IMIX_MEAN_FRAME_BYTES

    assert sum(size * n for size, n in IMIX) / sum(n for _, n in IMIX) == IMIX_MEAN_FRAME_BYTES
