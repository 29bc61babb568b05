"""The results schema: one versioned JSON file per case, its dataclasses, validator, writer and loader.

A results file is a JSON object::

    {
      "schema_version": 1,
      "kind": "bench",                        # conformance, bench, rss, pmtu, churn, failover, demo,
                                              # corpus, fuzz
      "id": "test_throughput[ip4-gue1]",     # the test name, optionally with its encap id in brackets
      "machine": {"hostname": "...", "kernel": "6.18.0", "cpus": 2},
      "commit": "<40 hex digits>[-dirty]" or "unknown",
      "timestamp": "2026-12-02T13:20:00+00:00",
      "synthetic": false,                     # true only for generated sample data (reports/sample.py)
      "payload": {...}                        # the kind's payload, below
    }

The payload classes are the schema, each in its kind's module (reports/bench.py, rss.py, ...) beside
that kind's section of the page; this module keeps the envelope, the validator, the writer and the
loader. The validator reads the payload classes' type annotations, so a field added there is
checked everywhere. Numbers must be finite; unknown fields are refused so a typo in
a writer fails loudly instead of vanishing from the report. Every error names the file and the
dotted field path (``payload.points[3].ndr_mpps``).

Results live in ``results/`` at the repository top, or in ``$L4LAB_RESULTS``, or in the directory
given; ``write_result`` writes ``<kind>.<id>@<UTC time>.json`` there (atomically; every run is kept,
so the report can show history and trends) and ``load_results`` reads every ``*.json`` back,
sorted by kind, id and time. A run is named by its commit, time, machine and (bench) generator.

Versions: a field added with a default (older files, which lack it, still parse to the same values)
keeps ``SCHEMA_VERSION``, as ``BenchPoint.latency`` did; a field removed, renamed, made required or
given a new meaning bumps it, and the reader then refuses the older files with a message saying how
to rewrite them.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import re
import socket
import subprocess
import tempfile
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

from balancer.validate import Reader
from reports.bench import (
    BenchPayload,
    BenchPoint,
    ControllerFigure,
    Floor,
    LatencyFigure,
    MicroFigure,
    Nic,
    Trial,
    Versus,
)
from reports.churn import ChurnPayload, ChurnPoint, ConnectionOutcomes, KatranChurn
from reports.conformance import ConformanceFigure, ConformancePayload
from reports.corpus import CorpusPayload
from reports.demo import DemoPayload
from reports.failover import FailoverPayload, TimelineEvent
from reports.fuzz import FuzzPayload, FuzzReason
from reports.payload import ENCAP_IDS, EncapId, Kind, at_least, non_empty, rule
from reports.pmtu import PmtuPayload, PmtuScenario
from reports.rss import RssPayload, RssScenario
from reports.side_by_side import (
    LiveNdr,
    LiveRound,
    LoopCost,
    ProgramSize,
    SessionTables,
    SideBySide,
    SideCase,
    SynFlood,
)

# The envelope's own names, then the payload classes the writers (lab/, suites/) import from here: each
# lives in its kind's module (reports/<kind>.py) beside that kind's section of the page.
__all__ = [
    "SCHEMA_VERSION",
    "Machine",
    "Result",
    "ResultsError",
    "case_id",
    "current_commit",
    "current_machine",
    "load_results",
    "parse_result",
    "results_dir",
    "split_id",
    "write_result",
    "BenchPayload",
    "BenchPoint",
    "ChurnPayload",
    "ChurnPoint",
    "ConformanceFigure",
    "ConformancePayload",
    "ConnectionOutcomes",
    "ControllerFigure",
    "CorpusPayload",
    "EncapId",
    "FailoverPayload",
    "Floor",
    "FuzzPayload",
    "FuzzReason",
    "KatranChurn",
    "Kind",
    "LatencyFigure",
    "LiveNdr",
    "LiveRound",
    "LoopCost",
    "MicroFigure",
    "Nic",
    "PmtuPayload",
    "PmtuScenario",
    "ProgramSize",
    "RssPayload",
    "RssScenario",
    "SessionTables",
    "SideBySide",
    "SideCase",
    "SynFlood",
    "TimelineEvent",
    "Trial",
    "Versus",
]

SCHEMA_VERSION = 1


ENV_RESULTS = "L4LAB_RESULTS"
_REPO_TOP = Path(__file__).resolve().parents[1]

_ID_RE = re.compile(r"^(?P<test>[A-Za-z_][A-Za-z0-9_.:/-]*)(?:\[(?P<param>[A-Za-z0-9_.+:/=-]+)\])?$")
_COMMIT_RE = re.compile(r"^(?:[0-9a-f]{40}(?:-dirty)?|unknown)$")


class ResultsError(ValueError):
    """A results file or value does not match the schema.

    ``file`` is the file (or ``<value>`` for data not yet written), ``field`` the dotted path inside
    it (empty for the whole file). The message is ``<file>: <field>: <problem>``.
    """

    def __init__(self, file: str | Path, field: str, problem: str) -> None:
        self.file = str(file)
        self.field = field
        self.problem = problem
        where = f"{self.file}: {field}: " if field else f"{self.file}: "
        super().__init__(where + problem)


class _FieldError(Exception):
    """Internal: a problem at a path inside the value being parsed (the file is added on the way out)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}")


