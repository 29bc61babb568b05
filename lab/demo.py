"""demo.py: `l4lab demo` — the encapsulation modes compared on real traffic, then teardown.

Builds the default lab, loads the balancer in the LB node with `lbctl` (as an operator would),
and for each encap id checks four things, each a figure the demo measured and compared:

    works/DSR  HTTP requests and UDP echoes from the client to the VIP while capturing the LB's
               link on the router: every request answered, every real served, and the LB received
               client→VIP packets only and emitted only encapsulated ones (0 replies crossed it).
    spread     the outer headers the real balancer program writes for SPREAD_FLOWS flows
               (BPF_PROG_TEST_RUN), hashed as a NIC does (lab/rss/toeplitz.py: Toeplitz, 8 queues), with a
               fixed and a flow-derived outer source, under "sd" and (GUE) "sdfn": one queue where
               the outer headers do not vary, max/mean ≤ 1.25 where they do.
    PMTU       a 1500-byte UDP datagram with DF to the VIP: the LB answers "too big" itself and the
               client's socket learns 1500 − the encap's overhead (a resend fails EMSGSIZE).
    churn      CHURN_CONNS live TCP connections to an echo VIP, then one of three reals removed:
               its connections must be reset (fail fast), no connection of a surviving real may
               break (collateral 0) and no new flow may reach it.

Once the lab is down it compares the encaps' throughput with the software bench, cut to a few
seconds per encap (lab/demo_bench.py; `--no-bench` skips it). It prints a summary, writes a demo
result (and rss, pmtu and bench results beside it) and the HTML report, whose sections without
results are left out and listed with the command that fills each, and always removes the lab. The
whole run takes under two minutes on 2 vCPUs.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from balancer import _abi, maglev
from balancer import config as cfg
from balancer.controller import Instance
from balancer.encaps import SAME_FAMILY, by_id
from lab import demo_bench, netns, nicdemo, topology
from lab.emitted import emit_flows
from lab.errors import LabError, UsageError
from lab.lbconf import balancer_config, egress_link, lb_link, peer_mac, real_addresses, shape
from lab.nodes.churn_client import ChurnClient
from lab.nodes.tcp_services import Services
from lab.nsexec import nsenter_argv
from lab.observe.capture import Capture, classify_lb_link
from lab.poll import poll
from lab.rss.toeplitz import Toeplitz, indirection_table, queues_of, spread
from lab.state import Undo, netns_name, state_dir

REPO = Path(__file__).resolve().parent.parent
GUE_PORT = int(_abi.Limits.DEFAULT_GUE_PORT)
UDP_PORT = 9000
ECHO_PORT = 7007
SPREAD_FLOWS = 6000  # through the program; about a third land on the real under study
NQUEUES = 8
MAX_OVER_MEAN = 1.25
PMTU_SIZE = 1500  # the client's link MTU: the datagram fits the first hop, not the encapsulated path
CHURN_CONNS = 60
CHURN_OBSERVE_S = 1.0
MOVED = "real3"  # the real the churn run removes


@dataclass
class EncapRun:
    encap_id: str
    requests: int = 0
    ok: int = 0
    reals: dict[str, int] = field(default_factory=dict)
    to_lb: int = 0           # frames router → LB, all client → VIP
    from_lb: int = 0         # frames LB → router, all encapsulated client → VIP
    stray: list[str] = field(default_factory=list)  # anything else seen on the LB's link
    lb_tx: int = 0           # the LB's own count of encapsulated packets
    errors: list[str] = field(default_factory=list)
    spread: list[dict[str, Any]] = field(default_factory=list)   # schema.DemoSpread fields
    pmtu: dict[str, Any] | None = None                            # schema.DemoPmtu fields
    churn: dict[str, Any] | None = None                           # schema.DemoChurn fields

    @property
    def dsr_ok(self) -> bool:
        return not self.stray and self.to_lb > 0 and self.from_lb == self.to_lb

    def works(self, nreals: int) -> bool:
        return self.ok == self.requests > 0 and len(self.reals) == nreals and self.lb_tx == self.to_lb

    @property
    def spread_ok(self) -> bool:
        return bool(self.spread) and all(s["held"] for s in self.spread)

    @property
    def pmtu_ok(self) -> bool:
        p = self.pmtu
        return p is not None and p["learnt_mtu"] == p["expected_mtu"] and p["lb_too_big"] > 0 \
            and p["resend"] == "EMSGSIZE"

    @property
    def churn_ok(self) -> bool:
        c = self.churn
        return c is not None and c["on_removed"] > 0 and c["reset"] == c["on_removed"] and c["collateral"] == 0 \
            and c["new_flows"] > 0 and c["new_to_removed"] == 0 and c["new_failed"] == 0

    def held(self, nreals: int) -> bool:
        return self.works(nreals) and self.dsr_ok and self.spread_ok and self.pmtu_ok and self.churn_ok


def lbctl(lab: str, args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "balancer.cli", "--instance", f"{lab}-lb", *args]
    done = subprocess.run(nsenter_argv(netns_name(lab, "lb"), argv), capture_output=True, text=True,
                          timeout=60, cwd=REPO, check=False)
    if check and done.returncode != 0:
        raise LabError(f"lbctl {' '.join(args)} failed: {done.stderr.strip()}", command=" ".join(argv))
    return done


def _in_node(lab: str, node: str, argv: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(nsenter_argv(netns_name(lab, node), list(argv)), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, check=False)


def _apply(lab: str, conf: cfg.Config, work: Path, name: str) -> None:
    conf_file = work / f"lb-{name}.toml"
    conf_file.write_text(cfg.dump(conf))
    lbctl(lab, ["apply", str(conf_file)])


def _stats(lab: str) -> dict[str, Any]:
    """What `lbctl stats --json` prints, read in this process from the instance's pinned maps (no
    interpreter start-up per reading: the demo reads the counters 20 times)."""

    inst = Instance.open(f"{lab}-lb")
    try:
        stats: dict[str, Any] = inst.stats()
    finally:
        inst.close()
    return stats


def _delta(before: dict[str, Any], after: dict[str, Any], reason: str) -> int:
    return int(after["reasons"][reason]["packets"] - before["reasons"][reason]["packets"])


def run_traffic(lab: str, topo: topology.Topology, run: EncapRun, requests: int, work: Path) -> None:
    """HTTP and UDP through the VIPs of the encap's family, with the LB's link captured (works, DSR)."""
    case = by_id(run.encap_id)
    fam = case.vip_family
    conf = balancer_config(topo, lab, encaps={fam: case.config_name})
    _apply(lab, conf, work, run.encap_id)
    vips = {str(v.address) for v in conf.vips}
    clients = {str(a.ip) for link in topo.links for ep in link.endpoints if ep.node == "client"
               for a in ep.all_addresses if a.version == fam}
    before = _stats(lab)
    arms = [lb_link(topo), *([egress[:3]] if (egress := egress_link(topo)) else [])]  # in (and out, two-arm)
    pcaps = [work / f"{run.encap_id}-{lb_if}.pcap" for lb_if, _, _ in arms]
    caps = [Capture(lab, router, router_if, pcap) for (_, router, router_if), pcap in zip(arms, pcaps, strict=True)]
    try:
        for vip in sorted(vips):
            for kind, port in (("http", 80), ("udp", UDP_PORT)):
                argv = [sys.executable, "-m", "lab.nodes.traffic", kind, "--vip", vip, "--port", str(port),
                        "--count", str(requests)] + [a for c in sorted(clients) for a in ("--source", c)]
                done = _in_node(lab, "client", argv, timeout=120)
                if done.returncode != 0:
                    run.errors.append(done.stderr.strip()[-300:])
                    continue
                for r in json.loads(done.stdout):
                    run.requests += 1
                    if "error" in r or (kind == "http" and r.get("status") != 200) or \
                            (kind == "udp" and not r.get("echoed")):
                        run.errors.append(r.get("error", str(r)))
                        continue
                    run.ok += 1
                    run.reals[r["node"]] = run.reals.get(r["node"], 0) + 1
    finally:
        _settled(pcaps[-1], lambda: _stats(lab)["reasons"]["TX_ENCAP"]["packets"])
        for cap in caps:
            cap.stop()
    run.lb_tx = _delta(before, _stats(lab), "TX_ENCAP")
    counts = [classify_lb_link(pcap, peer_mac(lab, "lb", lb_if).lower(), vips, clients, GUE_PORT)
              for (lb_if, _, _), pcap in zip(arms, pcaps, strict=True)]
    run.to_lb, run.from_lb, run.stray = counts[0].to_lb, counts[-1].from_lb, [s for c in counts for s in c.stray]
    if len(counts) == 2:  # two-arm: nothing encapsulated comes back by the ingress, nothing goes in by the egress
        run.stray += [f"{counts[0].from_lb} encapsulated by the ingress arm"] * bool(counts[0].from_lb)
        run.stray += [f"{counts[1].to_lb} client→VIP by the egress arm"] * bool(counts[1].to_lb)


def _settled(pcap: Path, lb_sent: Callable[[], int], quiet_s: float = 0.2, deadline_s: float = 3.0) -> None:
    """Wait until the capture file and the LB's encap counter have stopped changing for quiet_s: the
    last frame the LB sent (a closing ACK) is on file before tcpdump stops, so in and out still match."""
    def reading() -> tuple[int, int]:
        return (pcap.stat().st_size if pcap.exists() else 0, lb_sent())

    last, since = [reading()], [time.monotonic()]

    def quiet() -> bool:
        now = reading()
        if now != last[0]:
            last[0], since[0] = now, time.monotonic()
            return False
        return time.monotonic() - since[0] >= quiet_s

    poll(deadline_s, quiet, "the capture and the LB's counter still", check=False)


def run_spread(topo: topology.Topology, run: EncapRun) -> None:
    """The NIC model's queues for the outer headers the balancer program writes (no lab traffic)."""
    import numpy as np

    case = by_id(run.encap_id)
    fam, mode = case.vip_family, case.config_name
    vip = next(str(v.address) for v in topo.vips if v.address.version == fam)
    reals = sorted(real_addresses(topo, fam).values(), key=lambda a: ipaddress.ip_address(a).packed)
    src4 = next(str(p) for p in topo.lb_source_prefixes if p.version == 4)
    src6 = next(str(p) for p in topo.lb_source_prefixes if p.version == 6)
    hasher, reta = Toeplitz(), indirection_table(NQUEUES)
    obj = str(REPO / "build" / "bpf" / "balancer.o")
    for outer_src in ("fixed", "flow"):
        out = emit_flows(obj, vip=vip, port=80, reals=reals, encap=case.mode, flow_src=outer_src == "flow",
                         src4=src4, src6=src6, flows=SPREAD_FLOWS, real=reals[0])
        # IPIP carries no ports a NIC parses: it is hashed on addresses whatever the NIC's setting.
        for fields in (("sd",) if mode == "ipip" else ("sd", "sdfn")):
            rows = np.concatenate([out.src, out.dst] + ([out.ports] if fields == "sdfn" else []), axis=1)
            queues = queues_of(hasher.hash(rows), reta)
            s = spread(queues, NQUEUES)
            used = sum(1 for c in s.counts if c)
            one_queue = outer_src == "fixed" and fields == "sd"
            held = out.flows > 0 and (used == 1 if one_queue else s.max_over_mean <= MAX_OVER_MEAN)
            run.spread.append({"name": f"{outer_src}-src-{fields}", "queues_used": used, "nqueues": NQUEUES,
                               "max_over_mean": round(s.max_over_mean, 3), "held": held,
                               "rss": {"name": f"{mode}-{outer_src}-src-{fields}", "queue_counts": list(s.counts),
                                       "nqueues": NQUEUES, "flows": int(queues.size),
                                       "max_over_mean": round(s.max_over_mean, 4), "chi2": round(s.chi2, 3),
                                       "p_value": s.p_value, "counted": "flows", "source": "model"}})


