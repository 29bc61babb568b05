"""The l4lab pytest plugin: labs and balancers as fixtures, hardware mode, --lab-keep and the bpffs leak check.

    pytestmark = pytest.mark.topology("default")

    def test_dsr(lab, balancer, encap):
        balancer.apply(balancer.config_for())
        lab.run("client", ["curl", ...])

Registered as the `pytest11` entry point `lab.pytest_plugin` of the installed package (and named in
pyproject's addopts for a checkout), so `pytest -p lab.pytest_plugin` works anywhere. The handles
it hands out live in `lab.harness`, which tests import; fixtures here only build and remove them.

Labs get unique names (`cf-` and six hex digits) so suites and a developer's own lab coexist;
every fixture removes what it made, also when the test fails, unless --lab-keep says otherwise.
Skips say what is missing and how to get it.

Hardware mode: `--target FILE` (or $L4LAB_TARGET) points the suites at a lab already built on
Vagrant VMs or bare metal and reached over SSH (lab/remote/target.py). Then the `lab` fixture is a
`TargetLab`, commands and captures run on its hosts over ssh (one shared connection per host for
the whole session: `target_hosts`), and only tests marked `hardware` run: the others need
namespaces on this machine and are skipped saying so.

The `balancer` fixture takes an `encap` fixture (the encap id) that the suite provides.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from lab.cpu import pinned_cpu
from lab.harness import names
from lab.harness.labs import REPO, Lab, LabBalancer, NetnsLab, TargetLab
from lab.observe import trace
from lab.remote import target as targets

# The DUT's pieces (--dut, the needs marker, the dut fixtures, the verdicts) are a plugin of their own.
pytest_plugins = ("lab.dut.pytest_plugin",)

if TYPE_CHECKING:
    from _pytest.terminal import TerminalReporter

    from lab.harness.vmlab import VmLab
    from lab.observe.trace import Tracer
    from lab.remote.target import Target
    from lab.remote.vm import VmReal


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lab-keep", choices=("never", "failed", "always"), default="never",
                     help="keep labs after their tests: never (default), when a test failed, always")
    parser.addoption("--target", metavar="FILE", default=os.environ.get("L4LAB_TARGET") or None,
                     help="run the tests marked hardware against the lab this target file describes "
                          "(Vagrant or bare metal, over SSH; lab/remote/target.py); default $L4LAB_TARGET")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hardware: also runs against a --target lab (Vagrant or bare metal)")
    config.addinivalue_line("markers", "hardware_only(why): runs only against a --target lab")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With --target, only tests marked hardware run, and only those of the target's topology."""
    path = config.getoption("--target")
    if not path:
        for item in items:
            marker = item.get_closest_marker("hardware_only")
            if marker is not None:
                item.add_marker(pytest.mark.skip(reason=f"runs only with --target (hardware mode): {marker.args[0]}"))
        return

    tgt = targets.load(path)
    for item in items:
        if item.get_closest_marker("hardware") is None:
            item.add_marker(pytest.mark.skip(reason=f"needs the netns lab on this machine, not a --target "
                                                    f"(only tests marked hardware run against {tgt.name})"))
            continue
        marker = item.get_closest_marker("topology")
        wanted = [str(a) for a in marker.args] if marker else ["default"]  # the netns lab builds the first
        if tgt.topology.name not in wanted:
            item.add_marker(pytest.mark.skip(reason=f"needs topology '{' or '.join(wanted)}' but target "
                                                    f"{tgt.name} was built as '{tgt.topology.name}'"))


_FAILED = pytest.StashKey[bool]()


def failed(item: pytest.Item) -> bool:
    """Whether a phase of this test has failed so far (fixtures decide what --lab-keep keeps)."""
    return _FAILED in item.stash and item.stash[_FAILED]


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


def _needs_root_and_build() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (network namespaces, BPF): run as root, e.g. sudo make test")
    missing = [o for o in ("balancer.o", "decap.o", "pass.o") if not (REPO / "build" / "bpf" / o).exists()]
    if missing:
        pytest.skip(f"BPF objects missing ({', '.join(missing)}): run make bpf")


def _topology_of(request: pytest.FixtureRequest) -> str:
    marker = request.node.get_closest_marker("topology")
    return str(marker.args[0]) if marker else "default"


def _keep(request: pytest.FixtureRequest, failed_now: bool) -> str | None:
    """The --lab-keep value when it says to keep what the fixture made, else None."""
    keep = str(request.config.getoption("--lab-keep"))
    return keep if keep == "always" or (keep == "failed" and failed_now) else None


