"""Building and removing labs: nothing is left behind, whether a build succeeds, fails or is interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab import netns, topology
from lab.errors import LabError, LabExistsError
from lab.harness import poll, unique_name
from lab.harness.signalled import signal_when
from lab.netns import InjectedFailure
from lab.nsexec import NETNS_DIR, netns_path
from lab.state import LabState, pin_dir, state_dir
from suites.lab import probes
from suites.lab.probes import bpf_available

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the lab needs root")
REPO = Path(__file__).resolve().parents[2]
WITH_BPF = bpf_available() is None


def expected_netns(lab: str, topo: topology.Topology) -> set[str]:
    return {f"{lab}-{n.name}" for n in topo.netns_nodes()}


def expected_processes(topo: topology.Topology) -> int:
    """Processes carrying `--lab`: a real's services or a VM real's supervisor, an LB VM's supervisor, and an
    LB's BGP health hook."""
    return len(topo.nodes_with_role("real")) + len([n for n in topo.bgp_nodes() if n.role == "lb"]) + \
        len([n for n in topo.vm_nodes() if n.role == "lb"])


def missing_for(topo: topology.Topology) -> str | None:
    """Why this machine cannot build `topo` (FRR or qemu missing), or None."""
    from lab import frr
    from lab.remote import vmnodes

    lb_vm = any(n.role == "lb" for n in topo.vm_nodes())
    return (frr.missing() if topo.bgp_nodes() else None) or (vmnodes.missing(lb=lb_vm) if topo.vm_nodes() else None)


@pytest.mark.parametrize("name", topology.shipped())
def test_shipped_topology_builds_and_leaves_nothing(name: str, lab_name: str) -> None:
    topo = topology.load(name)
    if reason := missing_for(topo):
        pytest.skip(reason)
    started = time.monotonic()
    state = netns.build(topo, lab_name, programs=WITH_BPF)
    took = time.monotonic() - started
    print(f"{name}: up in {took:.2f} s ({len(topo.nodes)} nodes, bpf {'on' if WITH_BPF else 'off'})")
    assert state.complete
    assert {p.name for p in Path("/run/netns").glob(f"{lab_name}-*")} == expected_netns(lab_name, topo)
    assert len(probes.lab_processes(lab_name)) == expected_processes(topo)
    assert LabState.load(lab_name).complete
    started = time.monotonic()
    netns.teardown(lab_name)
    print(f"{name}: down in {time.monotonic() - started:.2f} s")
    assert probes.leftovers(lab_name) == []


def test_failure_at_any_step_leaves_nothing(lab_name: str) -> None:
    topo = topology.load("default")
    builder = netns.Builder(topo, lab_name, programs=WITH_BPF)
    builder.build()
    total = builder.steps
    netns.teardown(lab_name)
    assert probes.leftovers(lab_name) == []
    # Every 7th step and the last few (programs, services, completion) is a spread over every kind.
    for k in sorted(set(range(1, total + 1, 7)) | set(range(total - 4, total + 1))):
        with pytest.raises(InjectedFailure, match=f"injected failure at step {k}: "):
            netns.build(topo, lab_name, programs=WITH_BPF, fail_at=k)
        assert probes.leftovers(lab_name) == [], f"after a failure at step {k}"


@pytest.mark.parametrize("step", [2, 30, 90, -3, -1])
def test_keyboard_interrupt_midway_leaves_nothing(step: int, lab_name: str) -> None:
    topo = topology.load("default")
    counter = netns.Builder(topo, lab_name, programs=WITH_BPF)
    counter.build()
    netns.teardown(lab_name)
    k = step if step > 0 else counter.steps + 1 + step
    with pytest.raises(KeyboardInterrupt):
        netns.build(topo, lab_name, programs=WITH_BPF, interrupt_at=k)
    assert probes.leftovers(lab_name) == []


MOMENTS = {
    # The first namespace's file: pyroute2's forked child is making it (the file comes before its mount).
    "netns": lambda lab: any(NETNS_DIR.glob(f"{lab}-*")),
    # A real's services: namespaces, links, programs and pins are made by then.
    "services": lambda lab: bool(probes.lab_processes(lab)),
}


@pytest.mark.parametrize(("signum", "moment"), [(signal.SIGTERM, "netns"), (signal.SIGHUP, "netns"),
                                                (signal.SIGINT, "netns"), (signal.SIGTERM, "services")])