def _fail(path: str, value: object, expected: str) -> _FieldError:
    return _FieldError(path, f"must be {expected} but got {json.dumps(value)}")


_READ = Reader(_fail)  # balancer.validate's checks, with the results' message form


@dataclass(frozen=True)
class Machine:
    """Where a result was measured."""

    hostname: str = field(metadata=rule(non_empty))
    kernel: str = field(metadata=rule(non_empty))
    cpus: int = field(metadata=rule(at_least(1)))


Payload = (
    BenchPayload
    | RssPayload
    | PmtuPayload
    | ChurnPayload
    | FailoverPayload
    | ConformancePayload
    | DemoPayload
    | CorpusPayload
    | FuzzPayload
)

PAYLOADS: Mapping[Kind, type[Any]] = {
    Kind.CONFORMANCE: ConformancePayload,
    Kind.BENCH: BenchPayload,
    Kind.RSS: RssPayload,
    Kind.PMTU: PmtuPayload,
    Kind.CHURN: ChurnPayload,
    Kind.FAILOVER: FailoverPayload,
    Kind.DEMO: DemoPayload,
    Kind.CORPUS: CorpusPayload,
    Kind.FUZZ: FuzzPayload,
}


@dataclass(frozen=True)
class Result:
    """One results file."""

    kind: Kind
    id: str
    machine: Machine
    commit: str
    timestamp: str
    payload: Payload
    synthetic: bool = False
    schema_version: int = SCHEMA_VERSION

    @property
    def test(self) -> str:
        """The test name part of the id."""
        return split_id(self.id)[0]

    @property
    def encap(self) -> str | None:
        """The encap id named in the id's brackets, if any."""
        return split_id(self.id)[1]

    @property
    def time(self) -> datetime:
        return datetime.fromisoformat(self.timestamp)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of this result, keys in the schema's order."""
        return {
            "schema_version": self.schema_version,
            "kind": self.kind.value,
            "id": self.id,
            "machine": dataclasses.asdict(self.machine),
            "commit": self.commit,
            "timestamp": self.timestamp,
            "synthetic": self.synthetic,
            "payload": dataclasses.asdict(self.payload),
        }


def case_id(test: str, encap: str | None = None, *more: str) -> str:
    """The id of a case: ``test``, ``test[encap]`` or ``test[encap-more-...]`` (pytest's form)."""
    if encap is not None and encap not in ENCAP_IDS:
        raise ResultsError("<value>", "id", f"encap must be one of {', '.join(ENCAP_IDS)} but got {encap!r}")
    param = "-".join(p for p in (encap, *more) if p)
    value = f"{test}[{param}]" if param else test
    _check_id(value)
    return value


def split_id(value: str) -> tuple[str, str | None]:
    """(test name, encap id or None) of an id; the encap is the bracket's leading encap id."""
    match = _ID_RE.match(value)
    if match is None:
        raise ResultsError("<value>", "id", _id_problem(value))
    param = match["param"] or ""
    for encap in ENCAP_IDS:
        if param == encap or param.startswith(encap + "-"):
            return match["test"], encap
    return match["test"], None


def _id_problem(value: str) -> str:
    return (
        f"must be a test name optionally followed by [params], e.g. 'test_tcp[ip4-gue1]', but got {value!r}"
    )


def _check_id(value: str) -> None:
    if _ID_RE.match(value) is None:
        raise _FieldError("id", _id_problem(value))


