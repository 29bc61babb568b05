"""bench.py: the benchmark result (NDR/PDR per encap and frame size beside the floors, micro and controller
figures) and its section."""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from reports import charts, side_by_side
from reports.page import (
    ENCAP_COLOURS,
    Cell,
    Section,
    Table,
    chart,
    encap_rank,
    fmt,
    kind_section,
    newest_rows,
    run_label,
    size_order,
)
from reports.payload import (
    IMIX_MEAN_FRAME_BYTES,
    EncapId,
    FrameSize,
    at_least,
    between,
    is_frame_size,
    non_empty,
    of_kind,
    rule,
)
from reports.side_by_side import SideBySide

if TYPE_CHECKING:
    import pandas as pd

    from reports.schema import Result


@dataclass(frozen=True)
class Trial:
    """One trial of the NDR/PDR search: offered rate, measured loss ratio and how long it ran."""

    rate_mpps: float = field(metadata=rule(at_least(0)))
    loss: float = field(metadata=rule(between(0, 1)))  # lost / sent, 0..1
    duration_s: float = field(metadata=rule(at_least(0)))


@dataclass(frozen=True)
class Floor:
    """The machine's floor at the same frame size in the same run: MAC-swap XDP_TX and XDP_DROP."""

    xdp_tx_mpps: float = field(metadata=rule(at_least(0)))
    xdp_drop_mpps: float = field(metadata=rule(at_least(0)))


@dataclass(frozen=True)
class LatencyFigure:
    """One-way latency of TRex's latency stream while the point's traffic ran at a share of its PDR."""

    share_of_pdr: int = field(metadata=rule(between(1, 100)))  # percent of the point's PDR
    rate_mpps: float = field(metadata=rule(at_least(0)))  # the offered rate of that trial
    min_us: float = field(metadata=rule(at_least(0)))
    avg_us: float = field(metadata=rule(at_least(0)))
    max_us: float = field(metadata=rule(at_least(0)))
    p50_us: float | None = field(default=None, metadata=rule(at_least(0)))
    p99_us: float | None = field(default=None, metadata=rule(at_least(0)))

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.min_us > self.avg_us:
            yield "min_us", f"must be ≤ avg_us ({self.avg_us}) but got {self.min_us}"
        if self.max_us < self.avg_us:
            yield "max_us", f"must be ≥ avg_us ({self.avg_us}) but got {self.max_us}"
        for name in ("p50_us", "p99_us"):
            value = getattr(self, name)
            if value is not None and not self.min_us <= value <= self.max_us:
                yield name, f"must be between min_us ({self.min_us}) and max_us ({self.max_us}) but got {value}"


@dataclass(frozen=True)
class Versus:
    """Another program's figures for the same point, measured interleaved in the same run (DESIGN 14)."""

    program: str = field(metadata=rule(non_empty))  # e.g. "katran"
    ndr_mpps: float = field(metadata=rule(at_least(0)))
    pdr_mpps: float = field(metadata=rule(at_least(0)))


@dataclass(frozen=True)
class Nic:
    """The NIC a hardware run measured: what `ethtool -i` and the PCI id say."""

    model: str = field(metadata=rule(non_empty))  # e.g. "Mellanox ConnectX-5 (15b3:1017)"
    driver: str = field(metadata=rule(non_empty))  # e.g. "mlx5_core"
    speed_mbps: int | None = None


@dataclass(frozen=True)
class BenchPoint:
    """The throughput of one encap at one ingress frame size."""

    encap: EncapId
    frame_size: FrameSize = field(metadata=rule(is_frame_size))
    ndr_mpps: float = field(metadata=rule(at_least(0)))  # no drop rate: 0 loss
    pdr_mpps: float = field(metadata=rule(at_least(0)))  # partial drop rate: loss ≤ 0.5 %
    floor: Floor
    egress_overhead_bytes: int = field(metadata=rule(at_least(0)))  # bytes the encap adds to each frame
    trials: list[Trial] = field(default_factory=list)
    latency: list[LatencyFigure] = field(default_factory=list)  # TRex only: at 10/50/90 % of PDR
    versus: list[Versus] = field(default_factory=list)  # other programs on the same packets, same run

    def problems(self) -> Iterator[tuple[str, str]]:
        if self.pdr_mpps < self.ndr_mpps:
            yield "pdr_mpps", f"must be ≥ ndr_mpps ({self.ndr_mpps}) but got {self.pdr_mpps}"
        shares = [f.share_of_pdr for f in self.latency]
        for i, share in enumerate(shares):
            if share in shares[:i]:
                yield f"latency[{i}].share_of_pdr", f"repeats {share} % of PDR; one figure per share"