def test_a_signalled_up_unwinds_and_leaves_nothing(signum: int, moment: str, lab_name: str) -> None:
    """`timeout`, systemd or a closed terminal ends `l4lab up` by a signal: it unwinds as on Ctrl-C, exits
    130 and leaves nothing, also when the signal lands while a namespace or a process is being made."""
    argv = [sys.executable, "-m", "lab.cli", "up", "default", "--name", lab_name, *([] if WITH_BPF else ["--no-bpf"])]
    ended = signal_when(argv, lambda _pid: MOMENTS[moment](lab_name), signum, what=f"the lab's {moment}", cwd=REPO,
                        interval_s=0.001)
    assert ended.returncode == 130, ended.stderr[-2000:]
    assert ended.last_line() == "l4lab: interrupted", ended.stderr[-2000:]
    assert probes.leftovers(lab_name) == []


def test_status_tells_a_lab_being_built_from_one_whose_builder_died(lab_name: str) -> None:
    """An incomplete lab is either still being built or left by a killed `l4lab up` (SIGKILL, the OOM
    killer): status tells which, by the builder's pid and start time, and names `down` for the second;
    `down` refuses the first, whose builder would go on making what it removed."""
    from lab import status

    argv = [sys.executable, "-m", "lab.cli", "up", "default", "--name", lab_name, *([] if WITH_BPF else ["--no-bpf"])]
    up = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        journal = state_dir(lab_name) / "state.json"
        poll(60, lambda: journal.exists() or up.poll() is not None, "the lab's first journal entry", interval_s=0.001)
        up.send_signal(signal.SIGSTOP)  # held where it is: alive, and the lab not complete
        report = status.collect(lab_name)
        assert not report["complete"] and report["builder"] == {"pid": up.pid, "alive": True}, report
        assert f"INCOMPLETE: being built by pid {up.pid}" in status.render(report)
        down = subprocess.run([sys.executable, "-m", "lab.cli", "down", "--name", lab_name], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert down.returncode == 1, down.stderr
        assert f"lab '{lab_name}' is being built by pid {up.pid}: stop that first" in down.stderr
        assert state_dir(lab_name).exists()
        up.kill()
        up.wait()
        report = status.collect(lab_name)
        assert report["builder"] == {"pid": up.pid, "alive": False}
        assert (f"INCOMPLETE: its builder (pid {up.pid}) ended; `l4lab down --name {lab_name}` removes it"
                in status.render(report))
        down = subprocess.run([sys.executable, "-m", "lab.cli", "down", "--name", lab_name], cwd=REPO,
                              capture_output=True, text=True, timeout=120)
        assert down.returncode == 0, down.stderr
        assert not state_dir(lab_name).exists()
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        probes.remove_lab(lab_name)  # a step the kill cut in two leaves what no journal entry names
    assert probes.leftovers(lab_name) == []


@pytest.mark.parametrize(("signum", "moment"), [(signal.SIGTERM, "loading"), (signal.SIGINT, "loaded")])
def test_a_signalled_demo_removes_its_lab_and_balancer(signum: int, moment: str, lab_name: str) -> None:
    """`l4lab demo` signalled while lbctl loads the balancer (its lock made, its state not yet written) or
    once it is loaded removes the balancer instance with the lab: an lbctl cut short leaves a lock."""
    from balancer.controller import STATE_ROOT  # numpy, libbpf: only this test reads the controller's paths

    lock, state = Path(STATE_ROOT) / f"{lab_name}-lb.lock", Path(STATE_ROOT) / f"{lab_name}-lb.json"
    argv = [sys.executable, "-m", "lab.cli", "demo", "--name", lab_name, "--no-bench", "--encap", "ip4-ipip"]
    at = {"loading": lock.exists, "loaded": state.exists}[moment]
    ended = signal_when(argv, lambda _pid: at(), signum, what=f"the demo's balancer {moment}", cwd=REPO,
                        interval_s=0.001)
    assert ended.returncode == 130, ended.stderr[-2000:]
    assert probes.leftovers(lab_name) == []


def test_kernel_refusal_midway_names_the_step_and_leaves_nothing(lab_name: str, tmp_path: Path) -> None:
    text = topology.resolve("default").read_text()
    duplicated = '{ dst = "198.51.100.100/32", via = "198.51.100.2" },'
    assert duplicated in text
    path = tmp_path / "dup-route.toml"
    path.write_text(text.replace(duplicated, duplicated + "\n  " + duplicated, 1))
    with pytest.raises(LabError) as err:
        netns.build(topology.load(path), lab_name, programs=False)
    assert (
        str(err.value) == f"add route 198.51.100.100/32 via 198.51.100.2 in {lab_name}-router: "
        "File exists (netlink error 17)"
    )
    assert err.value.step == f"add route 198.51.100.100/32 via 198.51.100.2 in {lab_name}-router"
    assert probes.leftovers(lab_name) == []


def test_two_labs_coexist_and_go_independently(lab_name: str, lab_factory: list[str]) -> None:
    other = unique_name("lbt")
    lab_factory.append(other)
    topo = topology.load("default")
    netns.build(topo, lab_name, programs=WITH_BPF)
    netns.build(topo, other, programs=WITH_BPF)
    for lab in (lab_name, other):
        assert probes.ping(f"{lab}-client", "203.0.113.18") is not None
    netns.teardown(lab_name)
    assert probes.leftovers(lab_name) == []
    assert probes.ping(f"{other}-client", "203.0.113.18") is not None
    assert probes.http_get(f"{other}-real2", "198.51.100.100") == "real2\n"
    netns.teardown(other)
    assert probes.leftovers(other) == []


def test_a_taken_name_is_refused_and_the_running_lab_is_untouched(lab_name: str) -> None:
    topo = topology.load("default")
    netns.build(topo, lab_name, programs=False)
    with pytest.raises(LabExistsError, match=f"a lab named '{lab_name}' is already up"):
        netns.build(topo, lab_name, programs=False)
    assert all(netns_path(ns).exists() for ns in expected_netns(lab_name, topo))
    assert probes.ping(f"{lab_name}-client", "203.0.113.34") is not None


def test_a_stray_namespace_of_the_name_is_refused(lab_name: str) -> None:
    netns.netns.create(f"{lab_name}-real2")
    try:
        with pytest.raises(LabExistsError, match=f"network namespace {lab_name}-real2 already exists"):
            netns.build(topology.load("default"), lab_name, programs=False)
        assert not state_dir(lab_name).exists()
    finally:
        netns.undo_one(netns.Undo("netns", f"{lab_name}-real2"))


def test_down_from_another_process_removes_exactly_that_lab(lab_name: str, lab_factory: list[str]) -> None:
    bystander = unique_name("lbt")
    lab_factory.append(bystander)
    netns.build(topology.load("default"), bystander, programs=False)
    cli = [sys.executable, "-m", "lab.cli"]
    bpf = [] if WITH_BPF else ["--no-bpf"]
    up = subprocess.run(
        [*cli, "up", "default", "--name", lab_name, *bpf], cwd=REPO, capture_output=True, text=True
    )
    assert up.returncode == 0, up.stderr
    assert up.stdout.startswith(f"lab '{lab_name}' up (default: 6 nodes, 5 links) in ")
    # The up process is gone; its services and programs live on.
    assert len(probes.lab_processes(lab_name)) == 3
    if WITH_BPF:
        assert any(pin_dir(lab_name).rglob("*"))
    down = subprocess.run([*cli, "down", "--name", lab_name], cwd=REPO, capture_output=True, text=True)
    assert down.returncode == 0, down.stderr
    assert probes.leftovers(lab_name) == []
    assert len(probes.lab_processes(bystander)) == 3
    assert probes.ping(f"{bystander}-client", "203.0.113.50") is not None


@pytest.mark.parametrize("step", [5, 60, -2])
def test_down_cleans_a_lab_whose_up_died_midway(step: int, lab_name: str) -> None:
    """The journal is written step by step, so `down` removes a build whose process died at any step."""
    total = netns.Builder(topology.load("default"), lab_name, programs=WITH_BPF)
    total.build()
    netns.teardown(lab_name)
    k = step if step > 0 else total.steps + 1 + step
    dying = (
        "import os, sys\n"
        "from lab import netns, topology\n"
        "class Dying(netns.Builder):\n"
        "    def _step(self, what):\n"
        f"        if self.steps + 1 == {k}:\n"
        "            os._exit(9)\n"
        "        return super()._step(what)\n"
        f"Dying(topology.load('default'), {lab_name!r}, programs={WITH_BPF}).build()\n"
    )
    died = subprocess.run([sys.executable, "-c", dying], cwd=REPO, capture_output=True, text=True)
    assert died.returncode == 9, died.stderr
    assert probes.leftovers(lab_name) != []
    assert not LabState.load(lab_name).complete
    netns.teardown(lab_name)
    assert probes.leftovers(lab_name) == []
