"""nic.py: per-receive-queue packet counters of a real NIC (`ethtool -S`), for RSS spread on hardware.

The conformance RSS suite predicts queues with the Toeplitz model (lab/rss/toeplitz.py); on hardware the
same question is answered by the NIC itself: read its per-queue RX counters before and after the
LB sends many flows, and compute the same spread figures (max/mean, chi-square) on the deltas.
Drivers name the counters differently; the names below are the ones they print:

    mlx5 (ConnectX)      rx0_packets, rx1_packets, ...
    ixgbe, ice, virtio   rx_queue_0_packets, ...
    i40e                 rx-0.packets, ...
    bnxt_en              [0]: rx_ucast_packets, ...
    ena                  queue_0_rx_cnt, ...
    veth (XDP path)      rx_queue_0_xdp_packets, ...

    l4lab nic-queues IFACE [--name LAB --node NODE] [--seconds S] [--json]

Per-flow observation with counters alone (`observe_queues`): flows go out in small batches, flow
i of a batch sending 2**i packets, so each queue's counter delta is a sum of distinct powers of two
and its binary digits name exactly the flows that landed there. A batch whose deltas do not add up
to what was sent (a stray ARP on the link) is sent again. The NIC's RSS settings, for predicting
the same queues with the Toeplitz model, are read from `ethtool -x` (key, indirection table) and
`ethtool -n IF rx-flow-hash udp4|udp6` (the hashed fields).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from lab.errors import LabError, UsageError
from lab.nsexec import nsenter_argv
from lab.poll import poll
from lab.rss.toeplitz import chi2_sf
from lab.state import netns_name

T = TypeVar("T")
_POLL_S = 0.02
_FIELD_LETTERS = {"IP SA": "s", "IP DA": "d", "L4 bytes 0 & 1 [TCP/UDP src port]": "f",
                  "L4 bytes 2 & 3 [TCP/UDP dst port]": "n"}


_PATTERNS = (
    re.compile(r"^rx(\d+)_packets$"),
    re.compile(r"^rx_queue_(\d+)_packets$"),
    re.compile(r"^rx-(\d+)\.packets$"),
    re.compile(r"^\[(\d+)\]: rx_ucast_packets$"),
    re.compile(r"^queue_(\d+)_rx_cnt$"),
    re.compile(r"^rx_queue_(\d+)_xdp_packets$"),
)


@dataclass(frozen=True)
class RssSettings:
    """What `ethtool -x` shows of a NIC's RSS: its hash key and indirection table (entry = queue)."""

    key: bytes
    table: tuple[int, ...]
    function: str  # the hash function switched on, e.g. "toeplitz"

    @property
    def queues(self) -> int:
        return max(self.table) + 1


def parse_rss(ethtool_x: str) -> RssSettings:
    """The key, indirection table and hash function from `ethtool -x IF` output."""
    table: list[int] = []
    key = b""
    function = ""
    section = ""
    for line in ethtool_x.splitlines():
        text = line.strip()
        if text.startswith("RX flow hash indirection table"):
            section = "table"
        elif text.startswith("RSS hash key"):
            section = "key"
        elif text.startswith("RSS hash function"):
            section = "function"
        elif section == "table" and re.match(r"^\d+:", text):
            table += [int(v) for v in text.split(":", 1)[1].split()]
        elif section == "key" and re.fullmatch(r"[0-9a-fA-F]{2}(:[0-9a-fA-F]{2})*", text):
            key = bytes.fromhex(text.replace(":", ""))
        elif section == "function" and text.endswith(": on"):
            function = text.removesuffix(": on").strip()
    if not table or not key:
        raise LabError(f"ethtool -x shows no {'indirection table' if not table else 'hash key'}: "
                       f"{ethtool_x.strip()[:300]!r}")
    return RssSettings(key, tuple(table), function)


