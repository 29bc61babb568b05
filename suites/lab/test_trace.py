"""The tracer (lab/observe/trace.py) names the node, interface and cause of XDP exceptions, bulk-TX errors and drops.

Each test builds two namespaces `trt-<hex>-a` and `trt-<hex>-b` joined by a veth (a-b <-> b-a),
IPv4 only with static neighbours so that nothing but the test's packets crosses it, and removes
them afterwards. The small XDP programs are compiled by BCC, which the tracer needs anyway.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from lab import cli
from lab.errors import UsageError
from lab.harness import poll, unique_name
from lab.nsexec import NETNS_DIR, entered
from lab.observe.trace import HEADERS_ROOT, SETUP_HINT, Tracer, TraceReport, bcc_missing, compile_bcc, kernel_build_dir

REPO = Path(__file__).resolve().parents[2]
PREFIX = "trt-"
A_ADDR, B_ADDR = "192.0.2.1", "192.0.2.2"
CLOSED_PORT = 9  # nothing listens in b
DEADLINE_S = 5.0

XDP_PROGRAMS = """
int xdp_abort(struct xdp_md *ctx) { return XDP_ABORTED; }
int xdp_tx(struct xdp_md *ctx) { return XDP_TX; }
"""

pytestmark = pytest.mark.skipif(
    bcc_missing() is not None, reason=f"{bcc_missing()} (run `{SETUP_HINT}` as root)"
)


@dataclass(frozen=True)
class Pair:
    """Two namespaces of one trace lab: `lab`-a (interface a-b) and `lab`-b (interface b-a)."""

    lab: str
    a: str
    b: str


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed: {done.stderr.strip()}")


def _del_netns(name: str) -> None:
    if (NETNS_DIR / name).exists():
        _ip("netns", "del", name)


def _mac(netns: str, ifname: str) -> str:
    done = subprocess.run(["ip", "-j", "-n", netns, "link", "show", ifname],
                          capture_output=True, text=True, check=True)
    mac: str = json.loads(done.stdout)[0]["address"]
    return mac


@pytest.fixture
def pair() -> Iterator[Pair]:
    """Two fresh namespaces joined by a veth, with addresses and static neighbours; always removed.

    Name: pair
    Scope: function
    Depends: -

        def test_drop(pair):
            with Tracer(pair.lab) as tracer:
                ...
    """
    lab = unique_name("lbt")
    p = Pair(lab, f"{lab}-a", f"{lab}-b")
    with ExitStack() as stack:
        for ns in (p.a, p.b):
            _ip("netns", "add", ns)
            stack.callback(_del_netns, ns)
            # No IPv6: its neighbour and multicast chatter would add to the exact counts.
            subprocess.run(["nsenter", f"--net={NETNS_DIR / ns}", "sysctl", "-q", "-w",
                            "net.ipv6.conf.all.disable_ipv6=1", "net.ipv6.conf.default.disable_ipv6=1"],
                           check=True, capture_output=True)
        _ip("link", "add", "a-b", "netns", p.a, "type", "veth", "peer", "name", "b-a", "netns", p.b)
        for ns, ifname, addr in ((p.a, "a-b", A_ADDR), (p.b, "b-a", B_ADDR)):
            _ip("-n", ns, "addr", "add", f"{addr}/30", "dev", ifname)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", ifname, "up")
        _ip("-n", p.a, "neigh", "replace", B_ADDR, "lladdr", _mac(p.b, "b-a"), "dev", "a-b")
        _ip("-n", p.b, "neigh", "replace", A_ADDR, "lladdr", _mac(p.a, "a-b"), "dev", "b-a")
        yield p


def _attach_xdp(netns: str, ifname: str, program: str, stack: ExitStack) -> None:
    """Attach BCC-compiled `program` to `ifname` in `netns` (it goes when the namespace is deleted)."""
    from bcc import BPF

    bpf = compile_bcc(XDP_PROGRAMS.encode())
    stack.callback(bpf.cleanup)
    fn = bpf.load_func(program.encode(), BPF.XDP)
    with entered(netns):
        BPF.attach_xdp(ifname.encode(), fn, 0)

    def detach() -> None:
        if (NETNS_DIR / netns).exists():
            with entered(netns):
                BPF.remove_xdp(ifname.encode(), 0)

    stack.callback(detach)


def _send_udp(netns: str, dst: str, port: int, count: int) -> None:
    with entered(netns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        for i in range(count):
            sock.sendto(b"l4lab trace %d" % i, (dst, port))


def _wait_report(tracer: Tracer, done: Callable[[TraceReport], bool]) -> TraceReport:
    """Poll the tracer's report until `done` holds; fail with the last report at the deadline."""
    report = poll(DEADLINE_S, tracer.report, "the tracer's report", until=done, check=False, interval_s=0.02)
    if not done(report):
        pytest.fail(f"the tracer did not report it within {DEADLINE_S:g} s:\n{report.render()}")
    return report


