"""A complete set of SYNTHETIC results files, for testing the report only: every file says so itself.

Nothing here was measured. The figures are shaped like the real ones (XDP_TX floors of a 2-vCPU
veth lab, encap overheads, Maglev churn on a 65537-slot ring, NIC queues that collapse under a
fixed outer source) so that the report can be read and tested before the suites write results.
Every file carries ``"synthetic": true``, the host ``synthetic-sample`` and a fixed fake commit, and
the report prints a banner when any result is synthetic.

    python -m reports.sample DIR      # writes the sample into DIR
"""

from __future__ import annotations

import argparse
import hashlib
import math
import random
import sys
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from balancer import encaps
from reports.schema import (
    ENCAP_IDS,
    FRAME_SIZES,
    BenchPayload,
    BenchPoint,
    ChurnPayload,
    ChurnPoint,
    ConformancePayload,
    ConnectionOutcomes,
    ControllerFigure,
    CorpusPayload,
    DemoChurn,
    DemoEncap,
    DemoPayload,
    DemoPmtu,
    DemoSpread,
    FailoverPayload,
    Floor,
    FuzzPayload,
    FuzzReason,
    KatranChurn,
    Kind,
    LatencyFigure,
    Machine,
    MicroFigure,
    Nic,
    PmtuPayload,
    PmtuScenario,
    RssPayload,
    RssScenario,
    TimelineEvent,
    Trial,
    Versus,
    case_id,
    write_result,
)

__all__ = ["SAMPLE_COMMIT", "SAMPLE_MACHINE", "SAMPLE_OLDER_COMMIT", "main", "write_sample"]

SAMPLE_MACHINE = Machine(hostname="synthetic-sample", kernel="6.18.0-synthetic", cpus=2)
SAMPLE_COMMIT = hashlib.sha1(b"l4lab synthetic sample results").hexdigest()
SAMPLE_OLDER_COMMIT = hashlib.sha1(b"l4lab synthetic sample results, an older commit").hexdigest()
_START = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)


# Invented shape: the XDP_TX floor per frame size (Mpps) and each encap's share of it.
_TX_FLOOR = {64: 3.95, 128: 3.9, 256: 3.75, 512: 3.55, 1024: 3.15, 1280: 3.0, 1518: 2.85, "imix": 3.45}
_ENCAP_SHARE: dict[str, float] = {
    encaps.IP4_IPIP: 0.84,
    encaps.IP4_GUE1: 0.80,
    encaps.IP4_GUE0: 0.78,
    encaps.IP6_IP6IP6: 0.76,
    encaps.IP6_GUE1: 0.72,
    encaps.IP6_IP4IP6: 0.77,
}

# Katran's figures for removing one of n equal-weight reals from its 65537-slot ring: the numbers of
# shared/conformance/katran/maglev_churn.json (slots owned by the removed real, slots changed).
_KATRAN_CHURN = {3: (21845, 21860), 10: (6553, 6710), 50: (1310, 1612), 100: (655, 992)}
_RING = 65537

_CONFORMANCE_TESTS = (
    "test_tcp_connect",
    "test_udp_request_reply",
    "test_icmp_echo_vip",
    "test_syn_rehash",
    "test_pmtu_too_big",
    "test_weights_proportional",
    "test_no_real_drops",
    "test_katran_fixtures",
)


def _search(capacity: float, start: float, limit: float, rng: random.Random) -> tuple[float, list[Trial]]:
    """A bisection for the highest rate whose loss is ≤ limit, against a made-up lossy device."""
    low, high = 0.0, start * 1.2
    trials: list[Trial] = []
    for _ in range(7):
        rate = (low + high) / 2 if trials else start
        loss = max(0.0, (rate - capacity) / rate) if rate > capacity else 0.0
        if loss > 0:
            loss = min(1.0, loss + rng.uniform(0, 0.0005))
        trials.append(Trial(rate_mpps=round(rate, 4), loss=round(loss, 6), duration_s=2.0))
        if loss <= limit:
            low = rate
        else:
            high = rate
    return round(low, 4), trials


