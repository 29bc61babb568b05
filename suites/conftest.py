"""The l4lab pytest plugin: labs, balancers and encap modes as fixtures, and --lab-keep.

    pytestmark = pytest.mark.topology("default")

    def test_dsr(lab, balancer, encap):
        balancer.apply(encaps={...})
        lab.run("client", ["curl", ...])

Labs get unique names (`cf-` and six hex digits) so suites and a developer's own lab coexist;
every fixture removes what it made, also when the test fails, unless --lab-keep says otherwise.
Skips say what is missing and how to get it.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from suites.vm.conftest import vm_lab  # noqa: E402,F401 - the VM fixture, for vm_real everywhere

REPO = Path(__file__).resolve().parent.parent
ENCAP_IDS = ("ip4-ipip", "ip4-gue1", "ip4-gue0", "ip6-ip6ip6", "ip6-gue1")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lab-keep", choices=("never", "failed", "always"), default="never",
                     help="keep labs after their tests: never (default), when a test failed, always")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """Remember each phase's outcome on the item so that fixtures can see whether a test failed;
    a failed test that used a traced lab gets the tracer's view (where its packets died)."""
    rep = yield
    item.stash.setdefault(_FAILED, False)
    if rep.failed:
        item.stash[_FAILED] = True
        handle = getattr(item, "funcargs", {}).get("lab")
        if isinstance(handle, Lab) and handle.tracer is not None:
            try:
                rep.sections.append(("tracer: XDP exceptions, bulk-tx errors, drop reasons per node",
                                     handle.tracer.report().render()))
            except Exception as exc:  # noqa: BLE001 - evidence is best effort, never a second failure
                rep.sections.append(("tracer", f"could not read the tracer: {exc}"))
    return rep


@pytest.fixture(autouse=True)
def _trace_from_zero(request: pytest.FixtureRequest) -> None:
    """Each test that uses a traced lab starts with the tracer's counts cleared."""
    if "lab" in request.fixturenames:
        handle = request.getfixturevalue("lab")
        if isinstance(handle, Lab) and handle.tracer is not None:
            handle.tracer.clear()


_FAILED = pytest.StashKey[bool]()


def _failed(item: pytest.Item) -> bool:
    return bool(item.stash.get(_FAILED, False))  # type: ignore[arg-type]


def _needs_root_and_build() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, BPF): run as root, e.g. sudo make test")
    missing = [o for o in ("balancer.o", "decap.o", "pass.o") if not (REPO / "build" / "bpf" / o).exists()]
    if missing:
        pytest.skip(f"BPF objects missing ({', '.join(missing)}): run make bpf")