def run_pmtu(lab: str, topo: topology.Topology, run: EncapRun) -> None:
    """One DF datagram of PMTU_SIZE bytes to the VIP: the LB's ICMP and the MTU the client learnt."""
    fam = by_id(run.encap_id).vip_family
    vip = next(str(v.address) for v in topo.vips if v.address.version == fam)
    flush = ["sh", "-c", "ip -4 route flush cache && ip -6 route flush cache"]
    _in_node(lab, "client", flush)  # each encap starts from the link's MTU
    before = _stats(lab)
    done = _in_node(lab, "client", [sys.executable, "-m", "lab.nodes.udp_df", "--vip", vip,
                                    "--port", str(UDP_PORT), "--size", str(PMTU_SIZE), "--wait", "2"])
    if done.returncode != 0:
        run.errors.append(f"pmtu probe: {done.stderr.strip()[-300:]}")
        return
    probe = json.loads(done.stdout)
    run.pmtu = {"sent_bytes": PMTU_SIZE, "expected_mtu": PMTU_SIZE - by_id(run.encap_id).overhead,
                "learnt_mtu": probe["mtu_learnt"] if probe["mtu_learnt"] < PMTU_SIZE else None,
                "lb_too_big": _delta(before, _stats(lab), "TX_ICMP_TOO_BIG"), "resend": probe["resend"]}


