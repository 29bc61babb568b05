"""IPIP vs GUE RSS spread: which receive queue a real's NIC, and which CPU a real's kernel, gives each flow.

NIC model (test_nic_queue_spread). The flows come from BPF_PROG_TEST_RUN of the real balancer
program (lab/emitted.py): 36,000 client flows from many source addresses and
ports, one SYN each, through a VIP with the default lab's three reals, outer source prefixes and
Maglev ring. Test runs rather than lab traffic because the NIC model only needs the headers the
balancer writes, and the program's own code writes them: 36,000 test runs take under a second,
while as many real connections through the lab would take minutes on two vCPUs and exercise
nothing more of the header-writing code. The frames sent to one real (about 12,000 flows, at
least 10,000 asserted) are hashed as a NIC does (lab/rss/toeplitz.py: Toeplitz with the standard key over
"sd" = addresses or "sdfn" = addresses + ports, then a 128-entry indirection table over 8 queues).
IPIP carries no ports a NIC parses, so it is hashed "sd" whatever the NIC's setting. Expected:

* IPIP, fixed outer source → every flow on one queue;
* IPIP, flow-derived outer source → spread;
* GUE, fixed outer source → one queue under "sd", spread under "sdfn" (the UDP source port varies);
* GUE, flow-derived outer source → spread under both.

Spread means max/mean ≤ 1.25 over the 8 queues; the chi-square p-value against a uniform spread is
reported beside it. Every scenario is written as an rss result (source "model", counted "flows").

Kernel view (test_kernel_rps_cpu). With RPS on real1's veth (rps_cpus = every online CPU), the
kernel's own software flow hash picks the CPU that processes each packet. real1 runs a TCP
server (lab/nodes/rps.py) on a VIP port that only real1 serves; it answers every
connection with SO_INCOMING_CPU, the CPU that received the connection's last packet. The client
opens RPS_FLOWS connections. Asserted only what is robust: every connection is answered from an
RPS CPU, and where the outer headers vary per flow (flow-derived source, or GUE's source port) the
flows use more than one CPU. Which CPU a fixed-source IPIP flow gets is reported, not asserted:
the kernel's flow dissector follows IPIP into the inner header (a NIC does not), so RPS spreads
even that case. The results are written as rss results (source "measured", counted "flows").
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from balancer import _abi
from balancer import config as cfg
from balancer.encaps import IP4_GUE1, IP4_IPIP, IP6_IP6IP6, by_id
from lab.dut import Capability
from lab.emitted import emit_flows
from lab.harness import REPO, Lab, LabBalancer
from lab.lbconf import real_addresses
from lab.nsexec import nsenter_argv
from lab.rss.toeplitz import Toeplitz, indirection_table, queues_of, spread
from lab.topology import load as load_topology
from reports.schema import Kind, RssPayload, RssScenario, case_id, write_result

# Fixed against flow-derived outer sources: the outer source must be configurable.
pytestmark = [pytest.mark.topology("default"), pytest.mark.needs(Capability.OUTER_SOURCE_CHOICE)]
FLOWS = 36_000  # through the program; about a third land on the real under study
MIN_FLOWS = 10_000
NQUEUES = 8
MAX_OVER_MEAN = 1.25
RPS_FLOWS = 48
RPS_PORT = 8081
BALANCER_OBJ = REPO / "build" / "bpf" / "balancer.o"
MODES = {"ipip": _abi.Encap.IPIP, "gue1": _abi.Encap.GUE1, "gue0": _abi.Encap.GUE0}


def _need_datapath() -> None:
    if os.geteuid() != 0:
        pytest.skip("BPF_PROG_TEST_RUN needs root (CAP_BPF): run as root, e.g. sudo make test")
    if not BALANCER_OBJ.exists():
        pytest.skip(f"{BALANCER_OBJ} is missing: run make bpf")


def _scenario(name: str, queues: npt.NDArray[np.integer[Any]], nqueues: int, source: str) -> RssScenario:
    s = spread(queues, nqueues)
    return RssScenario(name=name, queue_counts=list(s.counts), nqueues=nqueues, flows=int(queues.size),
                       max_over_mean=round(s.max_over_mean, 4), chi2=round(s.chi2, 3), p_value=s.p_value,
                       counted="flows", source=source)  # type: ignore[arg-type]


@pytest.mark.needs(Capability.PACKET_TEST_RUN)
def test_nic_queue_spread(encap: str) -> None:
    _need_datapath()
    fam, mode = by_id(encap).vip_family, by_id(encap).config_name
    topo = load_topology("default")
    vip = next(str(v.address) for v in topo.vips if v.address.version == fam)
    reals = sorted(real_addresses(topo, fam).values(), key=lambda a: ipaddress.ip_address(a).packed)
    src4 = next(str(p) for p in topo.lb_source_prefixes if p.version == 4)
    src6 = next(str(p) for p in topo.lb_source_prefixes if p.version == 6)
    hasher = Toeplitz()
    reta = indirection_table(NQUEUES)
    scenarios: list[RssScenario] = []
    failures: list[str] = []
    for outer_src in ("fixed", "flow"):
        out = emit_flows(str(BALANCER_OBJ), vip=vip, port=80, reals=reals, encap=MODES[mode],
                         flow_src=outer_src == "flow", src4=src4, src6=src6, flows=FLOWS, real=reals[0])
        assert out.verdicts == {3: FLOWS}, f"every SYN must be XDP_TXed; verdicts {out.verdicts}"
        assert out.flows >= MIN_FLOWS, f"only {out.flows} of {FLOWS} flows went to {reals[0]}"
        srcs = {bytes(r) for r in out.src}
        if outer_src == "fixed":
            assert len(srcs) == 1, f"fixed outer source, yet {len(srcs)} distinct sources"
        for fields in (("sd",) if mode == "ipip" else ("sd", "sdfn")):
            rows = np.concatenate([out.src, out.dst] + ([out.ports] if fields == "sdfn" else []), axis=1)
            queues = queues_of(hasher.hash(rows), reta)
            name = f"{mode}-{outer_src}-src-{fields}"
            sc = _scenario(name, queues, NQUEUES, "model")
            scenarios.append(sc)
            one_queue = outer_src == "fixed" and fields == "sd"
            used = sum(1 for c in sc.queue_counts if c)
            if one_queue and used != 1:
                failures.append(f"{name}: expected every flow on one queue, got {sc.queue_counts}")
            if not one_queue and sc.max_over_mean > MAX_OVER_MEAN:
                failures.append(f"{name}: max/mean {sc.max_over_mean} > {MAX_OVER_MEAN}: {sc.queue_counts} "
                                f"(p={sc.p_value:.3g})")
    write_result(Kind.RSS, case_id("test_nic_queue_spread", encap), RssPayload(scenarios=scenarios))
    table = "\n".join(f"  {s.name:<24} max/mean {s.max_over_mean:<6} p {s.p_value:<10.3g} {s.queue_counts}"
                      for s in scenarios)
    sys.stdout.write(f"\n{encap}, {scenarios[0].flows} flows to {reals[0]}, {NQUEUES} queues:\n{table}\n")
    assert not failures, "RSS spread not as expected:\n" + "\n".join(failures) + f"\nall scenarios:\n{table}"


# --- the kernel's RPS view --------------------------------------------------------------------------------


def _online_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def _sysfs_write(lab: Lab, node: str, path: str, value: str) -> str:
    """Write a /sys file of node's network namespace and return what it reads back afterwards.

    sysfs shows the devices of the namespace that mounts it, so it is mounted afresh in a private
    mount namespace (`ip netns exec` does the same, but also hides /sys/fs/bpf).
    """
    done = lab.run(node, ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                          f"mount -t sysfs sysfs /sys && echo {value} > {path} && cat {path}"])
    return done.stdout.strip()


@pytest.fixture(scope="module")
def rps_on_real1(lab: Lab) -> Iterator[list[int]]:
    """Name: rps_on_real1. Scope: module. Depends: lab.

    RPS over every online CPU on real1's link; yields the CPUs, restores rps_cpus 0 afterwards::

        def test_x(lab, rps_on_real1): cpus = rps_on_real1
    """
    cpus = _online_cpus()
    if len(cpus) < 2:
        pytest.skip("RPS steering needs at least 2 CPUs; this machine has 1")
    digits = f"{sum(1 << c for c in cpus):x}"
    digits = digits.zfill(-(-len(digits) // 8) * 8)
    mask = ",".join(digits[i: i + 8] for i in range(0, len(digits), 8))  # 32-bit groups, as sysfs shows them
    path = "/sys/class/net/r1-rt/queues/rx-0/rps_cpus"
    got = _sysfs_write(lab, "real1", path, mask)
    if int(got.replace(",", ""), 16) != int(mask.replace(",", ""), 16):
        _sysfs_write(lab, "real1", path, "0")
        raise AssertionError(f"rps_cpus of r1-rt reads {got!r} after writing {mask!r}: is RPS compiled in?")
    try:
        yield cpus
    finally:
        _sysfs_write(lab, "real1", path, "0")


@pytest.mark.parametrize(("encap", "outer_src"), [(IP4_IPIP, "fixed"), (IP4_IPIP, "flow"),
                                                  (IP4_GUE1, "fixed"), (IP6_IP6IP6, "fixed")],
                         indirect=["encap"])
def test_kernel_rps_cpu(lab: Lab, balancer: LabBalancer, encap: str, outer_src: str, rps_on_real1: list[int],
                        tmp_path: Path) -> None:
    fam, mode = by_id(encap).vip_family, by_id(encap).config_name
    vip = next(v.address for v in lab.topology.vips if v.address.version == fam)
    real1 = real_addresses(lab.topology, fam)["real1"]
    base = balancer.config_for(outer_src=outer_src)
    probe = cfg.Vip(address=vip, port=RPS_PORT, proto="tcp", encap=mode,  # type: ignore[arg-type]
                    outer_src=outer_src,  # type: ignore[arg-type]
                    reals=(cfg.Real(address=ipaddress.ip_address(real1)),))
    balancer.apply(dataclasses.replace(base, vips=(*base.vips, probe)))
    clients = sorted({str(a.ip) for link in lab.topology.links for ep in link.endpoints
                      if ep.node == "client" for a in ep.all_addresses if a.version == fam})

    server = subprocess.Popen(
        nsenter_argv(lab.netns("real1"), [sys.executable, "-m", "lab.nodes.rps", "serve",
                                          "--bind", str(vip), "--port", str(RPS_PORT),
                                          "--count", str(RPS_FLOWS)]),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        ready = server.stdout.readline()
        assert ready.startswith("listening"), f"the RPS probe server did not start: {ready!r} " \
                                              f"{server.stderr.read() if server.stderr else ''}"
        # The client runs on one CPU: without RPS every request would be received on that CPU.
        answers = json.loads(lab.run("client", ["taskset", "-c", str(rps_on_real1[0]), sys.executable, "-m",
                                                "lab.nodes.rps", "connect", "--vip", str(vip),
                                                "--port", str(RPS_PORT), "--count", str(RPS_FLOWS),
                                                *[a for c in clients for a in ("--source", c)]]).stdout)
        server_out, server_err = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    failed = [a for a in answers if "error" in a]
    assert not failed, f"{len(failed)} of {RPS_FLOWS} probe connections failed: {failed[:3]}; server: {server_err}"
    cpus = [int(a["cpu"]) for a in answers]
    stray = sorted(set(cpus) - set(rps_on_real1))
    assert not stray, f"connections received on CPUs {stray}, outside the RPS set {rps_on_real1}"
    index = {c: i for i, c in enumerate(rps_on_real1)}
    sc = _scenario(f"rps-{mode}-{outer_src}-src", np.array([index[c] for c in cpus]), len(rps_on_real1),
                   "measured")
    write_result(Kind.RSS, case_id("test_kernel_rps_cpu", encap, outer_src), RssPayload(scenarios=[sc]))
    steered = " ".join(f"{a['source']}:{a['sport']}→{a['cpu']}" for a in answers)
    sys.stdout.write(f"\n{encap} outer_src={outer_src}: flows per RPS CPU {sc.queue_counts} "
                     f"(CPUs {rps_on_real1}), p={sc.p_value:.3g}; per flow: {steered}\n")
    varies = outer_src == "flow" or mode != "ipip"
    if varies:
        used = sum(1 for c in sc.queue_counts if c)
        assert used >= 2, (f"{RPS_FLOWS} flows whose outer headers differ all landed on one CPU: "
                           f"{sc.queue_counts}; is RPS on? ({server_out.strip()[-300:]})")