@dataclass
class Lab:
    """A running lab: its name, topology and helpers to run things in its nodes."""

    name: str
    topology: Any
    kept: bool = False
    tracer: Any = None  # lab.trace.Tracer while the module runs, when BCC is available
    results: dict[str, Any] = field(default_factory=dict)

    def netns(self, node: str) -> str:
        return f"{self.name}-{node}"

    def run(self, node: str, argv: Sequence[str], *, check: bool = True, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run argv in node (nsenter keeps /sys/fs/bpf visible), from the repository's top."""
        from lab.nsexec import nsenter_argv

        done = subprocess.run(nsenter_argv(self.netns(node), list(argv)), capture_output=True, text=True,
                              timeout=timeout, cwd=REPO, check=False, input=input)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} in {self.netns(node)} exited {done.returncode}: "
                                 f"{done.stderr.strip()[-2000:]}")
        return done

    def python(self, node: str, module: str, *args: str, check: bool = True,
               timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        return self.run(node, [sys.executable, "-m", module, *args], check=check, timeout=timeout)


def _topology_of(request: pytest.FixtureRequest) -> str:
    marker = request.node.get_closest_marker("topology")
    return str(marker.args[0]) if marker else "default"


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    """Name: lab. Scope: module. Depends: root, built BPF objects.

    The module's topology (marker `topology`, default "default") built under a unique name::

        pytestmark = pytest.mark.topology("mtu")
        def test_x(lab):
            lab.run("client", ["ping", "-c1", "203.0.113.18"])
    """
    _needs_root_and_build()
    from lab import netns, topology

    topo = topology.load(_topology_of(request))
    name = "cf-" + secrets.token_hex(3)
    netns.build(topo, name)
    handle = Lab(name, topo)
    handle.tracer = _start_tracer(name)
    try:
        yield handle
    finally:
        if handle.tracer is not None:
            handle.tracer.stop()
        keep = request.config.getoption("--lab-keep")
        failed = any(_failed(item) for item in request.session.items
                     if getattr(item, "module", None) is request.module)
        if keep == "always" or (keep == "failed" and failed):
            handle.kept = True
            sys.stderr.write(f"\nkept lab '{name}' (--lab-keep={keep}); remove it with: "
                             f"l4lab down --name {name}; lbctl --instance {name}-lb unload\n")
        else:
            _unload_all(name)
            netns.teardown(name)


def _start_tracer(lab_name: str) -> Any:
    """The BCC tracer on every node of the lab, or None (with a note) when it cannot run here."""
    from lab import trace

    why = trace.bcc_missing()
    if why is None:
        try:
            tracer = trace.Tracer(lab_name)
            tracer.start()
            return tracer
        except Exception as exc:  # noqa: BLE001 - a missing tracer costs evidence, not the suite
            why = str(exc)
    sys.stderr.write(f"\nno tracer for lab '{lab_name}': {why}\n")
    return None


def _unload_all(lab_name: str) -> None:
    from balancer.controller import STATE_ROOT, Instance

    for state in Path(STATE_ROOT).glob(f"{lab_name}-*.json"):
        try:
            Instance.open(state.stem).unload()
        except Exception:  # noqa: BLE001 - best effort: the netns teardown follows
            Path(Instance.pin_dir(state.stem)).exists() and subprocess.run(
                ["rm", "-rf", Instance.pin_dir(state.stem)], check=False)
            state.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def vm_real(vm_lab: Any) -> Any:  # noqa: F811 - vm_lab is the fixture imported above
    """Name: vm_real. Scope: module. Depends: vm_lab (root, qemu, Debian's cloud kernel; skips otherwise).

    A booted real-server VM (lab.vm.VmReal: Debian's kernel decapsulating with tunl0/fou, VIPs on lo,
    HTTP on 80 and a UDP echo on 9000) whose tap is the link of vm_lab's namespace::

        def test_x(vm_real):
            assert vm_real.boot_seconds < 60
    """
    return vm_lab.vm


@pytest.fixture(params=ENCAP_IDS)
def encap(request: pytest.FixtureRequest) -> str:
    """Name: encap. Scope: function. Depends: -.

    Each encap id in turn (outer stack to inner): ip4-ipip, ip4-gue1, ip4-gue0, ip6-ip6ip6, ip6-gue1::

        def test_x(balancer, encap):
            assert balancer.encap_id == encap
    """
    return str(request.param)


@dataclass
class Balancer:
    """The balancer loaded in a lab's LB node through lbctl, configured for one encap id."""

    lab: Lab
    node: str
    encap_id: str
    config_path: Path

    @property
    def instance(self) -> str:
        return f"{self.lab.name}-{self.node}"

    def lbctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.lab.python(self.node, "balancer.cli", "--instance", self.instance, *args, check=check)

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.lbctl("stats", "--json").stdout)
        return result

    def apply(self, config: Any) -> None:
        from balancer import config as cfg

        self.config_path.write_text(cfg.dump(config))
        self.lbctl("apply", str(self.config_path))

    def config_for(self, encap_id: str | None = None, **kwargs: Any) -> Any:
        from lab.lbconf import ENCAP_IDS as IDS
        from lab.lbconf import balancer_config

        fam, mode = IDS[encap_id or self.encap_id]
        return balancer_config(self.lab.topology, self.lab.name, encaps={fam: mode}, lb=self.node, **kwargs)

    @property
    def family(self) -> int:
        from lab.lbconf import ENCAP_IDS as IDS

        return IDS[self.encap_id][0]


@pytest.fixture
def balancer(request: pytest.FixtureRequest, lab: Lab, encap: str, tmp_path: Path) -> Iterator[Balancer]:
    """Name: balancer. Scope: function. Depends: lab, encap.

    lbctl loaded (native XDP) in the lab's `lb` node with the topology's VIPs of the encap's family::

        def test_x(lab, balancer):
            before = balancer.stats()["reasons"]["TX_ENCAP"]["packets"]
    """
    from balancer import config as cfg
    from lab.lbconf import lb_link

    b = Balancer(lab, "lb", encap, tmp_path / "lb.toml")
    b.config_path.write_text(cfg.dump(b.config_for()))
    b.lbctl("load", "--interface", lb_link(lab.topology, "lb")[0], "--mode", "native",
            "--config", str(b.config_path))
    try:
        yield b
    finally:
        keep = request.config.getoption("--lab-keep")
        if keep == "always" or (keep == "failed" and _failed(request.node)):
            sys.stderr.write(f"\nkept balancer '{b.instance}' (--lab-keep={keep})\n")
        else:
            b.lbctl("unload", check=False)