T = TypeVar("T")


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(json.dumps(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_describe(typing.get_args(tp)[0])}"
    if tp is type(None):
        return "null"
    if dataclasses.is_dataclass(tp):
        return "an object"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _parse(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp) and not isinstance(value, bool):
            return value
        raise _READ.fail(path, value, _describe(tp))
    if origin in (Union, types.UnionType):
        objects = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and len(objects) == 1:  # an object or null: name the field inside that is wrong
            return _parse(value, objects[0], path)
        for alternative in typing.get_args(tp):
            try:
                return _parse(value, alternative, path)
            except _FieldError:
                continue
        raise _READ.fail(path, value, _describe(tp))
    if origin is list:
        _READ.array(value, path, _describe(tp))
        (item,) = typing.get_args(tp)
        return [_parse(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _parse_dataclass(value, tp, path)
    if tp is type(None):
        if value is None:
            return None
        raise _READ.fail(path, value, "null")
    if tp is bool:
        return _READ.boolean(value, path)
    if tp is int:
        return _READ.integer(value, path)
    if tp is float:
        return _READ.number(value, path, finite="a finite number")
    if tp is str:
        return _READ.string(value, path)
    raise TypeError(f"schema type {tp!r} at {path} has no validator")


def _parse_dataclass(value: Any, cls: type[T], path: str) -> T:
    prefix = f"{path}." if path else ""
    value = _READ.table(value, path, "an object")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    def unknown(where: str, _value: object, known: Sequence[str]) -> _FieldError:
        return _FieldError(where, f"is not a field of {cls.__name__} (known: {', '.join(known)})")

    Reader(_fail, unknown).known_keys(value, tuple(fields), path)
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        where = prefix + name
        if name not in value:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise _FieldError(where, f"is missing; it must be {_describe(hints[name])}")
            continue
        parsed = _parse(value[name], hints[name], where)
        check = f.metadata.get("check")
        if check is not None and parsed is not None:
            problem = check(parsed)
            if problem:
                raise _FieldError(where, problem)
        kwargs[name] = parsed
    instance = cls(**kwargs)
    problems = getattr(instance, "problems", None)
    if problems is not None:
        for name, problem in problems():
            raise _FieldError(prefix + name, problem)
    return instance


def _parse_result(data: Any) -> Result:
    if not isinstance(data, dict):
        raise _FieldError("", f"must be a JSON object but got {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise _FieldError(
            "schema_version",
            f"is {json.dumps(version)} but this reader knows version {SCHEMA_VERSION}; "
            "re-run the suite that wrote it, or update l4lab",
        )
    kind_value = data.get("kind")
    if kind_value not in tuple(k.value for k in Kind):  # a tuple: the value may be unhashable JSON
        known = ", ".join(k.value for k in Kind)
        raise _FieldError("kind", f"must be one of {known} but got {json.dumps(kind_value)}")
    kind = Kind(kind_value)
    for key in ("schema_version", "kind", "id", "machine", "commit", "timestamp", "payload"):
        if key not in data:
            raise _FieldError(key, "is missing")
    Reader(_fail, lambda where, _value, _known: _FieldError(where, "is not a field of a result")).known_keys(
        data, tuple(f.name for f in dataclasses.fields(Result)), "")
    result_id = _parse(data["id"], str, "id")
    _check_id(result_id)
    commit = _parse(data["commit"], str, "commit")
    if not _COMMIT_RE.match(commit):
        raise _FieldError(
            "commit", f"must be 40 lower-case hex digits (git rev-parse HEAD) or unknown but got {commit!r}"
        )
    timestamp = _parse(data["timestamp"], str, "timestamp")
    try:
        moment = datetime.fromisoformat(timestamp)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise _FieldError("timestamp", f"must be ISO 8601 with a time zone but got {timestamp!r}")
    return Result(
        kind=kind,
        id=result_id,
        machine=_parse_dataclass(data["machine"], Machine, "machine"),
        commit=commit,
        timestamp=timestamp,
        payload=_parse_dataclass(data["payload"], PAYLOADS[kind], "payload"),
        synthetic=_parse(data.get("synthetic", False), bool, "synthetic"),
        schema_version=version,
    )


def parse_result(data: Any, file: str | Path = "<value>") -> Result:
    """The Result in a decoded JSON value; raises ResultsError naming ``file`` and the field."""
    try:
        return _parse_result(data)
    except _FieldError as e:
        raise ResultsError(file, e.path, e.problem) from None


def results_dir(directory: str | Path | None = None) -> Path:
    """The results directory: ``directory``, else ``$L4LAB_RESULTS``, else ``results/`` at the repo top."""
    if directory is not None:
        return Path(directory)
    env = os.environ.get(ENV_RESULTS)
    return Path(env) if env else _REPO_TOP / "results"


def current_machine() -> Machine:
    """This machine: hostname, kernel release and online CPUs."""
    return Machine(hostname=socket.gethostname(), kernel=platform.release(), cpus=os.cpu_count() or 1)


def current_commit(repo: str | Path = _REPO_TOP) -> str:
    """``git rev-parse HEAD`` of the repository, with ``-dirty`` if the tree differs; "unknown" if none."""

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=False)

    try:
        head = git("rev-parse", "--verify", "-q", "HEAD")
    except FileNotFoundError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    commit = head.stdout.strip()
    dirty = git("diff", "--quiet", "HEAD", "--").returncode != 0
    return commit + ("-dirty" if dirty else "")


def _file_name(kind: Kind, result_id: str, moment: datetime, n: int = 0) -> str:
    # A test name holds no '+', so test_x[ip4-gue1] -> test_x+ip4-gue1 cannot meet another test's file;
    # the UTC time (and a counter within one second) keeps every run of a case.
    name = re.sub(r"[^A-Za-z0-9_.+=-]", "_", result_id.replace("[", "+").replace("]", ""))
    stamp = moment.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ") + (f"-{n}" if n else "")
    return f"{kind.value}.{name}@{stamp}.json"


def write_result(
    kind: Kind | str,
    id: str,
    payload: Any,
    directory: str | Path | None = None,
    *,
    machine: Machine | None = None,
    commit: str | None = None,
    timestamp: datetime | None = None,
    synthetic: bool = False,
) -> Path:
    """Validate and write one result; returns its path. ``payload`` is a payload dataclass or a dict.

    Raises ResultsError (file ``<value>``) if the payload does not match the kind's schema.
    """
    try:
        kind = Kind(kind)
    except ValueError:
        known = ", ".join(k.value for k in Kind)
        raise ResultsError("<value>", "kind", f"must be one of {known} but got {kind!r}") from None
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        if not isinstance(payload, PAYLOADS[kind]):
            raise ResultsError(
                "<value>",
                "payload",
                f"a {kind.value} result needs a {PAYLOADS[kind].__name__} but got {type(payload).__name__}",
            )
        payload = dataclasses.asdict(payload)
    moment = timestamp or datetime.now(UTC)
    data = {
        "schema_version": SCHEMA_VERSION,
        "kind": kind.value,
        "id": id,
        "machine": dataclasses.asdict(machine or current_machine()),
        "commit": commit or current_commit(),
        "timestamp": moment.isoformat(timespec="seconds"),
        "synthetic": synthetic,
        "payload": payload,
    }
    result = parse_result(data)  # refuse to write what the loader would refuse to read
    target_dir = results_dir(directory)
    target_dir.mkdir(parents=True, exist_ok=True)
    n = 0
    while (target := target_dir / _file_name(kind, id, moment, n)).exists():
        n += 1
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=target_dir)
    try:
        os.fchmod(fd, 0o644)  # mkstemp makes 0600; results are for every user of the machine to read
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(result.to_json(), out, indent=1, ensure_ascii=False)
            out.write("\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def load_results(directory: str | Path | None = None) -> list[Result]:
    """Every result in the directory (``*.json``), sorted by kind, id and timestamp.

    Raises ResultsError naming the file and field for the first file that is not a valid result,
    and for a directory that does not exist.
    """
    source = results_dir(directory)
    if not source.is_dir():
        raise ResultsError(
            source,
            "",
            "results directory does not exist; run the suites or `make demo` first, or pass --results",
        )
    results = []
    for path in sorted(source.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            problem = f"is not JSON ({e.msg} at line {e.lineno} column {e.colno})"
            raise ResultsError(path, "", problem) from None
        except UnicodeDecodeError as e:
            raise ResultsError(path, "", f"is not UTF-8 text ({e.reason} at byte {e.start})") from None
        results.append(parse_result(data, path))
    results.sort(key=lambda r: (r.kind.value, r.id, r.time))
    return results


