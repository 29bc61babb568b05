"""Hardware mode (lab/remote/target.py, pytest --target): target files, and the suites driven over real SSH.

No Vagrant or bare-metal lab exists here, so the SSH path is exercised against a netns lab whose
nodes are reached by real ssh through `sshd -i` started in each namespace (`l4lab target --netns`):
commands land in the node's namespace, captures stream back, and the hardware-marked conformance
tests pass through it while unmarked ones are skipped saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from lab import procs
from lab.errors import LabError, UsageError
from lab.harness import REPO, Lab, poll
from lab.nsexec import NETNS_DIR
from lab.remote import target

pytestmark = pytest.mark.topology("default")

VAGRANT_SSH_CONFIG = "".join(
    f"Host {n}\n  HostName 127.0.0.1\n  User vagrant\n  Port {2200 + i}\n  IdentityFile /v/{n}/private_key\n\n"
    for i, n in enumerate(("client", "router", "lb", "real1", "real2", "real3")))


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.toml"
    p.write_text(text)
    return p


GOOD = """
name = "rack1"
topology = "default"
ssh_options = ["-F", "ssh_config", "-o", "ConnectTimeout=5"]
[nodes.lb]
ssh = "root@192.0.2.20"
repo = "/opt/l4lab"
interfaces = { "lb-rt" = "ens1f0" }
[nodes.real1]
ssh = "ops@192.0.2.31"
sudo = true
[trex]
server = "192.0.2.200"
tx_mac = "0C:42:A1:00:00:01"
"""


def test_shared_connections_refuse_a_folder_too_long_for_a_socket(tmp_path: Path) -> None:
    t = target.load(_write(tmp_path, GOOD))
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    with pytest.raises(LabError, match="too long for a socket path"), target.shared_connections(t, deep):
        pass
    assert list(deep.iterdir()) == [], "the refused control folder was left behind"
    assert "ControlMaster=auto" not in t.ssh_argv("lb", ["true"]), "an unshared target must connect per command"


def test_target_file_is_read(tmp_path: Path) -> None:
    t = target.load(_write(tmp_path, GOOD))
    assert t.name == "rack1" and t.topology.name == "default"
    assert t.ssh_options[:2] == ("-F", str(tmp_path / "ssh_config")), "-F is resolved against the file's folder"
    assert t.node("lb").ifname("lb-rt") == "ens1f0" and t.node("lb").ifname("other") == "other"
    assert t.trex is not None and (t.trex.server, t.trex.tx_port, t.trex.rx_port) == ("192.0.2.200", 0, 1)
    assert t.trex.tx_mac == "0c:42:a1:00:00:01"
    argv = t.ssh_argv("real1", ["ip", "-j", "link", "show", "dev", "eth 1"])
    assert argv[-3:] == ["ops@192.0.2.31", "--", "sudo -n ip -j link show dev 'eth 1'"]
    assert "BatchMode=yes" in argv
    py = t.python_argv("lb", "balancer.cli", "stats", "--json")
    assert py == ["sh", "-c", "cd /opt/l4lab && exec .venv/bin/python -m balancer.cli stats --json"]
    with pytest.raises(UsageError, match=r"\[nodes.real1\] needs repo"):
        t.python_argv("real1", "lab.rss.nic")
    with pytest.raises(UsageError, match=r"no \[nodes.client\]"):
        t.node("client")


@pytest.mark.parametrize(("text", "message"), [
    ('topology = "default"\ncolour = 1\n[nodes.lb]\nssh = "x"\n', r"colour must be one of the keys"),
    ('topology = "default"\n[nodes.lb2]\nssh = "x"\n', r"nodes.lb2 must be a node of topology 'default'"),
    ('topology = "default"\n[nodes.lb]\nrepo = "/x"\n', r"nodes.lb.ssh must be a non-empty string"),
    ('topology = "default"\n[nodes.lb]\nssh = "x"\nsudo = "yes"\n', r"nodes.lb.sudo must be true or false"),
    ('topology = "default"\n', r"nodes must be a table \[nodes.NAME\]"),
    ('topology = "default"\n[nodes.lb]\nssh = "x"\n[trex]\nserver = "s"\nrx_port = 99\n',
     r"trex.rx_port must be an integer 0..63"),
    ('topology = "default"\n[nodes.lb]\nssh = "x"\n[trex]\nserver = "s"\ntx_mac = "zz"\n',
     r"trex.tx_mac must be a MAC"),
    ('topology = "default"\ntime_scale = 0.5\n[nodes.lb]\nssh = "x"\n', r"time_scale must be a number 1..1000"),
    ('topology = "nosuch"\n[nodes.lb]\nssh = "x"\n', r"nosuch"),
    ("topology = [\n", r"not valid TOML"),
])
def test_bad_target_files_are_named(tmp_path: Path, text: str, message: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(UsageError, match=message) as info:
        target.load(path)
    assert str(path) in str(info.value) or "nosuch" in message


def test_missing_target_file_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"does not exist.*l4lab target"):
        target.load(tmp_path / "none.toml")


def test_vagrant_target_from_ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("L4LAB_LIBVIRT_DRIVER", "kvm")
    path = target.for_vagrant("default", tmp_path, VAGRANT_SSH_CONFIG)
    t = target.load(path)
    assert set(t.nodes) == {"client", "router", "lb", "real1", "real2", "real3"}
    assert all(n.sudo and n.repo == "/vagrant" and n.ssh == name for name, n in t.nodes.items())
    assert t.ssh_options == ("-F", str(tmp_path / "ssh_config"))
    assert (tmp_path / "ssh_config").read_text() == VAGRANT_SSH_CONFIG
    assert t.time_scale == 1.0, "KVM guests run the suites' own intervals and timeouts"
    monkeypatch.setenv("L4LAB_LIBVIRT_DRIVER", "qemu")
    slow = target.load(target.for_vagrant("default", tmp_path / "tcg", VAGRANT_SSH_CONFIG))
    assert slow.time_scale == target.TCG_TIME_SCALE > 1, "TCG guests get the stretched timeouts"
    with pytest.raises(LabError, match="no host for real3"):
        target.for_vagrant("default", tmp_path / "partial", VAGRANT_SSH_CONFIG.split("Host real3")[0])


# --- over real ssh, into a netns lab ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def netns_target(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> target.Target:
    if not any(os.access(p, os.X_OK) for p in target.SSHD_CANDIDATES) or shutil.which("ssh") is None:
        pytest.skip("ssh/sshd missing: run scripts/setup.sh --extra ssh (make deps-all installs it)")
    return target.load(target.for_netns_lab(lab.name, "default", tmp_path_factory.mktemp("target")))


def test_commands_run_inside_the_node(lab: Lab, netns_target: target.Target) -> None:
    out = netns_target.run("client", ["ip", "-br", "addr", "show", "dev", "cl-rt"]).stdout
    assert "192.0.2.2/28" in out, f"ssh client did not land in the client's namespace: {out!r}"
    mac = netns_target.mac("lb", "lb-rt")
    assert mac == lab.mac("lb", "lb-rt")
    with pytest.raises(LabError, match=r"'false' on router exited 1"):
        netns_target.run("router", ["false"])
    written = Path("/tmp") / f"{lab.name}-written"
    try:
        netns_target.write("real2", str(written), "a 'quoted' line\n")
        assert written.read_text() == "a 'quoted' line\n"
    finally:
        written.unlink(missing_ok=True)


def test_remote_capture_streams_the_frames(lab: Lab, netns_target: target.Target, tmp_path: Path) -> None:
    from scapy.layers.inet import IP, UDP
    from scapy.utils import rdpcap

    pcap = tmp_path / "rt.pcap"
    send = ("import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(('192.0.2.2', 0))\n"
            "for i in range(5): s.sendto(b'capture %d' % i, ('192.0.2.1', 9))")
    with target.RemoteCapture(netns_target, "router", "rt-cl", pcap):
        netns_target.run("client", ["python3", "-c", send])
    got = sorted(bytes(p[UDP].payload) for p in rdpcap(str(pcap))
                 if IP in p and UDP in p and p[IP].src == "192.0.2.2" and p[UDP].dport == 9)
    assert got == [b"capture %d" % i for i in range(5)], f"captured {got}, sent 5 datagrams"


def test_shared_connections_run_every_command_over_one_connection(
        netns_target: target.Target, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Two commands to a node under shared_connections are sessions of one ssh connection (the same sshd
    is their parent), while without it each command connects anew; at the end no master and no socket
    folder is left."""
    def parent(tgt: target.Target) -> str:
        return tgt.run("real1", ["sh", "-c", "echo $PPID"]).stdout.strip()

    assert parent(netns_target) != parent(netns_target), "two unshared commands came through one connection"
    base = tmp_path_factory.getbasetemp()  # short: a socket path holds 107 bytes
    with target.shared_connections(netns_target, base) as shared:
        assert shared.control_dir is not None and Path(shared.control_dir).parent == base
        first, second = parent(shared), parent(shared)
        assert first == second, f"the second command came through another connection (sshd {first}, then {second})"
        master = subprocess.run(["ssh", *shared.ssh_argv("real1", ["true"])[1:-3], "-O", "check", "real1"],
                                capture_output=True, text=True, check=False)
        assert master.returncode == 0, f"no connection master answers for real1: {master.stderr}"
        assert _alive(first), f"the shared connection's sshd {first} is gone between commands"
        control = Path(shared.control_dir)
    assert not control.exists(), f"the control folder {control} outlived shared_connections"
    assert poll(10.0, lambda: not _alive(first), "the shared connection's sshd ended", check=False), \
        f"sshd {first} of the shared connection still runs after shared_connections ended"