def _ring_collateral(topo: topology.Topology, fam: int) -> tuple[int, int]:
    """(slots moved between surviving reals, ring size) when MOVED leaves the lab's ring."""
    import numpy as np

    addrs = real_addresses(topo, fam)
    ids = {node: i for i, node in enumerate(sorted(addrs), start=1)}
    size = maglev.DEFAULT_RING_SIZE
    full = maglev.build_ring({ids[n]: (a, 1) for n, a in addrs.items()}, size)
    less = maglev.build_ring({ids[n]: (a, 1) for n, a in addrs.items() if n != MOVED}, size)
    changed = int(np.count_nonzero(full != less))
    return changed - int(np.count_nonzero(full == ids[MOVED])), size


@contextlib.contextmanager
def echo_services(lab: str, topo: topology.Topology) -> Iterator[None]:
    """A line echo on ECHO_PORT of every VIP on every real, pinned to CPU 0 (as test_churn does)."""
    binds = [f"[{v.address}]:{ECHO_PORT}" if v.address.version == 6 else f"{v.address}:{ECHO_PORT}"
             for v in topo.vips]
    with Services(lab, sorted(real_addresses(topo, 4)), "echo", binds, cpu=0):
        yield


def _kill_echo_connections(lab: str, topo: topology.Topology) -> None:
    """The removed real keeps its connections ESTABLISHED (nothing reaches it): end them."""
    for node in sorted(real_addresses(topo, 4)):
        _in_node(lab, node, ["ss", "-K", "-tn", "state", "connected", "sport", "=", f":{ECHO_PORT}"])


