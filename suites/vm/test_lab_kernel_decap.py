"""The kernel-decap topology: the XDP balancer sends every encapsulation to VM reals whose kernel removes it.

The lab (`mlt-<hex>`, built once for the module) has two reals of kind "vm": qemu VMs booting
Debian's cloud kernel, joined to the router by taps. lbctl loads the balancer in the LB node; for
each encap id the test applies that encapsulation, makes HTTP requests to the VIP from several
client addresses on ports the ring gives to each VM in turn (asked of the program itself,
suites/conformance/_owners.py) and checks that each request was answered by the VM its flow hashes
to, with the router's capture of the LB's link showing only client→VIP packets in and encapsulated
ones out: every answer went from the VM straight back to the client (DSR). Case ids: the
catalogue's same-family cases (balancer/encaps.py): `ip4-ipip` (4in4), `ip4-gue1`, `ip4-gue0` (GUE
variants 1 and 0 on UDP 6080), `ip6-ip6ip6` (6in6), `ip6-gue1`.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from balancer import config as cfg
from balancer.encaps import SAME_FAMILY, EncapCase
from lab import netns, procs, topology
from lab.errors import LabError
from lab.harness import poll, unique_name
from lab.harness.vmlab import vm_skip_reason
from lab.lbconf import balancer_config, lb_link, peer_mac, real_addresses
from lab.netns import Builder, InjectedFailure
from lab.nsexec import entered, nsenter_argv
from lab.observe.capture import Capture, classify_lb_link
from lab.pytest_plugin import record_boot
from lab.remote.vm_init.image import DEFAULT_CACHE_DIR
from lab.services import starttime
from lab.state import LabState, netns_name, state_dir
from suites.lab import probes
from suites.lab.probes import bpf_available

REPO = Path(__file__).resolve().parents[2]
PREFIX = "mlt-"
REQUESTS = 12
CLIENTS = {4: ("192.0.2.2", "192.0.2.3", "192.0.2.4", "192.0.2.5"),
           6: ("2001:db8:c::2", "2001:db8:c::3", "2001:db8:c::4", "2001:db8:c::5")}  # fmt: skip
VIPS = {4: "198.51.100.100", 6: "2001:db8:100::100"}
REALS = {"real1", "real2"}
GUE_PORT = 6080  # kernel-decap.toml: decap.gue_port of both VMs, and the balancer's default
CANDIDATE_PORTS = 24  # client ports asked of the ring per client address and case (all on one VM: 2^-23)


def skip_reason() -> str | None:
    return vm_skip_reason() or bpf_available()


pytestmark = pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))


class RecordingBuilder(Builder):
    """A Builder that records the name of every step (to aim an injected failure at one)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.names: list[str] = []

    @contextmanager
    def _step(self, what: str) -> Iterator[None]:
        self.names.append(what)
        with super()._step(what):
            yield