@pytest.fixture(scope="session")
def target_hosts(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """Name: target_hosts. Scope: session. Depends: --target FILE.

    The target file's hosts, every command to a node over one shared ssh connection (closed at the
    end of the session; a new connection costs seconds on a TCG guest)::

        def test_x(target_hosts):
            target_hosts.run("lb", ["uname", "-r"])
    """
    path = request.config.getoption("--target")
    if not path:
        pytest.skip("needs --target FILE (a lab reached over ssh)")
    with targets.shared_connections(targets.load(path), tmp_path_factory.getbasetemp()) as hosts:
        yield hosts


@pytest.fixture(scope="module")
def lab(request: pytest.FixtureRequest) -> Iterator[Lab]:
    """Name: lab. Scope: module. Depends: root, built BPF objects.

    The module's topology (marker `topology`, default "default") built under a unique name::

        pytestmark = pytest.mark.topology("mtu")
        def test_x(lab):
            lab.run("client", ["ping", "-c1", "203.0.113.18"])
    """
    if request.config.getoption("--target"):
        yield TargetLab(request.getfixturevalue("target_hosts"))
        return
    _needs_root_and_build()
    from lab import netns, topology  # pyroute2 (the lab builder): only when a test needs a netns lab

    topo = topology.load(_topology_of(request))
    name = names.unique_name(names.CONFORMANCE)
    netns.build(topo, name)
    handle = NetnsLab(name, topo)
    try:
        handle.tracer = _start_tracer(name)  # seconds of BCC compiling: an interrupt there removes the lab too
        yield handle
    finally:
        if handle.tracer is not None:
            handle.tracer.stop()
        keep = _keep(request, any(failed(item) for item in request.session.items
                                  if getattr(item, "module", None) is request.module))
        if keep:
            handle.kept = True
            sys.stderr.write(f"\nkept lab '{name}' (--lab-keep={keep}); remove it with: "
                             f"l4lab down --name {name}; lbctl --instance {name}-lb unload\n")
        else:
            _unload_all(name)
            netns.teardown(name)


def _start_tracer(lab_name: str) -> Tracer | None:
    """The BCC tracer on every node of the lab, or None (with a note) when it cannot run here."""
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
    from balancer.controller import PIN_ROOT, STATE_ROOT, Instance  # numpy, libbpf: only when a lab's instances go

    for state in Path(STATE_ROOT).glob(f"{lab_name}-*.json"):
        with contextlib.suppress(Exception):  # best effort: what it left goes below
            Instance.open(state.stem).unload()
    # What a failed unload left, and an lbctl interrupted while it loaded (its lock, maybe pins, no state
    # file): removed the way `l4lab down` removes a lab's instance.
    from lab.netns import undo_one  # pyroute2 (the lab builder): loaded already by the lab fixture
    from lab.state import Undo

    rest = {p.name.split(".")[0] for p in Path(STATE_ROOT).glob(f"{lab_name}-*")}
    for name in rest | {p.name for p in Path(PIN_ROOT).glob(f"{lab_name}-*")}:
        undo_one(Undo("balancer", name))


@pytest.fixture
def balancer(request: pytest.FixtureRequest, lab: Lab, encap: str, tmp_path: Path) -> Iterator[LabBalancer]:
    """Name: balancer. Scope: function. Depends: lab, encap.

    lbctl loaded (native XDP) in the lab's `lb` node with the topology's VIPs of the encap's family::

        def test_x(lab, balancer):
            before = balancer.stats()["reasons"]["TX_ENCAP"]["packets"]
    """
    b = LabBalancer(lab, "lb", encap, tmp_path / "lb.toml")
    try:
        b.load("native")  # an interrupted load is unloaded too
        yield b
    finally:
        keep = _keep(request, failed(request.node))
        if keep:
            sys.stderr.write(f"\nkept balancer '{b.instance}' (--lab-keep={keep})\n")
        else:
            b.lbctl("unload", check=False)


@pytest.fixture
def one_cpu() -> Iterator[int]:
    """Name: one_cpu. Scope: function. Depends: nothing.

    Pins the test process to one CPU (the lowest it may use) and restores the mask: test runs
    execute on the caller's CPU and per-CPU state (sessions, a generator's sequence) is per CPU, so
    a migration between two runs would look like lost state. A conftest that needs a whole module
    pinned wraps lab.harness.pinned_cpu() in a module fixture::

        def test_x(one_cpu: int) -> None: ...   # one_cpu is the CPU in use
    """
    with pinned_cpu() as cpu:
        yield cpu


# --- the real-server VM ----------------------------------------------------------------------------

_BOOT_TIMES = pytest.StashKey[list[tuple[str, float, float]]]()


@pytest.fixture(scope="module")
def vm_lab(request: pytest.FixtureRequest) -> Iterator[VmLab]:
    """Name: vm_lab. Scope: module (one boot serves the module's tests).
    Depends: root, qemu, the cloud kernel unpacked in build/vm/kernel/ (skips otherwise).

    A namespace `vmt-<random>` whose tap is the link of a booted real-server VM::

        def test_x(vm_lab):
            with entered(vm_lab.netns):
                socket.create_connection((vm_lab.vm.addr, 80))
    """
    # qemu VM labs (numpy, pyroute2): only the vm_lab fixture loads them
    from lab.harness.vmlab import booted_vm_lab, vm_skip_reason

    reason = vm_skip_reason()
    if reason:
        pytest.skip(reason)
    with booted_vm_lab() as booted:
        assert booted.vm.boot_seconds is not None and booted.vm.guest_uptime is not None
        request.config.stash.setdefault(_BOOT_TIMES, []).append(
            (booted.vm.name, booted.vm.boot_seconds, booted.vm.guest_uptime))
        yield booted


@pytest.fixture(scope="module")
def vm_real(vm_lab: VmLab) -> VmReal:
    """Name: vm_real. Scope: module. Depends: vm_lab (root, qemu, Debian's cloud kernel; skips otherwise).

    A booted real-server VM (lab.remote.vm.VmReal: Debian's kernel decapsulating with tunl0/fou, VIPs on lo,
    HTTP on 80 and a UDP echo on 9000) whose tap is the link of vm_lab's namespace::

        def test_x(vm_real):
            assert vm_real.boot_seconds < 60
    """
    return vm_lab.vm


def record_boot(config: pytest.Config, name: str, wall_s: float, uptime_s: float) -> None:
    """Add a VM boot to the terminal summary (tests that boot their own VMs call this)."""
    config.stash.setdefault(_BOOT_TIMES, []).append((name, wall_s, uptime_s))


def pytest_terminal_summary(terminalreporter: TerminalReporter, config: pytest.Config) -> None:
    for name, wall, uptime in config.stash.get(_BOOT_TIMES, []):
        terminalreporter.write_line(
            f"vm boot '{name}': {wall:.2f} s from qemu start to ready (guest uptime {uptime:.2f} s), TCG"
        )


# --- nothing left behind in bpffs ------------------------------------------------------------------

_BPFFS_ROOTS = ("/sys/fs/bpf/l4lab", "/sys/fs/bpf/lbctl", "/sys/fs/bpf/lbctl-test")
_BPFFS_BEFORE = pytest.StashKey[set[str]]()
_ROOTS_BEFORE = pytest.StashKey[set[str]]()
_OUTER = "L4LAB_PYTEST_OUTER"


def _bpffs_entries() -> set[str]:
    """What bpffs holds under l4lab's roots for names this process made (names.unique_name): other
    sessions and people share the machine, and their labs are not this session's leftovers."""
    found: set[str] = set()
    for root in _BPFFS_ROOTS:
        if not os.path.isdir(root):
            continue
        for top in os.listdir(root):
            if not names.made_here(top):
                continue
            for here, dirs, files in os.walk(os.path.join(root, top)):
                found.add(here)
                found.update(os.path.join(here, n) for n in dirs + files)
    return found


def pytest_sessionstart(session: pytest.Session) -> None:
    """The outermost session remembers what bpffs held under l4lab's roots before any test ran."""
    if os.environ.get(_OUTER):
        return  # a pytest run by a test: the outer session's live labs are not this one's leftovers
    os.environ[_OUTER] = str(os.getpid())
    session.stash[_BPFFS_BEFORE] = _bpffs_entries()
    session.stash[_ROOTS_BEFORE] = {r for r in _BPFFS_ROOTS if os.path.isdir(r)}


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the empty bpffs directories the tests made; fail the run for any pin they left.

    Last, after pytest's own sessionfinish has torn down the fixtures still set up: an interrupted run
    removes its module's lab there."""
    before = session.stash.get(_BPFFS_BEFORE, None)
    if before is None:
        return
    for path in sorted(_bpffs_entries() - before, key=len, reverse=True):
        with contextlib.suppress(FileNotFoundError):
            if os.path.isdir(path) and not os.listdir(path):
                os.rmdir(path)
    none_yet: set[str] = set()
    existed = session.stash.get(_ROOTS_BEFORE, none_yet)
    made_roots = set(_BPFFS_ROOTS) - existed
    for root in sorted(made_roots):
        with contextlib.suppress(OSError):  # a root the run made goes once empty: no bpffs folder outlives it
            os.rmdir(root)
    leaked = sorted(_bpffs_entries() - before)
    if leaked:
        sys.stderr.write("\nl4lab: the tests left BPF pins behind (a test did not clean up):\n"
                         + "".join(f"  {p}\n" for p in leaked[:20]))
        if session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