def run_churn(lab: str, topo: topology.Topology, run: EncapRun, work: Path) -> None:
    """CHURN_CONNS live connections to the echo VIP, then MOVED removed from it with `lbctl real del`."""
    case = by_id(run.encap_id)
    fam = case.vip_family
    conf = balancer_config(topo, lab, encaps={fam: case.config_name})
    first: dict[Any, cfg.Vip] = {}
    for v in conf.vips:
        first.setdefault(v.address, v)
    _apply(lab, replace(conf, vips=tuple(replace(v, port=ECHO_PORT, proto="tcp") for v in first.values())),
           work, f"{run.encap_id}-churn")
    vip = next(str(a) for a in first)
    address = real_addresses(topo, fam)[MOVED]
    _kill_echo_connections(lab, topo)
    try:
        with ChurnClient(lab, "client", vip, ECHO_PORT, "--conns", str(CHURN_CONNS), "--interval", "0.25",
                         "--timeout", "2.0", "--new-every", "0.05", "--cpu", "0") as client:
            client.mark("change")
            lbctl(lab, ["real", "del", vip, str(ECHO_PORT), "tcp", address])
            applied = client.mark("applied")
            report = client.stop(after=CHURN_OBSERVE_S)
    finally:
        _kill_echo_connections(lab, topo)
    conns = report["conns"]
    victims = [c for c in conns if c["node"] == MOVED]
    late = [f for f in report["new"] if f["t"] > applied]
    slots, size = _ring_collateral(topo, fam)
    run.churn = {"connections": len(conns), "on_removed": len(victims),
                 "reset": sum(c["status"] == "reset" for c in victims),
                 "collateral": sum(c["status"] != "ok" for c in conns if c["node"] != MOVED),
                 "new_flows": len(late), "new_to_removed": sum(f.get("node") == MOVED for f in late),
                 "new_failed": sum("error" in f for f in late), "ring_collateral_slots": slots, "ring_size": size}


def _spread_text(run: EncapRun) -> str:
    """`fixed: sd 1/8q sdfn 1.04; flow: sd 1.05 …`: queues used where not all, else max/mean."""
    groups: dict[str, list[str]] = {}
    for s in run.spread:
        source, _, fields = s["name"].partition("-src-")
        figure = f"{s['queues_used']}/{s['nqueues']}q" if s["queues_used"] < s["nqueues"] else \
            f"{s['max_over_mean']:.2f}"
        groups.setdefault(source, []).append(f"{fields} {figure}")
    return "; ".join(f"{k}: {' '.join(v)}" for k, v in groups.items()) or "–"