@dataclass(frozen=True)
class MicroFigure:
    """BPF_PROG_TEST_RUN time of one path (64-byte frames, repeat = 1), beside the floors of the same run."""

    case: str = field(metadata=rule(non_empty))  # xdp_drop, xdp_tx or an encap id (balancer/encaps.py)
    ns_per_packet: float = field(metadata=rule(at_least(0)))


@dataclass(frozen=True)
class ControllerFigure:
    """How long one controller operation took (Maglev ring build, full or incremental apply)."""

    name: str = field(metadata=rule(non_empty))  # e.g. "ring build, 100 reals", "full apply"
    ms: float = field(metadata=rule(at_least(0)))
    ring_slots: int | None = None  # ring slots written, for applies


@dataclass(frozen=True)
class BenchPayload:
    """A benchmark run: NDR/PDR of every encap × frame size beside the floor, and/or the test-run
    micro-benchmark and the controller's figures, all measured in one run."""

    generator: Literal["xdp-live", "trex", "test-run"]  # test-run: BPF_PROG_TEST_RUN or controller-only figures
    egress_mtu: int = field(metadata=rule(between(576, 65535)))  # MTU of the LB's egress link, bytes
    points: list[BenchPoint] = field(default_factory=list)
    micro: list[MicroFigure] = field(default_factory=list)
    controller: list[ControllerFigure] = field(default_factory=list)
    nic: Nic | None = None  # hardware runs: the LB's NIC
    side_by_side: SideBySide | None = None  # l4lab and another program timed together (`l4lab bench --katran`)

    def problems(self) -> Iterator[tuple[str, str]]:
        if not (self.points or self.micro or self.controller or self.side_by_side):
            yield "points", "must not be empty when there are no micro, controller or side-by-side figures"


PREAMBLE_AND_GAP = 20  # bytes on the wire around every frame (L1): preamble + delimiter 8, gap 12


def gbps(mpps: float, size: Any) -> float:
    """Ingress line rate in Gb/s (L1: the frame plus preamble and gap) of ``mpps`` frames of ``size``."""
    frame = IMIX_MEAN_FRAME_BYTES if size == "imix" else float(size)
    return mpps * (frame + PREAMBLE_AND_GAP) * 8 / 1000


def _micro_and_controller(section: Section, results: list[Result]) -> None:
    """Tables of the newest run's test-run micro-benchmark and controller figures, if any."""
    with_micro = [(r, p) for r, p in of_kind(results, BenchPayload) if p.micro and p.side_by_side is None]
    with_controller = [(r, p) for r, p in of_kind(results, BenchPayload) if p.controller]
    if with_micro:
        _, payload = max(with_micro, key=lambda rp: rp[0].time)
        tx = next((m.ns_per_packet for m in payload.micro if m.case in ("xdp_tx", "floor-xdp_tx")), 0.0)
        section.tables.append(Table(
            "Test-run micro-benchmark (64-byte frames, repeat = 1; ns include the timer's own cost)",
            ["path", "ns per packet", "÷ XDP_TX"],
            [[Cell(m.case, "key"), Cell(fmt(m.ns_per_packet, 1), "num"),
              Cell(fmt(m.ns_per_packet / tx) if tx else "–", "num")] for m in payload.micro]))
    if with_controller:
        result, payload = max(with_controller, key=lambda rp: rp[0].time)
        section.tables.append(Table(
            f"Controller figures ({result.id})", ["operation", "ms", "ring slots written"],
            [[Cell(c.name, "key"), Cell(fmt(c.ms, 1), "num"),
              Cell(str(c.ring_slots) if c.ring_slots is not None else "–", "num")] for c in payload.controller]))


