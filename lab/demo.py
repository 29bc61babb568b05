"""demo.py: `l4lab demo` — real traffic through the XDP balancer in every encap mode, then teardown.

Builds the default lab, loads the balancer in the LB node with `lbctl` (as an operator would),
and for each encap id makes HTTP requests and UDP echoes from the client to the VIP while
capturing the LB's link on the router. It holds only if every request was answered, every real
served, and the capture shows the LB received client→VIP packets only and emitted only
encapsulated ones (replies went straight from the reals to the client: DSR). It prints a summary,
writes a demo result and the HTML report, and always removes the lab.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from balancer import config as cfg
from lab import netns, topology
from lab.capture import Capture, classify_lb_link
from lab.errors import LabError
from lab.lbconf import ENCAP_IDS, balancer_config, lb_link
from lab.nsexec import nsenter_argv
from lab.state import netns_name, state_dir

REPO = Path(__file__).resolve().parent.parent
GUE_PORT = 6080


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

    @property
    def dsr_ok(self) -> bool:
        return not self.stray and self.to_lb > 0 and self.from_lb == self.to_lb

    def held(self, nreals: int) -> bool:
        return (self.ok == self.requests > 0 and len(self.reals) == nreals and self.dsr_ok
                and self.lb_tx == self.to_lb)


def lbctl(lab: str, args: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "balancer.cli", "--instance", f"{lab}-lb", *args]
    done = subprocess.run(nsenter_argv(netns_name(lab, "lb"), argv), capture_output=True, text=True,
                          timeout=60, cwd=REPO, check=False)
    if check and done.returncode != 0:
        raise LabError(f"lbctl {' '.join(args)} failed: {done.stderr.strip()}", command=" ".join(argv))
    return done


def run_encap(lab: str, topo: topology.Topology, encap_id: str, requests: int, work: Path) -> EncapRun:
    fam, encap = ENCAP_IDS[encap_id]
    run = EncapRun(encap_id)
    conf = balancer_config(topo, lab, encaps={fam: encap})
    conf_file = work / f"lb-{encap_id}.toml"
    conf_file.write_text(cfg.dump(conf))
    lbctl(lab, ["apply", str(conf_file)])
    vips = {str(v.address) for v in conf.vips}
    clients = {str(a.ip) for link in topo.links for ep in link.endpoints if ep.node == "client"
               for a in ep.all_addresses if a.version == fam}
    before = json.loads(lbctl(lab, ["stats", "--json"]).stdout)
    lb_if, router, router_if = lb_link(topo)
    pcap = work / f"{encap_id}.pcap"
    cap = Capture(lab, router, router_if, pcap)
    try:
        for vip in sorted(vips):
            for kind, port in (("http", 80), ("udp", 9000)):
                argv = [sys.executable, "-m", "lab.traffic", kind, "--vip", vip, "--port", str(port),
                        "--count", str(requests)] + [a for c in sorted(clients) for a in ("--source", c)]
                done = subprocess.run(nsenter_argv(netns_name(lab, "client"), argv), capture_output=True,
                                      text=True, timeout=120, cwd=REPO, check=False)
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
        cap.stop()
    after = json.loads(lbctl(lab, ["stats", "--json"]).stdout)
    run.lb_tx = after["reasons"]["TX_ENCAP"]["packets"] - before["reasons"]["TX_ENCAP"]["packets"]
    from lab.lbconf import peer_mac
    counts = classify_lb_link(pcap, peer_mac(lab, "lb", lb_if).lower(), vips, clients, GUE_PORT)
    run.to_lb, run.from_lb, run.stray = counts.to_lb, counts.from_lb, counts.stray
    return run


def summary(runs: list[EncapRun], nreals: int) -> str:
    head = f"{'encap':<12}{'requests':>9}{'ok':>6}  {'reals (answers)':<34}{'to LB':>7}{'from LB':>8}" \
           f"{'LB tx':>7}  {'DSR':<4} result"
    lines = [head, "-" * len(head)]
    for r in runs:
        reals = " ".join(f"{k}:{v}" for k, v in sorted(r.reals.items()))
        lines.append(f"{r.encap_id:<12}{r.requests:>9}{r.ok:>6}  {reals:<34}{r.to_lb:>7}{r.from_lb:>8}"
                     f"{r.lb_tx:>7}  {'yes' if r.dsr_ok else 'NO':<4} {'ok' if r.held(nreals) else 'FAILED'}")
    return "\n".join(lines)


def write_outputs(runs: list[EncapRun], nreals: int) -> Path | None:
    try:
        from reports import render, schema
    except ImportError:
        return None
    payload = {"encaps": [{"encap": r.encap_id, "requests": r.requests, "ok": r.ok,
                           "reals_seen": sorted(r.reals), "lb_saw_only_client_to_vip": r.dsr_ok}
                          for r in runs]}
    schema.write_result("demo", "demo", payload)
    return render.render(out=REPO / "reports" / "out" / "index.html")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="l4lab demo", description="Balance real traffic in every encap mode.")
    ap.add_argument("--name", default="l4demo", help="lab name (default l4demo)")
    ap.add_argument("--topology", default="default")
    ap.add_argument("--requests", type=int, default=24, help="requests per VIP, service and encap")
    ap.add_argument("--encap", action="append", choices=sorted(ENCAP_IDS), help="default: all")
    args = ap.parse_args(argv)
    topo = topology.load(args.topology)
    nreals = len(topo.nodes_with_role("real"))
    runs: list[EncapRun] = []
    with ExitStack() as stack:
        t0 = time.monotonic()
        netns.build(topo, args.name)
        stack.callback(netns.teardown, args.name)
        print(f"lab '{args.name}' ({args.topology}) up in {time.monotonic() - t0:.2f} s")
        work = state_dir(args.name)
        lb_if = lb_link(topo)[0]
        lbctl(args.name, ["load", "--interface", lb_if, "--mode", "native"])
        stack.callback(lbctl, args.name, ["unload"], False)
        print(lbctl(args.name, ["status"]).stdout.strip().splitlines()[1])
        for encap_id in args.encap or list(ENCAP_IDS):
            run = run_encap(args.name, topo, encap_id, args.requests, work)
            runs.append(run)
            print(f"  {encap_id}: {run.ok}/{run.requests} answered by {len(run.reals)} reals"
                  + (f"; problems: {run.stray[:2] + run.errors[:2]}" if run.stray or run.errors else ""))
    print()
    print(summary(runs, nreals))
    report = write_outputs(runs, nreals)
    if report is not None:
        print(f"\nreport: {os.path.relpath(report, Path.cwd())}")
    held = all(r.held(nreals) for r in runs)
    print("\ndemo " + ("held: every request answered by the reals directly, the LB saw only client→VIP"
                       if held else "FAILED: see the rows above"))
    return 0 if held else 1


if __name__ == "__main__":
    sys.exit(main())
