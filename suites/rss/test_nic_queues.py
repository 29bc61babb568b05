"""RSS on an actual NIC: every encap's flows through the balancer, counted by a real's receive queues.

The nic-rss topology's real is a qemu VM whose NIC is a 4-queue virtio-net with qemu's Toeplitz
RSS on (proven at boot by one-flow sends, lab.remote.vm.VmReal.prove_rss). For each encap the LB emits,
each outer source (fixed, or derived from the flow) and each `ethtool -N eth0 rx-flow-hash
udp4|udp6 sd|sdfn` setting (restored afterwards), FLOWS UDP flows go from the client through the
l4lab XDP balancer to the real. Each flow's receive queue is read from the NIC's own per-queue
counters (`ethtool -S`, the same reading as on hardware): flows go in batches of BATCH, flow i of
a batch sending 2**i packets, so each queue's delta names exactly the flows it received
(lab.rss.nic.observe_queues; a batch that does not add up exactly is sent again). A capture of the
frames the router hands to the real gives each flow's outer headers; the Toeplitz model hashes
them with the key and indirection table read from the NIC (`ethtool -x`) under the same setting.
Asserted: every flow on the queue the model predicts (100 %), and the spread verdict, for the NIC
and the model alike:

* outer headers that do not vary (IPIP or 6in6 from a fixed source; GUE from a fixed source hashed
  "sd") → every flow on one queue;
* anything else → spread: every queue used, chi-square p ≥ 0.001 against an even spread
  (lab.rss.nic.spread_verdict).

Results are rss results with one scenario per setting from each source: "model" and "nic:virtio"
("nic:<driver>" on hardware). Also runs against a --target lab (marked hardware) built as nic-rss
or default: there real1's NIC is whatever the host has, the other reals get weight 0, and other
traffic on the NIC makes batches be resent (or the test fail, naming the deltas it saw).
"""

from __future__ import annotations

import ipaddress
import struct
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from balancer.encaps import SAME_FAMILY, by_id
from lab.harness import REPO, Lab, LabBalancer
from lab.lbconf import real_addresses
from lab.nodes.rss_sender import PAYLOAD
from lab.rss.nic import ONE_QUEUE, SPREAD, RssSettings, flow_hash_fields, observe_queues, parse_rss, queue_counters
from lab.rss.nic import spread_verdict as verdict
from lab.rss.toeplitz import Toeplitz, nic_input, queues_of, spread
from reports.schema import Kind, RssPayload, RssScenario, case_id, write_result

# Here the nic-rss lab; on hardware, a target built as nic-rss or default (flows then go to real1 alone).
pytestmark = [pytest.mark.topology("nic-rss", "default"), pytest.mark.hardware]

REAL = "real1"
FLOWS = 24  # per scenario: a spread verdict over 4 queues and the per-flow check
BATCH = 6  # flows per counter reading: 63 packets (a flow of 128 packets overflowed the VM's queue)
FIRST_PORT = 21000
SETTINGS = [(outer_src, fields) for outer_src in ("fixed", "flow") for fields in ("sd", "sdfn")]


def expect_one_queue(mode: str, outer_src: str, fields: str) -> bool:
    """Whether a NIC must put every flow on one queue: nothing in the hashed outer headers varies."""
    return outer_src == "fixed" and (mode == "ipip" or fields == "sd")


def _nic(lab: Lab) -> str:
    vm_end = next(ep for ep in lab.topology.endpoints_of(REAL))
    return lab.ifname(REAL, vm_end.ifname)


def _router_end(lab: Lab) -> str:
    """The router's interface towards the real (a VM's tap here), where the capture sees its frames."""
    for link in lab.topology.links:
        ends = {ep.node: ep for ep in link.endpoints}
        if REAL in ends and "router" in ends:
            return lab.ifname("router", ends["router"].ifname)
    raise AssertionError(f"topology {lab.topology.name} has no router link to {REAL}")


def _source(lab: Lab, nic: str) -> str:
    driver = next((line.split(":", 1)[1].strip() for line in lab.run(REAL, ["ethtool", "-i", nic]).stdout.splitlines()
                   if line.startswith("driver:")), "unknown")
    return "nic:virtio" if driver == "virtio_net" else f"nic:{driver}"