def flow_hash_fields(ethtool_n: str) -> str:
    """The hashed fields of `ethtool -n IF rx-flow-hash udp4` output as ethtool -N takes them (sd, sdfn)."""
    fields = "".join(v for k, v in _FIELD_LETTERS.items() if k in ethtool_n)
    if not fields:
        raise LabError(f"ethtool -n rx-flow-hash names no hashed field: {ethtool_n.strip()[:300]!r}")
    return fields


def decode_batch(deltas: Sequence[int], flows: int, repeat: int = 1) -> list[int]:
    """The queue of each of `flows` flows of a batch in which flow i sent repeat * 2**i packets.

    `deltas` are the per-queue counter deltas over the batch; they must add up to what was sent,
    and every queue's delta must be a sum of whole flows (else a flow was split over queues).
    """
    sent = repeat * ((1 << flows) - 1)
    if sum(deltas) != sent:
        raise ValueError(f"queue deltas {list(deltas)} add up to {sum(deltas)}, not the {sent} sent")
    queue_of: dict[int, int] = {}
    for queue, delta in enumerate(deltas):
        if delta % repeat:
            raise ValueError(f"queue {queue} counted {delta} packets, not a multiple of the {repeat} each "
                             f"flow sent: one flow's packets went to several queues (deltas {list(deltas)})")
        for i in range(flows):
            if (delta // repeat) & (1 << i):
                queue_of[i] = queue
    return [queue_of[i] for i in range(flows)]


def observe_queues(
    flows: Sequence[T],
    send: Callable[[Sequence[tuple[T, int]]], None],
    counters: Callable[[], dict[int, int]],
    *,
    batch: int = 4,
    repeat: int = 1,
    attempts: int = 4,
    timeout: float = 5.0,
    record: list[list[int]] | None = None,
) -> list[int]:
    """The receive queue each flow reached, read from per-queue counters (see the module's docstring).

    `send([(flow, n), ...])` sends n packets of each flow; `counters()` reads {queue: packets}.
    Flow i of a batch sends repeat * 2**i packets; a batch is decoded once its deltas add up to
    exactly that. A batch that counts more (a stray packet, or a late one of the batch before) is
    resent together with the batch before it, and the counters must stay still after the last
    batch, so that every decoded batch was counted alone. A flow split over queues raises ValueError.
    Every batch's deltas, resent ones included, are appended to `record` when given.
    """
    if batch < 1:
        raise ValueError(f"batch must be at least 1 but got {batch}")
    chunks = [list(flows[i: i + batch]) for i in range(0, len(flows), batch)]
    found: list[list[int]] = [[] for _ in chunks]
    seen: list[list[int]] = [] if record is None else record
    start = len(seen)
    before = counters()
    index = 0
    while index < len(chunks):
        if len(seen) - start >= attempts * len(chunks):
            raise LabError(f"per-queue counters did not add up to what was sent in {len(seen) - start} batches "
                           f"(last deltas {seen[-3:]}): packets lost or other traffic on the NIC")
        chunk = chunks[index]
        total = repeat * ((1 << len(chunk)) - 1)
        send([(flow, repeat << i) for i, flow in enumerate(chunk)])
        got, before = _wait_for_total(counters, before, total, timeout)
        seen.append(got)
        if sum(got) == total:
            found[index] = decode_batch(got, len(chunk), repeat)
            index += 1
            if index == len(chunks):
                late, before = _wait_for_total(counters, before, 1, 0.0)
                if sum(late):
                    seen.append(late)
                    index -= 1
        elif sum(got) > total and index > 0:
            index -= 1
    return [queue for queues in found for queue in queues]


def _wait_for_total(counters: Callable[[], dict[int, int]], before: dict[int, int], total: int,
                    timeout: float) -> tuple[list[int], dict[int, int]]:
    """(per-queue deltas since `before`, the counters read) once they reach `total` packets or time is up."""
    def read() -> tuple[list[int], dict[int, int]]:
        now = counters()
        return deltas(before, now), now

    return poll(timeout, read, f"{total} packets counted on the queues", until=lambda r: sum(r[0]) >= total,
                check=False, interval_s=_POLL_S)


def queue_counters(ethtool_s: str) -> dict[int, int]:
    """{queue: RX packets} from `ethtool -S` output; the first naming scheme that matches wins."""
    stats: list[tuple[str, int]] = []
    for line in ethtool_s.splitlines():
        name, sep, value = line.strip().rpartition(":")
        if sep and value.strip().lstrip("-").isdigit():
            stats.append((name.strip(), int(value)))
    for pattern in _PATTERNS:
        found = {int(m.group(1)): v for n, v in stats if (m := pattern.match(n))}
        if found:
            return dict(sorted(found.items()))
    return {}


def read_queue_counters(ifname: str, netns: str | None = None) -> dict[int, int]:
    argv = ["ethtool", "-S", ifname]
    full = nsenter_argv(netns, argv) if netns else argv
    done = subprocess.run(full, capture_output=True, text=True, timeout=10, check=False)
    if done.returncode != 0:
        raise LabError(f"ethtool -S {ifname} failed: {done.stderr.strip() or done.stdout.strip()}",
                       command=" ".join(argv), stderr=done.stderr)
    counters = queue_counters(done.stdout)
    if not counters:
        raise LabError(f"ethtool -S {ifname} shows no per-queue RX packet counter this tool knows "
                       f"(known: mlx5, ixgbe, ice, virtio, i40e, bnxt_en, ena, veth)", command=" ".join(argv))
    return counters


def deltas(before: dict[int, int], after: dict[int, int]) -> list[int]:
    queues = sorted(set(before) | set(after))
    return [after.get(q, 0) - before.get(q, 0) for q in queues]


def counts_spread(counts: Sequence[int]) -> dict[str, float]:
    """max/mean, chi-square against an even spread and its p-value, from per-queue packet counts."""
    total = sum(counts)
    if not counts or total <= 0:
        raise UsageError("no packets were received on any queue: nothing to judge")
    mean = total / len(counts)
    chi2 = sum((c - mean) ** 2 for c in counts) / mean
    return {"max_over_mean": max(counts) / mean, "chi2": chi2,
            "p_value": chi2_sf(chi2, len(counts) - 1) if len(counts) > 1 else 1.0}


ONE_QUEUE, SPREAD, UNEVEN = "one queue", "spread", "uneven"


def spread_verdict(counts: Sequence[int], min_p: float = 0.001) -> str:
    """ONE_QUEUE (one queue got everything), SPREAD (every queue used and the chi-square p-value
    against an even spread at least `min_p`) or UNEVEN."""
    used = sum(1 for c in counts if c)
    if used == 1:
        return ONE_QUEUE
    return SPREAD if used == len(counts) and counts_spread(counts)["p_value"] >= min_p else UNEVEN


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="l4lab nic-queues",
                                 description="Per-queue RX packets of an interface over an interval, and their spread.")
    ap.add_argument("ifname", help="the interface whose RX queues to read (ethtool -S)")
    ap.add_argument("--name", help="lab name (with --node: read the interface inside that node)")
    ap.add_argument("--node", help="the lab node that holds the interface (with --name)")
    ap.add_argument("--seconds", type=float, default=5.0, help="the interval to count over (default %(default)s)")
    ap.add_argument("--json", action="store_true", help="print the counts and their spread as JSON")
    args = ap.parse_args(argv)
    if bool(args.name) != bool(args.node):
        raise UsageError("l4lab nic-queues: give both --name and --node, or neither")
    ns = netns_name(args.name, args.node) if args.name else None
    before = read_queue_counters(args.ifname, ns)
    time.sleep(args.seconds)  # the measurement interval itself, not synchronisation
    counts = deltas(before, read_queue_counters(args.ifname, ns))
    figures = counts_spread(counts) if sum(counts) > 0 else {}
    if args.json:
        print(json.dumps({"ifname": args.ifname, "queues": counts, **figures}))
    else:
        for q, n in enumerate(counts):
            print(f"queue {q:>3}: {n} packets")
        if figures:
            print(f"max/mean {figures['max_over_mean']:.3f}, chi2 {figures['chi2']:.1f}, p {figures['p_value']:.3g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
