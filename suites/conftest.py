"""The l4lab pytest plugin: labs, balancers and encap modes as fixtures, and --lab-keep.

    pytestmark = pytest.mark.topology("default")

    def test_dsr(lab, balancer, encap):
        balancer.apply(encaps={...})
        lab.run("client", ["curl", ...])

Labs get unique names (`cf-` and six hex digits) so suites and a developer's own lab coexist;
every fixture removes what it made, also when the test fails, unless --lab-keep says otherwise.
Skips say what is missing and how to get it.

Hardware mode: `--target FILE` (or $L4LAB_TARGET) points the suites at a lab already built on
Vagrant VMs or bare metal and reached over SSH (lab/target.py). Then the `lab` fixture is that
lab, commands and captures run on its hosts over ssh, and only tests marked `hardware` run: the
others need namespaces on this machine and are skipped saying so.
"""

from __future__ import annotations

import contextlib
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

from balancer.encaps import SAME_FAMILY, EncapCase, by_id
from suites.vm.conftest import vm_lab  # noqa: E402,F401 - the VM fixture, for vm_real everywhere

REPO = Path(__file__).resolve().parent.parent


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--lab-keep", choices=("never", "failed", "always"), default="never",
                     help="keep labs after their tests: never (default), when a test failed, always")
    parser.addoption("--target", metavar="FILE", default=os.environ.get("L4LAB_TARGET") or None,
                     help="run the tests marked hardware against the lab this target file describes "
                          "(Vagrant or bare metal, over SSH; lab/target.py); default $L4LAB_TARGET")
    parser.addoption("--dut", choices=("l4lab", "ipvs", "katran"), default=os.environ.get("L4LAB_DUT") or "l4lab",
                     help="the load balancer the conformance tests that take `dut` grade (lab/dut.py): "
                          "l4lab (default), ipvs (Linux IPVS in a qemu VM) or katran (built from "
                          "$L4LAB_KATRAN_SRC); default $L4LAB_DUT")
    parser.addoption("--ipvs-scheduler", default=os.environ.get("L4LAB_IPVS_SCHEDULER") or "mh:mh-port",
                     help="IPVS scheduler and its flags for --dut ipvs: SCHEDULER[:FLAG,...], e.g. mh:mh-port "
                          "(default), mh:mh-port,mh-fallback, sh:sh-port, rr; default $L4LAB_IPVS_SCHEDULER")


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
    from lab import target as targets

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
    """A running lab: its name, topology and helpers to run things in its nodes.

    A netns lab on this machine, or with `target` (lab.target.Target) a lab on other hosts reached
    over SSH: run, python, capture, mac, ifname and write work the same on both."""

    name: str
    topology: Any
    kept: bool = False
    tracer: Any = None  # lab.trace.Tracer while the module runs, when BCC is available
    results: dict[str, Any] = field(default_factory=dict)
    target: Any = None

    def netns(self, node: str) -> str:
        if self.target is not None:
            raise AssertionError(f"node '{node}' of target {self.target.name} is a host, not a namespace here: "
                                 "a test that enters namespaces must not be marked hardware")
        return f"{self.name}-{node}"

    def _argv(self, node: str, argv: Sequence[str]) -> list[str]:
        if self.target is not None:
            return list(self.target.ssh_argv(node, argv))
        from lab.nsexec import nsenter_argv

        return nsenter_argv(self.netns(node), list(argv))

    def where(self, node: str) -> str:
        return f"{node} ({self.target.node(node).ssh})" if self.target is not None else self.netns(node)

    def run(self, node: str, argv: Sequence[str], *, check: bool = True, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run argv in node (nsenter keeps /sys/fs/bpf visible; ssh on a target; a VM's control channel),
        from the repository's top. A VM node's stderr comes back in stdout."""
        if self.target is None and self.topology.node(node).kind == "vm" and input is None:
            from lab import vmnodes

            done = vmnodes.run(self.name, node, argv, timeout=timeout)
        else:
            done = subprocess.run(self._argv(node, argv), capture_output=True, text=True,
                                  timeout=timeout, cwd=REPO, check=False, input=input)
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} in {self.where(node)} exited {done.returncode}: "
                                 f"{(done.stderr or done.stdout).strip()[-2000:]}")
        return done

    def python(self, node: str, module: str, *args: str, check: bool = True,
               timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        if self.target is not None:
            return self.run(node, self.target.python_argv(node, module, *args), check=check, timeout=timeout)
        return self.run(node, [sys.executable, "-m", module, *args], check=check, timeout=timeout)

    def python_argv(self, node: str, module: str, *args: str) -> list[str]:
        """The local command line that runs `python -m module args` in node (for a long-lived Popen)."""
        if self.target is not None:
            return self._argv(node, self.target.python_argv(node, module, *args))
        return self._argv(node, [sys.executable, "-m", module, *args])

    def ifname(self, node: str, ifname: str) -> str:
        """The node's name for the topology's interface `ifname` (a target may rename it)."""
        return self.target.node(node).ifname(ifname) if self.target is not None else ifname

    def mac(self, node: str, ifname: str) -> str:
        """The MAC address of the node's interface (the topology's name for it)."""
        if self.target is not None:
            return str(self.target.mac(node, ifname))
        from lab.lbconf import peer_mac

        return peer_mac(self.name, node, ifname)

    def capture(self, node: str, ifname: str, path: Path, snaplen: int = 512) -> Any:
        """tcpdump on the node's interface into the local pcap `path` (a context manager).

        On a target whose node says capture = false (a hardware router), the test is skipped."""
        if self.target is None:
            from lab.capture import Capture

            return Capture(self.name, node, ifname, path, snaplen=snaplen)
        from lab.target import RemoteCapture

        if node not in self.target.nodes or not self.target.node(node).capture:
            pytest.skip(f"this test captures on {node}'s {ifname}, which target {self.target.name} "
                        f"cannot (no [nodes.{node}] or capture = false)")
        return RemoteCapture(self.target, node, ifname, path, snaplen=snaplen)

    def write(self, node: str, path: str, text: str) -> None:
        """Write a file the node's commands can read (local for netns nodes, over ssh on a target)."""
        if self.target is not None:
            self.target.write(node, path, text)
        else:
            Path(path).write_text(text)


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
    path = request.config.getoption("--target")
    if path:
        from lab import target as targets

        tgt = targets.load(path)
        yield Lab(tgt.name, tgt.topology, target=tgt)
        return
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


@pytest.fixture(params=SAME_FAMILY)
def encap(request: pytest.FixtureRequest) -> EncapCase:
    """Name: encap. Scope: function. Depends: -.

    Each case of balancer/encaps.py whose reals are reached in the VIP's family, in turn: a str equal
    to its id (the test id: ip4-ipip, ip4-gue1, ip4-gue0, ip6-ip6ip6, ip6-gue1) with the case's facts.
    `@pytest.mark.parametrize("encap", [IP4_IPIP], indirect=True)` picks cases::

        def test_x(balancer, encap):
            assert balancer.encap_id == encap and encap.overhead >= 20
    """
    case: EncapCase = by_id(request.param)  # indirect parametrize may pass the id as a plain str
    return case


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

    @property
    def config_file(self) -> str:
        """Where the node reads its config: the test's tmp path here, /tmp on a target host."""
        if self.lab.target is not None:
            return f"/tmp/{self.instance}-{self.encap_id}.toml"
        return str(self.config_path)

    def apply(self, config: Any) -> None:
        from balancer import config as cfg

        self.config_path.write_text(cfg.dump(config))
        self.lab.write(self.node, self.config_file, cfg.dump(config))
        self.lbctl("apply", self.config_file)

    def config_for(self, encap_id: str | None = None, **kwargs: Any) -> Any:
        from lab.lbconf import balancer_config, lb_link

        case = by_id(encap_id or self.encap_id)
        fam, mode = case.vip_family, case.config_name
        if self.lab.target is not None:
            lb_if, peer, peer_if = lb_link(self.lab.topology, self.node)
            kwargs.setdefault("ifname", self.lab.ifname(self.node, lb_if))
            kwargs.setdefault("nexthop_mac", self.lab.mac(peer, peer_if))
        return balancer_config(self.lab.topology, self.lab.name, encaps={fam: mode}, lb=self.node, **kwargs)

    @property
    def family(self) -> int:
        return by_id(self.encap_id).vip_family


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
    text = cfg.dump(b.config_for())
    b.config_path.write_text(text)
    lab.write(b.node, b.config_file, text)
    b.lbctl("load", "--interface", lab.ifname("lb", lb_link(lab.topology, "lb")[0]), "--mode", "native",
            "--config", b.config_file)
    try:
        yield b
    finally:
        keep = request.config.getoption("--lab-keep")
        if keep == "always" or (keep == "failed" and _failed(request.node)):
            sys.stderr.write(f"\nkept balancer '{b.instance}' (--lab-keep={keep})\n")
        else:
            b.lbctl("unload", check=False)


# --- nothing left behind in bpffs ------------------------------------------------------------------

_BPFFS_ROOTS = ("/sys/fs/bpf/l4lab", "/sys/fs/bpf/lbctl", "/sys/fs/bpf/lbctl-test")
_BPFFS_BEFORE = pytest.StashKey[set[str]]()
_OUTER = "L4LAB_PYTEST_OUTER"


def _bpffs_entries() -> set[str]:
    found: set[str] = set()
    for root in _BPFFS_ROOTS:
        for here, dirs, files in os.walk(root):
            found.add(here)
            found.update(os.path.join(here, n) for n in dirs + files)
    return found


def pytest_sessionstart(session: pytest.Session) -> None:
    """The outermost session remembers what bpffs held under l4lab's roots before any test ran."""
    if os.environ.get(_OUTER):
        return  # a pytest run by a test: the outer session's live labs are not this one's leftovers
    os.environ[_OUTER] = str(os.getpid())
    session.stash[_BPFFS_BEFORE] = _bpffs_entries()


def _other_pytest_sessions() -> list[int]:
    """Pids of pytest processes on this machine that are not this session nor started by it."""
    me = os.getpid()
    others = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            if not any(b"pytest" in a for a in argv[:3]):
                continue
            pid = int(entry)
            while pid > 1 and pid != me:  # is it ours? walk its parents
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if pid != me:
            others.append(int(entry))
    return others


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Remove the empty bpffs directories the tests made; fail the run for any pin they left.

    bpffs is one per machine: while another pytest session runs here (a developer's, a second
    checkout's), pins that appeared may be that session's live labs, so they are listed, not failed.
    CI runs one session on a machine of its own, where every new pin is this run's."""
    before = session.stash.get(_BPFFS_BEFORE, None)
    if before is None:
        return
    others = _other_pytest_sessions()
    for path in sorted(_bpffs_entries() - before, key=len, reverse=True):
        with contextlib.suppress(FileNotFoundError, OSError):
            if not others and os.path.isdir(path) and not os.listdir(path):
                os.rmdir(path)
    leaked = sorted(_bpffs_entries() - before)
    if not leaked:
        return
    listing = "".join(f"  {p}\n" for p in leaked[:20])
    if others:
        sys.stderr.write(f"\nl4lab: BPF pins appeared during the run while {len(others)} other pytest "
                         f"session(s) ran here (pids {', '.join(map(str, others[:5]))}); not failing, "
                         f"they may be theirs:\n{listing}")
        return
    sys.stderr.write("\nl4lab: the tests left BPF pins behind (a test did not clean up):\n" + listing)
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