class Sender:
    """The client's flow sender (lab.nodes.rss_sender) as a long-lived process: one batch per call,
    returning once the real echoed the batch (or after the sender's wait): its NIC counted it."""

    def __init__(self, lab: Lab, vip: str, port: int) -> None:
        argv = lab.python_argv("client", "lab.nodes.rss_sender", "--vip", vip, "--port", str(port))
        self.proc = subprocess.Popen(argv,
                                     cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def __call__(self, batch: Sequence[tuple[int, int]]) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(" ".join(f"{sport}:{count}" for sport, count in batch) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer.startswith("sent"):
            why = self.proc.stderr.read() if self.proc.stderr else ""
            raise AssertionError(f"the flow sender stopped: {answer!r} {why}")

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def one_balancer(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabBalancer]:
    """Name: one_balancer. Scope: module. Depends: lab.

    lbctl loaded once for the module in the lab's `lb` node; each test applies its encap's config
    (a load per encap would cost seconds each on a busy machine)::

        def test_x(one_balancer, encap): one_balancer.encap_id = encap; one_balancer.apply(...)
    """
    from balancer import config as cfg
    from lab.lbconf import lb_link

    b = LabBalancer(lab, "lb", SAME_FAMILY[0], tmp_path_factory.mktemp("lb") / "lb.toml")
    text = cfg.dump(b.config_for())
    b.config_path.write_text(text)
    lab.write(b.node, b.config_file, text)
    b.lbctl("load", "--interface", lab.ifname("lb", lb_link(lab.topology, "lb")[0]), "--mode", "native",
            "--config", b.config_file)
    try:
        yield b
    finally:
        b.lbctl("unload", check=False)


@pytest.fixture
def flow_hash(lab: Lab) -> Iterator[dict[str, str]]:
    """Name: flow_hash. Scope: function. Depends: lab.

    real1's NIC rx-flow-hash settings for udp4 and udp6 as found; restored when the test ends::

        def test_x(lab, flow_hash): lab.run("real1", ["ethtool", "-N", "eth0", "rx-flow-hash", "udp4", "sd"])
    """
    nic = _nic(lab)
    saved = {proto: flow_hash_fields(lab.run(REAL, ["ethtool", "-n", nic, "rx-flow-hash", proto]).stdout)
             for proto in ("udp4", "udp6")}
    try:
        yield saved
    finally:
        for proto, fields in saved.items():
            lab.run(REAL, ["ethtool", "-N", nic, "rx-flow-hash", proto, fields], check=False)


def _frames(pcap: Path) -> Iterator[bytes]:
    """The frames of a classic pcap file (tcpdump -w, Ethernet)."""
    data = pcap.read_bytes()
    order = {b"\xd4\xc3\xb2\xa1": "<", b"\xa1\xb2\xc3\xd4": ">",
             b"\x4d\x3c\xb2\xa1": "<", b"\xa1\xb2\x3c\x4d": ">"}.get(data[:4])
    assert order is not None, f"{pcap} is not a pcap file (magic {data[:4].hex()})"
    at = 24
    while at + 16 <= len(data):
        caplen = struct.unpack(order + "I", data[at + 8: at + 12])[0]
        yield data[at + 16: at + 16 + caplen]
        at += 16 + caplen


def _flow_frames(pcap: Path, real: str) -> dict[int, set[bytes]]:
    """{client source port: its encapsulated frames' outer headers} from a capture of the real's link.

    Only frames to `real` count (the real's direct replies to the client are on the link too); the
    frames are cut at the payload, which names the flow (lab.nodes.rss_sender)."""
    dst = ipaddress.ip_address(real).packed
    found: dict[int, set[bytes]] = {}
    for frame in _frames(pcap):
        at = frame.find(PAYLOAD)
        if at < 0 or nic_input(frame, "sd")[len(dst):] != dst:
            continue
        sport = int(frame[at + len(PAYLOAD):].split(b"\0")[0].decode())
        found.setdefault(sport, set()).add(frame[:at])
    return found


def _scenario(name: str, queues: Sequence[int], nqueues: int, source: str) -> RssScenario:
    s = spread(list(queues), nqueues)
    return RssScenario(name=name, queue_counts=list(s.counts), nqueues=nqueues, flows=len(queues),
                       max_over_mean=round(s.max_over_mean, 4), chi2=round(s.chi2, 3), p_value=s.p_value,
                       counted="flows", source=source)


def test_rss_was_proven_on_at_boot(lab: Lab) -> None:
    """The VM's supervisor reported ready only after one-flow sends showed qemu's Toeplitz RSS at work."""
    from lab.remote import vmnodes

    if lab.target is not None:
        pytest.skip("the boot-time proof is the nic-rss VM's; a target's NIC does RSS by itself")
    ready = vmnodes.ready_of(lab.name, REAL)
    proof = ready.rss_proof
    assert proof is not None, f"{REAL} reported ready without an RSS proof: {ready}"
    fixed, flows = proof["fixed_flow"], proof["flows"]
    assert isinstance(fixed, dict) and isinstance(flows, list)
    assert fixed["queue"] == fixed["predicted"], proof
    assert [f["queue"] for f in flows] == [f["predicted"] for f in flows] == list(range(len(flows))), proof
    sys.stdout.write(f"\n{REAL}: booted in {ready.boot_seconds:.1f} s (guest uptime {ready.guest_uptime:.1f} s); "
                     f"RSS proof {proof}\n")


def test_nic_queues(lab: Lab, one_balancer: LabBalancer, encap: str, flow_hash: dict[str, str], tmp_path: Path) -> None:
    fam, mode = by_id(encap).vip_family, by_id(encap).config_name
    balancer = one_balancer
    balancer.encap_id = encap
    nic = _nic(lab)
    proto = "udp4" if fam == 4 else "udp6"
    vip = next(str(v.address) for v in lab.topology.vips if v.address.version == fam)
    port = next(p.port for v in lab.topology.vips for p in v.ports if p.service == "udp-echo")
    source = _source(lab, nic)
    scenarios: list[RssScenario] = []
    failures: list[str] = []
    lines: list[str] = []
    started = time.monotonic()

    def counters() -> dict[int, int]:
        return queue_counters(lab.run(REAL, ["ethtool", "-S", nic]).stdout)

    rss: RssSettings = parse_rss(lab.run(REAL, ["ethtool", "-x", nic]).stdout)
    hasher = Toeplitz(rss.key)
    pcap = tmp_path / "to-real.pcap"
    landed: dict[str, list[int]] = {}
    ports = {name: list(range(FIRST_PORT + 100 * i, FIRST_PORT + 100 * i + FLOWS))
             for i, name in enumerate(f"{mode}-{o}-src-{f}" for o, f in SETTINGS)}
    applied = None
    weights = {n: int(n == REAL) for n in real_addresses(lab.topology, fam)}
    batches: list[list[int]] = []
    sender = Sender(lab, vip, port)
    try:
        with lab.capture("router", _router_end(lab), pcap):
            for (outer_src, fields), name in zip(SETTINGS, ports, strict=True):
                if applied != outer_src:
                    balancer.apply(balancer.config_for(outer_src=outer_src, weights=weights))
                    applied = outer_src
                lab.run(REAL, ["ethtool", "-N", nic, "rx-flow-hash", proto, fields])
                shown = flow_hash_fields(lab.run(REAL, ["ethtool", "-n", nic, "rx-flow-hash", proto]).stdout)
                assert shown == fields, f"ethtool -N {nic} rx-flow-hash {proto} {fields} left it at {shown}"
                landed[name] = observe_queues(ports[name], sender, counters, batch=BATCH, record=batches)
    finally:
        sender.close()
    frames = _flow_frames(pcap, real_addresses(lab.topology, fam)[REAL])
    for (outer_src, fields), name in zip(SETTINGS, ports, strict=True):
        flows = ports[name]
        missing = [p for p in flows if p not in frames]
        assert not missing, f"{name}: the capture towards {REAL} has no frame of flows {missing}"
        inputs = {p: {nic_input(f, fields) for f in frames[p]} for p in flows}  # type: ignore[arg-type]
        varied = {p: len(inputs[p]) for p in flows if len(inputs[p]) != 1}
        assert not varied, f"{name}: flows whose frames the LB encapsulated differently: {varied}"
        predicted = [int(q) for q in queues_of([hasher.hash_bytes(next(iter(inputs[p]))) for p in flows], rss.table)]
        model = _scenario(name, predicted, rss.queues, "model")
        measured = _scenario(name, landed[name], rss.queues, source)
        scenarios += [model, measured]
        matched = sum(1 for a, b in zip(landed[name], predicted, strict=True) if a == b)
        want = ONE_QUEUE if expect_one_queue(mode, outer_src, fields) else SPREAD
        lines.append(f"  {name:<22} nic {measured.queue_counts} model {model.queue_counts} "
                     f"per-flow match {matched}/{len(flows)} verdict nic {verdict(measured.queue_counts)!r} "
                     f"model {verdict(model.queue_counts)!r} (expected {want!r})")
        if matched != len(flows):
            wrong = [(p, a, b) for p, a, b in zip(flows, landed[name], predicted, strict=True) if a != b]
            failures.append(f"{name}: {len(wrong)} flows not on the predicted queue (port, nic, model): {wrong[:8]}")
        for who, counts in (("nic", measured.queue_counts), ("model", model.queue_counts)):
            if verdict(counts) != want:
                failures.append(f"{name}: {who} verdict {verdict(counts)!r} for {counts}, expected {want!r}")
    write_result(Kind.RSS, case_id("test_nic_queues", encap), RssPayload(scenarios=scenarios))
    table = "\n".join(lines)
    sys.stdout.write(f"\n{encap} on {nic} of {REAL} ({source}), {FLOWS} flows per setting, {len(batches)} "
                     f"batches counted for {len(SETTINGS) * -(-FLOWS // BATCH)}, {time.monotonic() - started:.1f} s:"
                     f"\n{table}\n")
    assert not failures, "NIC queues not as the Toeplitz model predicts:\n" + "\n".join(failures) + f"\n{table}"


def test_demo_spread_is_what_the_test_asserts(lab: Lab, one_balancer: LabBalancer, tmp_path: Path) -> None:
    """lab.nicdemo (what `make demo` shows): one encap's four settings on this lab, same verdicts."""
    from lab import nicdemo

    if lab.target is not None:
        pytest.skip("lab.nicdemo drives the netns lab on this machine, not a --target")
    results = nicdemo.measure(lab.name, lab.topology, FLOWS, tmp_path, encaps=["ip4-gue1"])
    got = {(r.outer_src, r.fields): (r.verdict, sum(r.queue_counts)) for r in results}
    want = {(o, f): (ONE_QUEUE if expect_one_queue("gue1", o, f) else SPREAD, FLOWS) for o, f in SETTINGS}
    assert got == want, nicdemo.table(results)