def _pmtu_text(run: EncapRun) -> str:
    p = run.pmtu
    return "–" if p is None else f"{p['learnt_mtu'] or 'none'} (want {p['expected_mtu']})"


def _churn_text(run: EncapRun) -> str:
    c = run.churn
    return "–" if c is None else f"{c['reset']}/{c['on_removed']} reset, {c['collateral']} collateral"


def summary(runs: list[EncapRun], nreals: int) -> str:
    """The per-encap table the demo prints: each column a figure it checked, and whether it held."""
    def mark(ok: bool) -> str:
        return "" if ok else " ✗"

    head = f"{'encap':<11}{'works':<12}{'DSR (replies via LB)':<22}" \
           f"{'RSS spread by outer source (max/mean, or queues)':<52}{'PMTU learnt':<18}" \
           f"{'churn (1 of 3 removed)':<28}result"
    lines = [head, "-" * len(head)]
    for r in runs:
        works = f"{r.ok}/{r.requests}{mark(r.works(nreals))}"
        dsr = f"{'held' if r.dsr_ok else 'NO'} ({len(r.stray)})"
        lines.append(f"{r.encap_id:<11}{works:<12}{dsr:<22}{_spread_text(r) + mark(r.spread_ok):<52}"
                     f"{_pmtu_text(r) + mark(r.pmtu_ok):<18}{_churn_text(r) + mark(r.churn_ok):<28}"
                     f"{'ok' if r.held(nreals) else 'FAILED'}")
    return "\n".join(lines)


def write_outputs(runs: list[EncapRun], nreals: int, results: Path | None = None,
                  out: Path = REPO / "reports" / "out" / "index.html", shape: str = "one-arm",
                  topology_name: str = "default") -> Path | None:
    """The demo result (with the LB's `shape` and the topology it ran), plus rss and pmtu results of
    the same figures (into `results`, default the results directory); then the report at `out`."""
    try:
        from reports import render, schema  # the report extra is optional: without it the demo writes no report
    except ImportError:
        return None
    encaps = []
    for r in runs:
        encaps.append({"encap": r.encap_id, "requests": r.requests, "ok": r.ok, "reals_seen": sorted(r.reals),
                       "lb_saw_only_client_to_vip": r.dsr_ok, "to_lb": r.to_lb, "from_lb": r.from_lb,
                       "replies_via_lb": len(r.stray),
                       "spread": [{k: v for k, v in s.items() if k != "rss"} for s in r.spread],
                       "pmtu": r.pmtu, "churn": r.churn})
        if r.spread:
            schema.write_result("rss", schema.case_id("demo_spread", r.encap_id),
                                {"scenarios": [s["rss"] for s in r.spread]}, results)
        if r.pmtu is not None:
            p = r.pmtu
            schema.write_result("pmtu", schema.case_id("demo_pmtu", r.encap_id), {"encap": r.encap_id, "scenarios": [
                {"name": "udp-df", "completed": p["learnt_mtu"] == p["expected_mtu"], "seconds": 0.0,
                 "route_mtu": p["learnt_mtu"]}]}, results)
    schema.write_result("demo", "demo", {"encaps": encaps, "shape": shape, "topology": topology_name}, results)
    return render.render(results, out=out)


def _step(what: str) -> Callable[[], None]:
    """Print `what` now and its duration when the returned function is called."""
    t0 = time.monotonic()
    print(f"  {what} ...", end="", flush=True)
    return lambda: print(f" {time.monotonic() - t0:.1f} s", flush=True)