def _bench_rows(results: list[Result]) -> list[dict[str, Any]]:
    rows = [
        {"time": r.time, "machine": r.machine.hostname, "commit": r.commit, "generator": p.generator,
         "egress_mtu": p.egress_mtu, "encap": pt.encap, "size": pt.frame_size, "ndr": pt.ndr_mpps,
         "pdr": pt.pdr_mpps, "tx": pt.floor.xdp_tx_mpps, "drop": pt.floor.xdp_drop_mpps,
         "overhead": pt.egress_overhead_bytes, "trials": len(pt.trials), "latency": pt.latency,
         "versus": pt.versus, "run": run_label(r, p.generator)}
        for r, p in of_kind(results, BenchPayload) if p.side_by_side is None  # those have their own section
        for pt in p.points
    ]
    return rows


@kind_section(
    "bench",
    "Encapsulation comparison: throughput",
    "NDR (no loss) and PDR (≤ 0.5 % loss) of the balancer per encap and ingress frame size, from "
    "the NDR/PDR search, beside the machine's floor measured in the same run: a MAC-swap XDP_TX "
    "program and XDP_DROP. One block per machine and generator (its newest figures); a TRex run and a "
    "software run never hide each other. Gb/s is the ingress rate on the wire (frame + 20 B preamble "
    "and gap). Compare ratios, not absolute rates: the spread between runs is ±20 %.",
)
def section(section: Section, results: list[Result]) -> bool:
    _micro_and_controller(section, results)
    all_rows = _bench_rows(results)
    if not all_rows:
        return bool(section.tables)
    frame = newest_rows(all_rows, ["machine", "generator", "encap", "size"])
    frame = frame.assign(ratio=[n / t if t > 0 else math.nan for n, t in zip(frame["ndr"], frame["tx"], strict=True)])
    for (machine, generator), group in sorted(frame.groupby(["machine", "generator"]), key=lambda kv: kv[0]):
        _bench_group(section, str(machine), str(generator), group)

    mtu_rows = []
    for encap in sorted(set(frame["encap"]), key=encap_rank):
        part = frame[frame["encap"] == encap]
        overhead = int(part["overhead"].max())
        mtu = int(part["egress_mtu"].min())
        mtu_rows.append([Cell(encap, "key"), Cell(str(overhead), "num"), Cell(str(mtu), "num"),
                         Cell(str(mtu - overhead), "num"), Cell(", ".join(sorted(set(part["generator"]))))])
    section.tables.append(Table(
        "Egress overhead and the largest client packet that fits without ICMP too-big",
        ["encap", "egress overhead (bytes)", "egress MTU (bytes)", "effective MTU (bytes)", "generator"], mtu_rows))
    return True


def _bench_group(section: Section, machine: str, generator: str, frame: pd.DataFrame) -> None:
    """Charts and tables of one machine's newest figures from one generator."""
    where = f"{generator} on {machine}"
    sizes = sorted(set(frame["size"]), key=size_order)
    encaps = sorted(set(frame["encap"]), key=encap_rank)
    labels = [str(s) for s in sizes]
    _bench_charts(section, machine, generator, frame, sizes, encaps)
    by_key = {(row.encap, row.size): row for row in frame.itertuples()}
    table_rows = []
    for encap in encaps:
        cells = [Cell(encap, "key")]
        for size in sizes:
            row = by_key.get((encap, size))
            if row is None:
                cells.append(Cell("–", "num missing"))
            else:
                cells.append(Cell(f"{fmt(row.ndr)} / {fmt(row.pdr)} ({fmt(row.ratio)})", "num",
                                  f"{row.trials} trials; XDP_TX floor {fmt(row.tx)} Mpps; {row.run}"))
        table_rows.append(cells)
    section.tables.append(Table(
        f"NDR / PDR in Mpps (NDR ÷ XDP_TX floor) per encap and ingress frame size (bytes) — {where}",
        ["encap", *labels], table_rows))

    csit = []
    for encap in encaps:
        for size in sizes:
            row = by_key.get((encap, size))
            if row is None:
                continue
            csit.append([Cell(encap, "key"), Cell(str(size), "num"), Cell(fmt(row.ndr, 3), "num"),
                         Cell(fmt(gbps(row.ndr, size), 3), "num"), Cell(fmt(row.pdr, 3), "num"),
                         Cell(fmt(gbps(row.pdr, size), 3), "num"), Cell(fmt(row.ratio), "num")])
    section.tables.append(Table(
        f"Throughput in Mpps and Gb/s (L1, ingress) — {where}",
        ["encap", "frame size (bytes)", "NDR (Mpps)", "NDR (Gb/s)", "PDR (Mpps)", "PDR (Gb/s)", "NDR ÷ XDP_TX"], csit))

    latency = _latency_table(frame, where)
    if latency is not None:
        section.tables.append(latency)
    versus = _versus_table(frame, where)
    if versus is not None:
        section.tables.append(versus)