@dataclass
class KernelDecapLab:
    name: str
    topo: topology.Topology
    steps: list[str]
    loaded: bool = False

    def lbctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "balancer.cli", "--instance", f"{self.name}-lb", *args]
        done = subprocess.run(nsenter_argv(netns_name(self.name, "lb"), argv), capture_output=True, text=True,
                              timeout=60, cwd=REPO, check=False)  # fmt: skip
        if check and done.returncode != 0:
            raise LabError(f"lbctl {' '.join(args)} failed: {done.stderr.strip()}", command=" ".join(argv))
        return done

    def ring_owners(self, family: int, client: str, sports: list[int]) -> dict[int, str]:
        """The VM node the loaded ring gives each flow client:sport -> VIP:80 (the program, test-run)."""
        argv = [sys.executable, "-m", "suites.conformance._owners", "--instance", f"{self.name}-lb",
                "--vip", VIPS[family], "--port", "80", "--client", client,
                "--sports", ",".join(map(str, sports))]  # fmt: skip
        done = subprocess.run(nsenter_argv(netns_name(self.name, "lb"), argv), capture_output=True, text=True,
                              timeout=60, cwd=REPO, check=False)  # fmt: skip
        if done.returncode != 0:
            raise LabError(f"ring owners failed: {done.stderr.strip()}", command=" ".join(argv))
        by_addr = {addr: node for node, addr in real_addresses(self.topo, family).items()}
        answer = json.loads(done.stdout)
        return {port: by_addr.get(answer[str(port)], answer[str(port)]) for port in sports}

    def planned_flows(self, family: int, base_port: int) -> list[tuple[str, int, str]]:
        """REQUESTS flows (client, sport, VM the ring gives it), alternating between the VMs, so that
        both must answer; every sport is fresh (base_port..) so no session or TIME_WAIT interferes."""
        free: dict[str, dict[str, list[int]]] = {}
        for index, client in enumerate(CLIENTS[family]):
            first = base_port + index * CANDIDATE_PORTS
            owners = self.ring_owners(family, client, list(range(first, first + CANDIDATE_PORTS)))
            for port, node in sorted(owners.items()):
                free.setdefault(client, {}).setdefault(node, []).append(port)
        plan: list[tuple[str, int, str]] = []
        wanted = sorted(REALS)
        for i in range(REQUESTS):
            client, node = CLIENTS[family][i % len(CLIENTS[family])], wanted[(i // len(CLIENTS[family])) % 2]
            ports = free[client].get(node, [])
            assert ports, f"the ring gives none of {CANDIDATE_PORTS} ports of {client} to {node}: {free[client]}"
            plan.append((client, ports.pop(0), node))
        return plan


@pytest.fixture(scope="module")
def kd_lab(request: pytest.FixtureRequest) -> Iterator[KernelDecapLab]:
    """The kernel-decap topology up (two VM reals booted) with the balancer loaded in its LB node.

    Name: kd_lab
    Scope: module
    Depends: root, qemu and the cloud kernel, the built BPF objects (skips otherwise)

        def test_x(kd_lab):
            kd_lab.lbctl("apply", conf_file)
    """
    name = unique_name("lbt")
    topo = topology.load("kernel-decap")
    builder = RecordingBuilder(topo, name)
    lab = KernelDecapLab(name, topo, builder.names)
    try:
        state = builder.build()
        for node, seconds in sorted(state.vm_boot_seconds.items()):
            uptime = state.vm_guest_uptime.get(node, float("nan"))
            record_boot(request.config, f"{name}/{node}", seconds, uptime)
            print(f"VM real {node}: booted in {seconds:.2f} s (qemu start to ready, TCG, both VMs at once)")
        conf = state_dir(name) / "lb-initial.toml"
        conf.write_text(cfg.dump(balancer_config(topo, name, encaps={4: "ipip"})))
        lab.lbctl("load", "--interface", lb_link(topo)[0], "--mode", "native", "--config", str(conf))
        lab.loaded = True
        yield lab
    finally:
        if lab.loaded:
            lab.lbctl("unload", check=False)
        probes.remove_lab(name)


def http_get(ns: str, source: str, vip: str, sport: int = 0, timeout: float = 10.0) -> str:
    """GET / on vip:80 from source:sport inside `ns`; the body of a 200 answer (any HTTP/1.x)."""
    with entered(ns):
        sock = socket.socket(socket.AF_INET6 if ":" in vip else socket.AF_INET, socket.SOCK_STREAM)
    with sock:
        sock.settimeout(timeout)
        sock.bind((source, sport))
        sock.connect((vip, 80))
        sock.sendall(f"GET / HTTP/1.0\r\nHost: {vip}\r\n\r\n".encode())
        chunks = []
        while chunk := sock.recv(4096):
            chunks.append(chunk)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    assert head.split(b" ")[1:2] == [b"200"], head
    return body.decode()


@pytest.mark.parametrize("encap_id", SAME_FAMILY)
def test_vm_reals_decapsulate_and_answer_the_client_directly(kd_lab: KernelDecapLab, encap_id: EncapCase) -> None:
    family, encap = encap_id.vip_family, encap_id.config_name
    conf = state_dir(kd_lab.name) / f"lb-{encap_id}.toml"
    conf.write_text(cfg.dump(balancer_config(kd_lab.topo, kd_lab.name, encaps={family: encap})))
    kd_lab.lbctl("apply", str(conf))
    status = json.loads(kd_lab.lbctl("status", "--json").stdout)
    assert {v["encap"] for v in status["vips"]} == {encap}
    before = json.loads(kd_lab.lbctl("stats", "--json").stdout)["reasons"]["TX_ENCAP"]["packets"]
    lb_if, router, router_if = lb_link(kd_lab.topo)
    answers: dict[str, int] = {}
    pcap = state_dir(kd_lab.name) / f"{encap_id}.pcap"
    plan = kd_lab.planned_flows(family, 42000 + 200 * SAME_FAMILY.index(encap_id))
    with Capture(kd_lab.name, router, router_if, pcap):
        for i, (source, sport, owner) in enumerate(plan):
            body = http_get(netns_name(kd_lab.name, "client"), source, VIPS[family], sport)
            node = body.strip().removeprefix("l4lab real server ")
            assert node == owner, f"request {i} from {source}:{sport} (ring: {owner}) answered {body!r}"
            answers[node] = answers.get(node, 0) + 1
        lb_tx = settled_tx_encap(kd_lab) - before  # the last ACKs may still be on their way
    link = classify_lb_link(pcap, peer_mac(kd_lab.name, "lb", lb_if).lower(), {VIPS[family]},
                            set(CLIENTS[family]), GUE_PORT)  # fmt: skip
    print(f"{encap_id}: {REQUESTS} HTTP requests answered by the VMs {answers}; the LB's link carried "
          f"{link.to_lb} client→VIP frames in, {link.from_lb} encapsulated out (the LB counted {lb_tx}), "
          f"stray {link.stray[:3]}")  # fmt: skip
    assert set(answers) == REALS
    assert link.stray == []  # no reply from the VIP crossed the LB's link: the VMs answered directly
    assert link.to_lb >= REQUESTS * 3 and link.from_lb == link.to_lb == lb_tx


def settled_tx_encap(lab: KernelDecapLab, quiet: float = 0.3, timeout: float = 5.0) -> int:
    """The LB's TX_ENCAP count once it has not changed for `quiet` seconds (polled, with a deadline)."""
    seen = {"count": -1, "since": time.monotonic()}

    def quiet_count() -> int | None:
        now = int(json.loads(lab.lbctl("stats", "--json").stdout)["reasons"]["TX_ENCAP"]["packets"])
        if now != seen["count"]:
            seen["count"], seen["since"] = now, time.monotonic()
            return None
        return now if time.monotonic() - seen["since"] >= quiet else None

    count = poll(timeout, quiet_count, "the LB's TX_ENCAP count still", until=lambda n: n is not None, interval_s=0.0)
    assert count is not None
    return count


def _qemus() -> dict[int, int]:
    """{pid: inode of its network namespace} of every live qemu of this checkout (its files are
    under build/vm/; qemus of other checkouts on the machine are not ours to count)."""
    ours = str(DEFAULT_CACHE_DIR).encode() + b"/"
    return {p.pid: p.netns for p in procs.walk(netns=True)
            if p.netns is not None and p.argv and p.argv[0].startswith(b"qemu-system")
            and any(ours in a for a in p.argv)}


def _qemus_of(lab: str) -> list[int]:
    """Pids of live qemu processes inside lab `lab`'s router namespace (where the VMs' taps are)."""
    try:
        inode = os.stat(f"/run/netns/{lab}-router").st_ino
    except FileNotFoundError:
        return []
    return [pid for pid, ns in _qemus().items() if ns == inode]


def _orphan_qemus() -> list[int]:
    """Pids of live qemu processes whose namespace no longer has a name (its lab was removed)."""
    named = {os.stat(p).st_ino for p in Path("/run/netns").iterdir()} | {os.stat("/proc/self/ns/net").st_ino}
    return [pid for pid, ns in _qemus().items() if ns not in named]


def test_status_shows_the_vm_reals(kd_lab: KernelDecapLab) -> None:
    """`l4lab status` reports a VM real by its running qemu (no namespace here) and the addresses it was given."""
    from lab import status

    report = status.collect(kd_lab.name)
    vms = {n["name"]: n for n in report["nodes"] if n["kind"] == "vm"}
    assert set(vms) == set(REALS)
    qemus = set(_qemus_of(kd_lab.name))
    for name, node in vms.items():
        assert node["present"] and node["qemu_pid"] in qemus, f"{name}: {node}"
        assert node["netns"] is None
        want = {str(a) for ep in kd_lab.topo.endpoints_of(name) for a in ep.all_addresses}
        assert {a for i in node["interfaces"] for a in i["addresses"]} == want
    text = status.render(report)
    assert "MISSING" not in text and "NOT RUNNING" not in text, text
    assert all(f"vm qemu pid {vms[n]['qemu_pid']}" in text for n in vms), text


def test_failure_while_the_vms_boot_leaves_nothing(kd_lab: KernelDecapLab) -> None:
    """A build that fails while the VMs boot stops them (mid-boot) and leaves nothing behind."""
    step = next(i for i, s in enumerate(kd_lab.steps, 1) if s.startswith("wait for VM real real1 to boot"))
    name = unique_name("lbt")
    try:
        with pytest.raises(InjectedFailure, match=f"injected failure at step {step}: wait for VM real real1"):
            netns.build(kd_lab.topo, name, fail_at=step)
        assert probes.leftovers(name) == []
        assert _orphan_qemus() == []
    finally:
        probes.remove_lab(name)


def test_down_stops_the_vms_and_leaves_nothing(kd_lab: KernelDecapLab) -> None:
    """Last: the module's lab goes down; its supervisors, its qemus and everything else are gone."""
    state = LabState.load(kd_lab.name)
    vm_procs = [p for p in state.processes if p.node in REALS]
    assert len(vm_procs) == 4  # a supervisor and a qemu per VM
    assert len(_qemus_of(kd_lab.name)) == 2
    kd_lab.lbctl("unload")
    kd_lab.loaded = False
    netns.teardown(kd_lab.name)
    assert [p.pid for p in vm_procs if starttime(p.pid) == p.starttime] == []
    assert _orphan_qemus() == []
    assert probes.leftovers(kd_lab.name) == []
    assert not os.path.exists(f"/run/netns/{kd_lab.name}-router")