def _throughput() -> list[str]:
    """The software bench of every encap, a few seconds each (its result written); its table's lines."""
    done = _step("throughput of every encap: the software bench, a few seconds each")
    report = demo_bench.throughput(say=lambda _line: None)
    done()
    return demo_bench.table(report)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="l4lab demo", description="Compare the encap modes on real traffic.")
    ap.add_argument("--name", default="l4lab", help="lab name (default l4lab)")
    ap.add_argument("--topology", default="default", help="a name from lab/topologies or a path (default %(default)s)")
    ap.add_argument("--requests", type=int, default=16, help="requests per VIP, service and encap")
    ap.add_argument("--encap", action="append", choices=sorted(SAME_FAMILY), help="default: all")
    ap.add_argument("--no-bench", action="store_true",
                    help="skip the throughput comparison (the software bench, a few seconds per encap)")
    ap.add_argument("--nic", action="store_true",
                    help="also measure the spread on a real NIC: a VM real with a 4-queue virtio-net doing "
                         "Toeplitz RSS (lab/nicdemo.py; about 45 s more, so not in the one-minute default)")
    args = ap.parse_args(argv)
    topo = topology.load(args.topology)
    nreals = len(topo.nodes_with_role("real"))
    lb_shape = shape(topo)
    if lb_shape == "bond-vlan":
        raise UsageError(f"l4lab demo drives an LB in a namespace, and topology '{topo.name}' has it in a VM: "
                         "run its checks with `pytest suites/conformance/test_bond_vlan.py`")
    runs = [EncapRun(encap_id) for encap_id in args.encap or list(SAME_FAMILY)]
    started = time.monotonic()
    with ExitStack() as stack:
        done = _step(f"lab '{args.name}' ({args.topology}) up")
        netns.build(topo, args.name)
        stack.callback(netns.teardown, args.name)
        done()
        work = state_dir(args.name)
        first = by_id(runs[0].encap_id)  # the load's config: its egress (two-arm) is fixed at load
        (work / "lb-load.toml").write_text(cfg.dump(balancer_config(
            topo, args.name, encaps={first.vip_family: first.config_name})))
        # Journaled first: an lbctl interrupted while it loads leaves its lock or pins, which the lab's
        # teardown (or `l4lab down`) removes as it removes an instance that `l4lab up` loaded.
        netns.journal(args.name, Undo("balancer", f"{args.name}-lb"))
        lbctl(args.name, ["load", "--interface", lb_link(topo)[0], "--mode", "native",
                          "--config", str(work / "lb-load.toml")])
        stack.callback(lbctl, args.name, ["unload"], False)
        for line in lbctl(args.name, ["status"]).stdout.strip().splitlines()[1:]:
            if line.lstrip().startswith(("interface", "egress")):
                print("  " + line.strip())
        stack.enter_context(echo_services(args.name, topo))
        # The RSS model needs no lab: it runs beside the lab traffic, which mostly waits on sockets.
        spreads = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="demo-spread"))
        spread_t0 = time.monotonic()
        pending = [spreads.submit(run_spread, topo, run) for run in runs]
        for run in runs:
            encap_id = run.encap_id
            done = _step(f"{encap_id}: traffic and capture")
            run_traffic(args.name, topo, run, args.requests, work)
            done()
            done = _step(f"{encap_id}: PMTU")
            run_pmtu(args.name, topo, run)
            done()
            done = _step(f"{encap_id}: churn, {MOVED} removed under {CHURN_CONNS} connections")
            run_churn(args.name, topo, run, work)
            done()
            if run.stray or run.errors:
                print(f"    problems: {run.stray[:2] + run.errors[:2]}")
        waited = time.monotonic()
        for future in pending:
            future.result()
        print(f"  RSS spread (model) of every encap, beside the traffic: {time.monotonic() - spread_t0:.1f} s "
              f"(the demo waited {time.monotonic() - waited:.1f} s for it)", flush=True)
        done = _step("lab down")
    done()
    throughput = None if args.no_bench else _throughput()
    print(f"\nthe LB {lb_shape} (topology {topo.name})")
    print(summary(runs, nreals))
    if throughput:
        print("\n" + "\n".join(throughput))
    report = write_outputs(runs, nreals, shape=lb_shape, topology_name=topo.name)
    if report is not None:
        print(f"\nreport: {os.path.relpath(report, Path.cwd())}")
    held = all(r.held(nreals) for r in runs)
    if args.nic:

        done = _step("NIC-measured spread: a VM real with a 4-queue virtio-net (qemu's Toeplitz RSS)")
        spread = nicdemo.nic_spread(flows=48)
        done()
        print(nicdemo.table(spread))
    print(f"\ndemo {'held' if held else 'FAILED'} in {time.monotonic() - started:.1f} s: "
          + ("every request answered by the reals directly (0 replies via the LB), spread, PMTU and churn "
             "as expected" if held else "see the rows marked ✗ above"))
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