def test_xdp_aborted_is_reported_for_node_and_interface(pair: Pair) -> None:
    with ExitStack() as stack:
        _attach_xdp(pair.b, "b-a", "xdp_abort", stack)
        with Tracer(pair.lab) as tracer:
            _send_udp(pair.a, B_ADDR, CLOSED_PORT, 7)
            report = _wait_report(tracer, lambda r: r.node("b").xdp_exceptions().get(("b-a", "ABORTED"), 0) >= 7)
    assert report.node("b").xdp_exceptions()[("b-a", "ABORTED")] == 7
    assert report.node("a").xdp_exceptions() == {}
    assert "NO_SOCKET" not in {what for _, what in report.node("b").drops()}  # never reached the stack


def test_xdp_tx_towards_a_peer_without_xdp_is_a_bulk_tx_error(pair: Pair) -> None:
    # The DESIGN.md trap: b XDP_TXes back into a, whose veth has no XDP program. With GRO off on
    # a-b the kernel refuses the frames (ENXIO) in the bulk transmit, which the tracer shows.
    # (With GRO on they vanish without any of the three tracepoints firing.)
    subprocess.run(["nsenter", f"--net={NETNS_DIR / pair.a}", "ethtool", "-K", "a-b", "gro", "off"],
                   check=True, capture_output=True)
    with ExitStack() as stack:
        _attach_xdp(pair.b, "b-a", "xdp_tx", stack)
        with Tracer(pair.lab, nodes=["b"]) as tracer:
            _send_udp(pair.a, B_ADDR, CLOSED_PORT, 5)
            report = _wait_report(tracer, lambda r: r.node("b").bulk_tx_errors().get(("b-a", "ENXIO"), 0) >= 5)
    assert report.node("b").bulk_tx_errors()[("b-a", "ENXIO")] == 5
    assert [n.node for n in report.nodes] == ["b"]


def test_udp_to_a_closed_port_is_a_no_socket_drop(pair: Pair) -> None:
    with Tracer(pair.lab) as tracer:
        _send_udp(pair.a, B_ADDR, CLOSED_PORT, 3)
        report = _wait_report(tracer, lambda r: r.node("b").drops().get(("b-a", "NO_SOCKET"), 0) >= 3)
        tracer.clear()
        assert tracer.report().node("b").drops() == {}
    assert report.node("b").drops()[("b-a", "NO_SOCKET")] == 3
    assert ("a-b", "NO_SOCKET") not in report.node("a").drops()


def test_other_namespaces_are_not_counted(pair: Pair) -> None:
    # The tracer of lab `pair.lab` watches node a only: b's drops are someone else's.
    with Tracer(pair.lab, nodes=["a"]) as tracer:
        _send_udp(pair.b, A_ADDR, CLOSED_PORT, 2)  # a drops these: counted
        _send_udp(pair.a, B_ADDR, CLOSED_PORT, 2)  # b drops these: not watched
        report = _wait_report(tracer, lambda r: r.node("a").drops().get(("a-b", "NO_SOCKET"), 0) >= 2)
    with pytest.raises(UsageError, match="has no node 'b'"):
        report.node("b")


def test_unknown_node_is_a_usage_error(pair: Pair) -> None:
    with pytest.raises(UsageError, match=rf"lab '{pair.lab}' has no node 'lb' \(nodes: a, b\)"):
        Tracer(pair.lab, nodes=["lb"])


def test_cli_prints_the_report_as_json(pair: Pair, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["trace", "--name", pair.lab, "--node", "b", "--seconds", "0.2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["lab"] == pair.lab
    assert [n["node"] for n in out["nodes"]] == ["b"]
    assert out["nodes"][0]["netns"] == pair.b


HIDDEN_BUILD_PROBE = """
import os, sys
from pathlib import Path
from lab.observe.trace import HEADERS_ROOT, compile_bcc, kernel_build_dir, kernel_headers
assert not (kernel_build_dir() / "build").exists()
headers = kernel_headers()
assert headers is not None and headers.parent == HEADERS_ROOT, headers
bpf = compile_bcc(sys.argv[1].encode())
bpf.load_func(b"xdp_tx", bpf.XDP)
assert "BCC_KERNEL_SOURCE" not in os.environ
print(headers)
"""


def test_bcc_compiles_without_the_lib_modules_build_link(tmp_path: Path) -> None:
    """The tracer's compile needs nothing under /lib/modules: with /lib/modules/$(uname -r) hidden
    behind an empty directory (in a private mount namespace), BCC compiles against the merged
    headers under /run/l4lab/bcc-headers/, and nothing is written into the hidden place."""
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) (util-linux) to hide /lib/modules in a private mount namespace")
    empty = tmp_path / "modules"
    empty.mkdir()
    moddir = kernel_build_dir()
    script = f'if [ -d "{moddir}" ]; then mount --bind "{empty}" "{moddir}" || exit 1; fi; exec "$@"'
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "probe",
         sys.executable, "-c", HIDDEN_BUILD_PROBE, XDP_PROGRAMS],
        capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith(str(HEADERS_ROOT))
    assert list(empty.iterdir()) == []