def _alive(pid: str) -> bool:
    return Path(f"/proc/{pid}").exists()


def test_hardware_mode_runs_the_marked_suites(lab: Lab, netns_target: target.Target, tmp_path: Path) -> None:
    """pytest --target runs test_dsr and a churn test (marked hardware) over ssh, and skips an unmarked
    test saying why; the echo servers and the churn client it ran on the hosts are gone afterwards."""
    junit = tmp_path / "junit.xml"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--target={netns_target.path}",
         f"--junitxml={junit}", "-k", "ip4-ipip", "suites/conformance/test_dsr.py",
         "suites/conformance/test_churn.py::test_remove_real", "suites/conformance/test_robustness.py::test_storm"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"pytest --target failed:\n{done.stdout[-4000:]}\n{done.stderr[-2000:]}"
    cases = ET.parse(junit).getroot().iter("testcase")
    outcome: dict[str, str] = {}
    for case in cases:
        skipped = case.find("skipped")
        outcome[case.get("name", "")] = "passed" if skipped is None and case.find("failure") is None else (
            f"skipped: {skipped.get('message')}" if skipped is not None else "failed")
    marked = {k: v for k, v in outcome.items()
              if k.startswith(("test_replies", "test_client_never", "test_per_real", "test_remove"))}
    assert len(marked) == 4 and set(marked.values()) == {"passed"}, f"hardware-marked tests: {outcome}"
    other = [v for k, v in outcome.items() if k not in marked]
    assert other and all("needs the netns lab on this machine" in v for v in other), outcome
    left = _node_processes(lab.name, ("lab.nodes.tcp_services", "lab.nodes.churn_client"))
    assert not left, f"processes the suites started over ssh outlived the run: pids {left}"


def _node_processes(lab: str, modules: tuple[str, ...]) -> list[int]:
    """Live processes inside lab `lab`'s namespaces that run one of `modules` (`python -m MODULE`): only
    this lab's, since other labs on the machine (make test's other stream, other checkouts) run them too."""
    inodes = {os.stat(p).st_ino for p in NETNS_DIR.glob(f"{lab}-*")}
    return [p.pid for p in procs.walk(netns=True)
            if p.netns in inodes and any(m.encode() in p.argv for m in modules)]
