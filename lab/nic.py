"""nic.py: per-receive-queue packet counters of a real NIC (`ethtool -S`), for RSS spread on hardware.

The conformance RSS suite predicts queues with the Toeplitz model (lab/rss.py); on hardware the
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
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections.abc import Sequence

from lab.errors import LabError, UsageError
from lab.nsexec import nsenter_argv
from lab.rss import chi2_sf
from lab.state import netns_name

_PATTERNS = (
    re.compile(r"^rx(\d+)_packets$"),
    re.compile(r"^rx_queue_(\d+)_packets$"),
    re.compile(r"^rx-(\d+)\.packets$"),
    re.compile(r"^\[(\d+)\]: rx_ucast_packets$"),
    re.compile(r"^queue_(\d+)_rx_cnt$"),
    re.compile(r"^rx_queue_(\d+)_xdp_packets$"),
)


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


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="l4lab nic-queues",
                                 description="Per-queue RX packets of an interface over an interval, and their spread.")
    ap.add_argument("ifname")
    ap.add_argument("--name", help="lab name (with --node: read the interface inside that node)")
    ap.add_argument("--node")
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
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