def bench_payload(rng: random.Random) -> BenchPayload:
    points = []
    for encap in ENCAP_IDS:
        for size in FRAME_SIZES:
            tx = _TX_FLOOR[size] * rng.uniform(0.97, 1.03)
            drop = tx * rng.uniform(1.22, 1.30)
            capacity = tx * _ENCAP_SHARE[encap] * rng.uniform(0.97, 1.03)
            ndr, ndr_trials = _search(capacity, tx, 0.0, rng)
            pdr, pdr_trials = _search(capacity * 1.004, tx, 0.005, rng)
            points.append(
                BenchPoint(
                    encap=encap,  # type: ignore[arg-type]
                    frame_size=size,  # type: ignore[arg-type]
                    ndr_mpps=ndr,
                    pdr_mpps=max(pdr, ndr),
                    floor=Floor(xdp_tx_mpps=round(tx, 4), xdp_drop_mpps=round(drop, 4)),
                    egress_overhead_bytes=encaps.by_id(encap).overhead,
                    trials=ndr_trials + pdr_trials,
                    versus=[Versus(program="katran", ndr_mpps=round(ndr * 0.93, 4), pdr_mpps=round(pdr * 0.93, 4))]
                    if size == 64 and encap in (encaps.IP4_IPIP, encaps.IP6_IP6IP6) else [],
                )
            )
    micro = [MicroFigure(case=c, ns_per_packet=ns) for c, ns in
             (("xdp_drop", 110.0), ("xdp_tx", 140.0), (encaps.IP4_IPIP, 431.0), (encaps.IP4_GUE1, 441.0),
              (encaps.IP6_IP6IP6, 450.0), (encaps.IP6_GUE1, 581.0))]
    controller = [ControllerFigure(name=f"Maglev ring build, {n} reals", ms=ms) for n, ms in ((10, 27.0), (100, 39.0))]
    controller.append(ControllerFigure(name="full apply", ms=410.0, ring_slots=524296))
    return BenchPayload(generator="xdp-live", egress_mtu=1500, points=points, micro=micro, controller=controller)


def trex_bench_payload(rng: random.Random) -> BenchPayload:
    """A hardware run (TRex, a 25G NIC) of two encaps at two sizes, with latency at 10/50/90 % of PDR."""
    points = []
    for encap, share in ((encaps.IP4_IPIP, 0.86), (encaps.IP4_GUE1, 0.81)):
        for size, line_rate in ((64, 37.2), (1518, 2.03)):
            tx = min(line_rate, 24.0) * rng.uniform(0.98, 1.0)
            ndr = round(min(line_rate, tx * share), 4)
            pdr = round(min(line_rate, ndr * 1.01), 4)
            latency = []
            for pct in (10, 50, 90):
                base = 4.0 + 0.05 * size / 64 + (pct / 100) ** 4 * 30
                latency.append(LatencyFigure(
                    share_of_pdr=pct, rate_mpps=round(pdr * pct / 100, 4), min_us=round(base * 0.6, 2),
                    avg_us=round(base, 2), max_us=round(base * rng.uniform(3, 6), 2),
                    p50_us=round(base * 0.95, 2), p99_us=round(base * 2.2, 2)))
            points.append(BenchPoint(
                encap=encap,  # type: ignore[arg-type]
                frame_size=size,
                ndr_mpps=ndr,
                pdr_mpps=pdr,
                floor=Floor(xdp_tx_mpps=round(tx, 4), xdp_drop_mpps=round(min(line_rate, tx * 1.2), 4)),
                egress_overhead_bytes=encaps.by_id(encap).overhead,
                trials=[Trial(rate_mpps=round(line_rate, 4), loss=round(max(0.0, 1 - ndr / line_rate), 6),
                              duration_s=0.5)],
                latency=latency,
            ))
    return BenchPayload(generator="trex", egress_mtu=1500, points=points,
                        nic=Nic(model="Mellanox Technologies MT27800 Family [ConnectX-5]", driver="mlx5_core",
                                speed_mbps=25000))