def _bench_charts(section: Section, machine: str, generator: str, frame: pd.DataFrame, sizes: list[Any],
                  encaps: list[str]) -> None:
    """NDR as a share of the XDP_TX floor, and NDR beside both floors, per encap against frame size."""
    where = f"{generator} on {machine}"
    labels = [str(s) for s in sizes]
    pos = {size: i for i, size in enumerate(sizes)}
    ordered = frame.sort_values("size", key=lambda s: s.map(size_order))

    series, data = [], []
    for encap in encaps:
        part = ordered[ordered["encap"] == encap]
        points = []
        for row in part.itertuples():
            points.append((float(pos[row.size]), float(row.ratio),
                           f"{row.size} B: NDR {fmt(row.ndr)} Mpps ÷ floor {fmt(row.tx)} = {fmt(row.ratio)}"))
            data.append({"generator": generator, "machine": machine, "encap": encap, "frame_size": row.size,
                         "ndr_mpps": row.ndr, "pdr_mpps": row.pdr, "xdp_tx_mpps": row.tx, "xdp_drop_mpps": row.drop,
                         "ndr_over_floor": round(row.ratio, 4), "ndr_gbps": round(gbps(row.ndr, row.size), 4)})
        series.append(charts.Series(encap, points, ENCAP_COLOURS.get(encap, "#333")))
    title = f"NDR as a share of the XDP_TX floor, per encap ({where})"
    section.charts.append(chart(
        charts.line_chart(title, series, categories=labels, x_label="ingress frame size (bytes)",
                          y_label="NDR ÷ XDP_TX floor", hlines=[(1.0, "XDP_TX floor")]),
        title, "Line chart: NDR divided by the XDP_TX floor against frame size, one line per encap, "
               "dashed line at the floor (1.0).", data))

    floors = frame.groupby("size")[["tx", "drop"]].mean()
    series = [charts.Series("XDP_DROP floor", [(float(pos[s]), float(floors.loc[s, "drop"]),
                                                f"{s} B: {fmt(float(floors.loc[s, 'drop']))} Mpps") for s in sizes],
                            "#000", dashed=True),
              charts.Series("XDP_TX floor", [(float(pos[s]), float(floors.loc[s, "tx"]),
                                              f"{s} B: {fmt(float(floors.loc[s, 'tx']))} Mpps") for s in sizes],
                            "#888", dashed=True)]
    for encap in encaps:
        part = ordered[ordered["encap"] == encap]
        series.append(charts.Series(encap, [(float(pos[r.size]), float(r.ndr),
                                             f"{r.size} B: NDR {fmt(r.ndr)} Mpps ({fmt(gbps(r.ndr, r.size))} Gb/s), "
                                             f"PDR {fmt(r.pdr)} Mpps") for r in part.itertuples()],
                                    ENCAP_COLOURS.get(encap, "#333")))
    title = f"NDR throughput per encap against frame size ({where})"
    section.charts.append(chart(
        charts.line_chart(title, series, categories=labels, x_label="ingress frame size (bytes)",
                          y_label="throughput (Mpps)"),
        title, "Line chart: NDR in million packets per second against frame size, one line per encap, "
               "with the XDP_TX and XDP_DROP floors.", data))