def _p_value(chi2: float, dof: int) -> float:
    """Upper tail of chi-square by the Wilson–Hilferty normal approximation (good enough for a sample)."""
    z = ((chi2 / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _rss(name: str, counts: list[int], flows: int) -> RssScenario:
    mean = sum(counts) / len(counts)
    chi2 = sum((c - mean) ** 2 / mean for c in counts)
    return RssScenario(
        name=name,
        queue_counts=counts,
        nqueues=len(counts),
        flows=flows,
        max_over_mean=round(max(counts) / mean, 4),
        chi2=round(chi2, 3),
        p_value=round(_p_value(chi2, len(counts) - 1), 6),
        counted="flows",
        source="measured",
    )


def rss_payload(rng: random.Random) -> RssPayload:
    nqueues, flows = 8, 4096

    def spread() -> list[int]:
        counts = [0] * nqueues
        for _ in range(flows):
            counts[rng.randrange(nqueues)] += 1
        return counts

    def collapsed(queue: int) -> list[int]:
        return [flows if q == queue else 0 for q in range(nqueues)]

    return RssPayload(
        scenarios=[
            _rss("ipip-fixed-src", collapsed(5), flows),
            _rss("ipip-flow-src", spread(), flows),
            _rss("gue-sd", collapsed(2), flows),
            _rss("gue-sdfn", spread(), flows),
            _rss("gue-flow-src-sd", spread(), flows),
        ]
    )


def pmtu_payload(encap: str, rng: random.Random) -> PmtuPayload:
    return PmtuPayload(
        encap=encap,  # type: ignore[arg-type]
        scenarios=[
            PmtuScenario(
                name="icmp",
                completed=True,
                seconds=round(rng.uniform(0.2, 0.6), 3),
                route_mtu=1500 - encaps.by_id(encap).overhead,
            ),
            PmtuScenario(name="mss-clamp", completed=True, seconds=round(rng.uniform(0.1, 0.3), 3)),
            PmtuScenario(name="blackhole", completed=False, seconds=10.0, expected_completed=False),
        ],
    )


def churn_payload(rng: random.Random) -> ChurnPayload:
    points = []
    for n in (3, 5, 10, 20, 50, 100):
        owned = _RING // n
        collateral = int(owned * rng.uniform(0.0005, 0.004) * math.log(n) * 10)
        katran = _KATRAN_CHURN.get(n)
        conns = 300
        moved = round(conns / n)
        points.append(
            ChurnPoint(
                n=n,
                ring_size=_RING,
                slots_owned_by_removed=owned,
                slots_changed=owned + collateral,
                theoretical_slots=round(_RING / n, 2),
                katran=KatranChurn(ring_size=_RING, slots_owned_by_removed=katran[0], slots_changed=katran[1])
                if katran
                else None,
                connections=ConnectionOutcomes(survived=conns - moved, reset=moved - 1, failed_fast=1),
            )
        )
    return ChurnPayload(points=points)


def failover_payloads() -> dict[str, FailoverPayload]:
    return {
        "test_lb_node_down": FailoverPayload(
            timeline=[
                TimelineEvent(t=0.0, event="traffic started through lb1 and lb2"),
                TimelineEvent(t=2.0, event="lb1 uplink down"),
                TimelineEvent(t=2.31, event="BFD session down on router"),
                TimelineEvent(t=2.33, event="ECMP route via lb1 withdrawn"),
                TimelineEvent(t=2.41, event="all flows answered via lb2"),
            ],
            failover_seconds=0.41,
        ),
        "test_real_health_down": FailoverPayload(
            timeline=[
                TimelineEvent(t=0.0, event="traffic started"),
                TimelineEvent(t=1.0, event="real r2 stops answering"),
                TimelineEvent(t=2.5, event="health check marks r2 down"),
                TimelineEvent(t=2.52, event="ring rebuilt without r2"),
                TimelineEvent(t=2.6, event="new flows reach r1 and r3 only"),
            ],
            failover_seconds=1.6,
        ),
    }


def _conformance_outcome(test: str, encap: str) -> str:
    if test == "test_pmtu_too_big" and encap == encaps.IP6_IP4IP6:
        return "not-applicable"
    if test == "test_syn_rehash" and encap == encaps.IP6_GUE1:
        return "finding"
    return "pass"


def demo_payload() -> DemoPayload:
    runs = []
    for encap in encaps.CASES:
        v6_outer = encap.outer_family == 6
        reals = [f"2001:db8:2::{i}" if v6_outer else f"198.51.100.{i}" for i in (11, 12, 13)]
        gue = encap.gue
        spread = [DemoSpread(name="fixed-src-sd", queues_used=1, nqueues=8, max_over_mean=8.0, held=True),
                  *([DemoSpread(name="fixed-src-sdfn", queues_used=8, nqueues=8, max_over_mean=1.06, held=True)]
                    if gue else []),
                  DemoSpread(name="flow-src-sd", queues_used=8, nqueues=8, max_over_mean=1.05, held=True),
                  *([DemoSpread(name="flow-src-sdfn", queues_used=8, nqueues=8, max_over_mean=1.04, held=True)]
                    if gue else [])]
        runs.append(
            DemoEncap(
                encap=encap,  # type: ignore[arg-type]
                requests=60,
                ok=60,
                reals_seen=reals,
                lb_saw_only_client_to_vip=True,
                to_lb=170, from_lb=170, replies_via_lb=0,
                spread=spread,
                pmtu=DemoPmtu(sent_bytes=1500, expected_mtu=1500 - encap.overhead,
                              learnt_mtu=1500 - encap.overhead, lb_too_big=1, resend="EMSGSIZE"),
                churn=DemoChurn(connections=60, on_removed=20, reset=20, collateral=0, new_flows=30,
                                new_to_removed=0, new_failed=0, ring_collateral_slots=15, ring_size=_RING),
            )
        )
    return DemoPayload(encaps=runs)


def rss_model_and_nic(rng: random.Random) -> dict[str, RssPayload]:
    """The model's and a virtio NIC's queues for the same flows of two encaps (the NIC disagrees once)."""
    out = {}
    for encap in (encaps.IP4_GUE1, encaps.IP4_IPIP):
        for source in ("model", "nic:virtio"):
            scenarios = []
            for outer, fields in (("fixed", "sd"), ("flow", "sd")) + ((("fixed", "sdfn"),) if "gue" in encap else ()):
                counts = [0] * 8
                collapsed = outer == "fixed" and fields == "sd" and not (source != "model" and "gue" in encap)
                for _ in range(2000):
                    counts[3 if collapsed else rng.randrange(8)] += 1
                sc = _rss(f"{'gue' if 'gue' in encap else 'ipip'}-{outer}-src-{fields}", counts, 2000)
                scenarios.append(RssScenario(**{**sc.__dict__, "source": source}))
            out[f"{'test_nic_queue_spread' if source == 'model' else 'test_nic_queues_on_hardware'}"
                f"[{encap}]"] = RssPayload(scenarios=scenarios)
    return out


def write_sample(
    directory: str | Path, kinds: Iterable[Kind | str] | None = None, seed: int = 2026
) -> list[Path]:
    """Write the synthetic sample (all kinds, or only ``kinds``) into ``directory``; returns the files."""
    wanted = {Kind(k) for k in kinds} if kinds is not None else set(Kind)
    rng = random.Random(seed)
    clock = iter(range(10_000))
    paths: list[Path] = []

    def put(kind: Kind, result_id: str, payload: object, commit: str = SAMPLE_COMMIT) -> None:
        if kind in wanted:
            paths.append(
                write_result(
                    kind,
                    result_id,
                    payload,
                    directory,
                    machine=SAMPLE_MACHINE,
                    commit=commit,
                    timestamp=_START + timedelta(seconds=5 * next(clock)),
                    synthetic=True,
                )
            )

    put(Kind.DEMO, "demo", demo_payload())
    # An older commit's software run first (the trends' first point), then the hardware run, then the
    # newest software run: both generators' newest figures are shown, each in its own block.
    put(Kind.BENCH, "test_ndr_pdr", bench_payload(rng), commit=SAMPLE_OLDER_COMMIT)
    put(Kind.BENCH, "test_trex_ndr_pdr", trex_bench_payload(rng))
    put(Kind.BENCH, "test_ndr_pdr", bench_payload(rng))
    put(Kind.RSS, "test_real_rss_spread", rss_payload(rng))
    for name, rss in rss_model_and_nic(rng).items():
        put(Kind.RSS, name, rss)
    for encap in ENCAP_IDS:
        put(Kind.PMTU, case_id("test_pmtu", encap), pmtu_payload(encap, rng))
    put(Kind.CHURN, "test_maglev_churn", churn_payload(rng))
    for name, payload in failover_payloads().items():
        put(Kind.FAILOVER, name, payload)
    for test in _CONFORMANCE_TESTS:
        for encap in ENCAP_IDS:
            outcome = _conformance_outcome(test, encap)
            duration = 0.0 if outcome == "not-applicable" else round(rng.uniform(0.3, 4.0), 3)
            put(
                Kind.CONFORMANCE,
                case_id(test, encap),
                ConformancePayload(test=test, encap=encap, outcome=outcome, duration_s=duration),  # type: ignore[arg-type]
            )
    put(Kind.CORPUS, "test_katran_fixtures",
        CorpusPayload(cases=193, byte_exact=22, verdict_exact=40, same_real=112, deviations=14,
                      not_applicable=5, katrans_real=78))
    put(Kind.FUZZ, "test_fuzz_volume", fuzz_payload(rng))
    return paths


def fuzz_payload(rng: random.Random) -> FuzzPayload:
    """A fuzz run of 100,000 frames through three programs; nothing aborted."""
    frames = 100_000
    split = {"balancer_xdp": {"PASS_NOT_VIP": 0.4, "TX_ENCAP": 0.3, "DROP_MALFORMED_IP": 0.3},
             "decap_xdp": {"PASS_NOT_ENCAP": 0.8, "GUE": 0.1, "DROP_MALFORMED": 0.1},
             "decap_tc": {"PASS_NOT_ENCAP": 0.8, "GUE": 0.1, "DROP_MALFORMED": 0.1}}
    reasons = [FuzzReason(program=prog, reason=reason, frames=round(frames * share))
               for prog, shares in split.items() for reason, share in shares.items()]
    seconds = round(rng.uniform(8, 12), 2)
    return FuzzPayload(seed=rng.randrange(2**32), frames=frames, runs=3 * frames, seconds=seconds,
                       frames_per_s=round(frames / seconds, 1), runs_per_s=round(3 * frames / seconds, 1),
                       refused=0, aborted=0, without_one_reason=0,
                       tx_checked=30_000, reasons=reasons)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reports.sample", description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where to write the synthetic results files")
    parser.add_argument("--kind", action="append", choices=[k.value for k in Kind], help="only this kind")
    args = parser.parse_args(argv)
    paths = write_sample(args.directory, args.kind)
    print(f"wrote {len(paths)} SYNTHETIC results files to {args.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