LATENCY_CAPTION = "Latency at 10/50/90 % of PDR"


def _latency_table(frame: pd.DataFrame, where: str) -> Table | None:
    """Latency at shares of PDR for the points of ``frame`` that have any, or None."""
    ordered = sorted((row for row in frame.itertuples() if row.latency),
                     key=lambda row: (encap_rank(row.encap), size_order(row.size)))
    if not ordered:
        return None
    table_rows = []
    for row in ordered:
        for fig in sorted(row.latency, key=lambda f: f.share_of_pdr):
            table_rows.append([
                Cell(row.encap, "key"), Cell(str(row.size), "num"), Cell(str(fig.share_of_pdr), "num"),
                Cell(fmt(fig.rate_mpps, 3), "num"), Cell(fmt(gbps(fig.rate_mpps, row.size), 3), "num"),
                Cell(fmt(fig.min_us, 1), "num"),
                Cell(fmt(fig.p50_us, 1) if fig.p50_us is not None else "–", "num"),
                Cell(fmt(fig.avg_us, 1), "num"),
                Cell(fmt(fig.p99_us, 1) if fig.p99_us is not None else "–", "num"),
                Cell(fmt(fig.max_us, 1), "num"),
            ])
    return Table(
        f"{LATENCY_CAPTION} (one way, TRex's latency stream; p50/p99 from its histogram) — {where}",
        ["encap", "frame size (bytes)", "share of PDR (%)", "rate (Mpps)", "rate (Gb/s)", "min (µs)", "p50 (µs)",
         "avg (µs)", "p99 (µs)", "max (µs)"],
        table_rows,
    )


def _versus_table(frame: pd.DataFrame, where: str) -> Table | None:
    """Another program's NDR/PDR beside ours for the points that carry one (measured interleaved)."""
    rows = []
    for row in sorted(frame.itertuples(), key=lambda r: (encap_rank(r.encap), size_order(r.size))):
        for v in row.versus:
            ratio = row.ndr / v.ndr_mpps if v.ndr_mpps > 0 else math.nan
            rows.append([Cell(row.encap, "key"), Cell(str(row.size), "num"), Cell(v.program),
                         Cell(fmt(row.ndr, 3), "num"), Cell(fmt(v.ndr_mpps, 3), "num"),
                         Cell(fmt(row.pdr, 3), "num"), Cell(fmt(v.pdr_mpps, 3), "num"),
                         Cell(fmt(ratio) if math.isfinite(ratio) else "–", "num")])
    if not rows:
        return None
    return Table(f"l4lab vs another program on the same packets, same run — {where}",
                 ["encap", "frame size (bytes)", "program", "l4lab NDR (Mpps)", "its NDR (Mpps)", "l4lab PDR (Mpps)",
                  "its PDR (Mpps)", "l4lab ÷ it (NDR)"], rows)


def figures(result: Result, p: BenchPayload) -> dict[str, float | str]:
    """This result's figures by names stable across runs (reports/history.py trends and compares them)."""
    if p.side_by_side is not None:
        return side_by_side.figures(p, p.side_by_side)
    out: dict[str, float | str] = {}
    for pt in p.points:
        key = f"bench {p.generator} {pt.encap} {pt.frame_size} B"
        out[f"{key} NDR (Mpps)"] = pt.ndr_mpps
        out[f"{key} PDR (Mpps)"] = pt.pdr_mpps
        if pt.floor.xdp_tx_mpps > 0:
            out[f"{key} NDR ÷ XDP_TX floor"] = round(pt.ndr_mpps / pt.floor.xdp_tx_mpps, 4)
        for v in pt.versus:
            out[f"{key} {v.program} NDR (Mpps)"] = v.ndr_mpps
    for m in p.micro:
        out[f"micro {m.case} (ns/packet)"] = m.ns_per_packet
    for c in p.controller:
        out[f"controller {c.name} (ms)"] = c.ms
    return out
