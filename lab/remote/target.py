"""target.py: a lab that is already built elsewhere (Vagrant VMs, bare metal), reached over SSH.

The suites and `l4lab bench --trex` drive such a lab through a target file (TOML)::

    name = "rack1"                      # a label for results and messages
    topology = "default"                # the addresses, VIPs and roles the hosts were built with
    ssh_options = ["-F", "ssh_config"]  # given to every ssh call (relative paths: the file's folder)
    time_scale = 8                      # the hosts run this many times slower than this machine's netns lab
                                        # (TCG guests): suites stretch request intervals and timeouts by it (default 1)

    [nodes.lb]                          # one table per topology node the tests use
    ssh = "root@192.0.2.20"             # the ssh destination (user@host or a Host alias)
    repo = "/opt/l4lab"                 # an l4lab checkout there with `make deps bpf` done (lb, client)
    python = ".venv/bin/python"         # relative to repo (default)
    interfaces = { "lb-rt" = "ens1f0" } # topology interface name → the host's (default: the same)
    capture = true                      # tcpdump may run there (default true; false for a hardware router)
    sudo = false                        # log in as an ordinary user, run commands with `sudo -n`

    [trex]                              # only for `l4lab bench --trex`
    server = "192.0.2.200"              # a TRex v3.04 server running `./t-rex-64 -i`
    tx_port = 0                         # sends to the VIP through the LB's NIC
    rx_port = 1                         # counts what the LB sent back (the LB's next hop is its MAC)
    tx_mac = "..."; rx_mac = "..."      # the MACs of those ports (the generated source; the LB's next hop)

Every command runs as `ssh [ssh_options] -o BatchMode=yes DEST -- 'shell-quoted argv'`, so a
host needs nothing but sshd, the tools the tests call (iproute2, ethtool, tcpdump) and, on nodes
with `repo`, the checkout. `l4lab target` writes a target file for a Vagrant lab (`--vagrant`,
from `vagrant ssh-config`) or for a running netns lab (`--netns NAME`: each node reached through
`sshd -i` started inside its namespace by ssh's ProxyCommand, so the hardware path of the suites
can be exercised on one machine, with real ssh and sshd in between).

`shared_connections(target)` gives a copy of the target whose commands share one ssh connection per
node (OpenSSH's ControlMaster, the sockets in a private temporary folder), closed and removed when
it ends: a new connection costs a key exchange, 3-8 s on a TCG guest, a command over a shared one
does not (figures in the README's Vagrant section). The suites' `--target` runs use it.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from balancer.validate import Reader
from lab.errors import LabError, TopologyError, UsageError
from lab.nsexec import netns_path
from lab.poll import poll
from lab.remote.libvirtd import driver
from lab.state import netns_name
from lab.topology import Topology
from lab.topology import load as load_topology

REPO = Path(__file__).resolve().parents[2]
SSHD_CANDIDATES = ("/usr/sbin/sshd", "/usr/bin/sshd")
CONTROL_PERSIST_S = 600  # an idle shared connection closes itself after this, should nothing close it
SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with its NUL
# Vagrant machines emulated by TCG, six on one or two CPUs: the churn suite's 200 connections at one
# request each 0.25 s timed out by the dozen before any change (84 of 200, measured); at 8 times the
# interval and timeout they carry the load (README, Vagrant section).
TCG_TIME_SCALE = 8.0


@dataclass(frozen=True)
class TargetNode:
    """One host of the target: how to reach it and what it holds."""

    name: str
    ssh: str
    repo: str | None = None
    python: str = ".venv/bin/python"
    interfaces: Mapping[str, str] = field(default_factory=dict)
    capture: bool = True
    sudo: bool = False  # log in as an ordinary user and run every command through `sudo -n`

    def ifname(self, topology_ifname: str) -> str:
        return self.interfaces.get(topology_ifname, topology_ifname)


@dataclass(frozen=True)
class TrexPorts:
    """The TRex server of a hardware bench and the two ports of the single-arm set-up."""

    server: str
    tx_port: int = 0
    rx_port: int = 1
    tx_mac: str = ""
    rx_mac: str = ""
    sync_port: int = 4501
    async_port: int = 4500


@dataclass(frozen=True)
class Target:
    """A lab reached over SSH, as a target file describes it."""

    name: str
    path: Path
    topology: Topology
    nodes: Mapping[str, TargetNode]
    ssh_options: tuple[str, ...] = ()
    trex: TrexPorts | None = None
    control_dir: str | None = None  # where the shared connections' sockets live (shared_connections)
    time_scale: float = 1.0  # how many times slower than the netns lab the hosts answer (TCG guests)

    def node(self, name: str) -> TargetNode:
        try:
            return self.nodes[name]
        except KeyError:
            raise UsageError(f"{self.path}: the target has no [nodes.{name}]; it lists "
                             f"{', '.join(sorted(self.nodes)) or 'no nodes'}") from None

    def ssh_argv(self, node: str, argv: Sequence[str], *, tty: bool = False) -> list[str]:
        """The local command line that runs `argv` on `node` (argv is shell-quoted for the remote shell)."""
        n = self.node(node)
        remote = shlex.join(["sudo", "-n", *argv] if n.sudo else list(argv))
        return ["ssh", *self.ssh_options, *self._control_options(), "-o", "BatchMode=yes",
                *(["-tt"] if tty else []), n.ssh, "--", remote]

    def _control_options(self) -> list[str]:
        """ssh options that share one connection per node through control_dir (none without it).

        The first command to a node becomes the connection's master and leaves it running in the
        background (ControlPersist); later ones open a session on it. %C hashes host, port and user."""
        if self.control_dir is None:
            return []
        return ["-o", "ControlMaster=auto", "-o", f"ControlPath={self.control_dir}/%C",
                "-o", f"ControlPersist={CONTROL_PERSIST_S}"]

    def run(self, node: str, argv: Sequence[str], *, check: bool = True, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]:
        """Run `argv` on `node`; raise LabError naming the node and command when it fails (with check)."""
        full = self.ssh_argv(node, argv)
        try:
            done = subprocess.run(full, capture_output=True, text=True, timeout=timeout, input=input, check=False)
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"'{shlex.join(argv)}' on {node} ({self.node(node).ssh}) did not finish within "
                           f"{timeout:g} s", command=shlex.join(full)) from exc
        if check and done.returncode != 0:
            why = done.stderr.strip()[-2000:]
            if done.returncode == 255:
                why = f"ssh could not reach {self.node(node).ssh}: {why}"
            raise LabError(f"'{shlex.join(argv)}' on {node} exited {done.returncode}: {why}",
                           command=shlex.join(full), stderr=done.stderr)
        return done

    def python_argv(self, node: str, module: str, *args: str) -> list[str]:
        """argv that runs `python -m module args` from the node's l4lab checkout."""
        n = self.node(node)
        if n.repo is None:
            raise UsageError(f"{self.path}: [nodes.{node}] needs repo = PATH (an l4lab checkout there) "
                             f"to run {module}")
        return ["sh", "-c", f"cd {shlex.quote(n.repo)} && exec {shlex.quote(n.python)} -m {shlex.quote(module)} "
                + shlex.join(args)]

    def write(self, node: str, path: str, text: str) -> None:
        """Write `text` to `path` on `node`."""
        self.run(node, ["sh", "-c", f"cat > {shlex.quote(path)}"], input=text)

    def mac(self, node: str, ifname: str) -> str:
        """The MAC address of the node's interface (the topology's name for it)."""
        import json

        host_if = self.node(node).ifname(ifname)
        out = self.run(node, ["ip", "-j", "link", "show", "dev", host_if]).stdout
        return str(json.loads(out)[0]["address"])


@contextlib.contextmanager
def shared_connections(target: Target, directory: str | Path | None = None) -> Iterator[Target]:
    """The target with one ssh connection per node that every command reuses, all closed at the end.

    The control sockets go to a new folder under `directory` (default: the temporary folder), which
    is removed afterwards; a master still there then is an error naming its socket::

        with shared_connections(load("target.toml")) as tgt:
            tgt.run("lb", ["true"])  # the first command connects, later ones reuse it
    """
    made = Path(tempfile.mkdtemp(prefix="l4lab-ssh-", dir=directory))
    if len(str(made)) + 1 + 40 > SOCKET_PATH_MAX:  # %C is 40 hex digits
        made.rmdir()
        raise LabError(f"the ssh control folder {made} is too long for a socket path ({SOCKET_PATH_MAX} bytes "
                       "with the 40-character name); set TMPDIR to a shorter folder")
    shared = replace(target, control_dir=str(made))
    try:
        yield shared
    finally:
        for node in shared.nodes.values():
            # `-O exit` asks the master to end; a node never contacted has none (ssh says so, exit 255)
            subprocess.run(["ssh", *shared.ssh_options, *shared._control_options(), "-O", "exit", node.ssh],
                           capture_output=True, text=True, check=False, timeout=30)
        # a master removes its socket as it exits, just after answering
        left = poll(10.0, lambda: sorted(p.name for p in made.iterdir()), "", until=lambda names: not names,
                    check=False)
        shutil.rmtree(made, ignore_errors=True)
        if left:
            raise LabError(f"ssh connection masters of target {target.name} did not exit: sockets {', '.join(left)} "
                           f"in {made}")


def load(path: str | Path) -> Target:
    """Read and validate a target file; every error names the file, the key and what was expected."""
    p = Path(path)
    where = str(p)
    try:
        data = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise UsageError(f"target file {p} does not exist; write one (see lab/remote/target.py) or run "
                         "`l4lab target --vagrant TOPOLOGY` / `l4lab target --netns NAME`") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{where}: not valid TOML: {exc}") from None
    check = _reader(where)
    check.known_keys(data, ("name", "topology", "ssh_options", "time_scale", "nodes", "trex"), "")
    name = check.string(data.get("name", p.stem), "name", empty=False)
    topo_spec = check.string(data.get("topology"), "topology", empty=False)
    topo_path = Path(topo_spec)
    if not topo_path.is_absolute() and (p.parent / topo_path).is_file():
        topo_path = p.parent / topo_path
    topo = load_topology(topo_path if topo_path.is_file() else topo_spec)
    opts = data.get("ssh_options", [])
    if not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
        raise check.fail("ssh_options", opts, "a list of strings")
    opts = [_relative(p.parent, o, prev) for prev, o in zip([None, *opts], opts, strict=False)]
    raw_nodes = check.table(data.get("nodes"), "nodes", "a table [nodes.NAME] per host")
    if not raw_nodes:
        raise check.fail("nodes", raw_nodes, "a table [nodes.NAME] per host")
    names = {n.name for n in topo.nodes}
    nodes: dict[str, TargetNode] = {}
    for node_name, raw in raw_nodes.items():
        key = f"nodes.{node_name}"
        if node_name not in names:
            raise check.fail(key, node_name, f"a node of topology '{topo.name}' ({', '.join(sorted(names))})")
        nodes[node_name] = _node(check, key, node_name, check.table(raw, key))
    trex = _trex(check, data["trex"]) if "trex" in data else None
    scale = check.number(data.get("time_scale", 1.0), "time_scale", 1.0, 1000.0, expected="a number 1..1000")
    return Target(name, p, topo, nodes, tuple(opts), trex, time_scale=scale)


def _reader(where: str) -> Reader:
    """balancer.validate's checks with the target file's errors (TopologyError naming the file)."""
    def fail(key: str, value: object, expected: str) -> TopologyError:
        return TopologyError(where, key, value, expected)

    def unknown(key: str, value: object, known: Sequence[str]) -> TopologyError:
        return TopologyError(where, key, value, f"one of the keys {', '.join(sorted(known))}")

    return Reader(fail, unknown)


def _relative(base: Path, option: str, previous: str | None) -> str:
    """A file argument of -F / -i / UserKnownHostsFile-style options, made absolute against the file's folder."""
    if previous in ("-F", "-i") and not os.path.isabs(option):
        return str((base / option).resolve())
    return option


def _node(check: Reader, key: str, name: str, raw: dict[str, Any]) -> TargetNode:
    check.known_keys(raw, ("ssh", "repo", "python", "interfaces", "capture", "sudo"), key)
    ssh = check.string(raw.get("ssh"), f"{key}.ssh", empty=False)
    repo = raw.get("repo")
    if repo is not None:
        repo = check.string(repo, f"{key}.repo", empty=False)
    python = check.string(raw.get("python", ".venv/bin/python"), f"{key}.python", empty=False)
    interfaces = raw.get("interfaces", {})
    if not isinstance(interfaces, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                    for k, v in interfaces.items()):
        raise check.fail(f"{key}.interfaces", interfaces, 'a table of topology interface name = "host interface name"')
    return TargetNode(name, ssh, repo, python, dict(interfaces),
                      check.boolean(raw.get("capture", True), f"{key}.capture"),
                      check.boolean(raw.get("sudo", False), f"{key}.sudo"))


def _trex(check: Reader, raw: Any) -> TrexPorts:
    raw = check.table(raw, "trex")
    check.known_keys(raw, ("server", "tx_port", "rx_port", "tx_mac", "rx_mac", "sync_port", "async_port"), "trex")
    ints = {k: check.integer(raw.get(k, default), f"trex.{k}", 0, hi)
            for k, default, hi in (("tx_port", 0, 63), ("rx_port", 1, 63), ("sync_port", 4501, 65535),
                                   ("async_port", 4500, 65535))}
    macs = {k: check.mac(raw[k], f"trex.{k}", "a MAC address like 0c:42:a1:00:00:01") if raw.get(k, "") != ""
            else "" for k in ("tx_mac", "rx_mac")}
    return TrexPorts(check.string(raw.get("server"), "trex.server", empty=False), ints["tx_port"],
                     ints["rx_port"], macs["tx_mac"], macs["rx_mac"], ints["sync_port"], ints["async_port"])

class RemoteCapture:
    """tcpdump on a target node's interface, streamed over ssh into a local pcap file.

    The remote shell runs tcpdump in the background and waits on its own standard input; closing
    that input (stop) interrupts tcpdump, which flushes and exits, and ssh returns."""

    def __init__(self, target: Target, node: str, ifname: str, path: Path, snaplen: int = 512) -> None:
        host_if = target.node(node).ifname(ifname)
        dump = shlex.join(["tcpdump", "-i", host_if, "--immediate-mode", "-U", "-n", "-s", str(snaplen),
                           "-w", "-"])
        script = f"{dump} & p=$!; read _; kill -INT $p; wait $p"
        self.path = path
        self._out = open(path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(target.ssh_argv(node, ["sh", "-c", script]), stdin=subprocess.PIPE,
                                     stdout=self._out, stderr=subprocess.PIPE)
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = self.proc.stderr.readline().decode(errors="replace")
            if "listening on" in line:
                return
            if not line and self.proc.poll() is not None:
                break
        self.stop()
        raise LabError(f"tcpdump on {host_if} of {node} ({target.node(node).ssh}) did not start",
                       command=dump)

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait()
        self._out.close()

    def __enter__(self) -> RemoteCapture:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- writing target files ----------------------------------------------------------------------------


def _sshd() -> str:
    for path in SSHD_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    raise LabError("sshd not found: install openssh-server (scripts/setup.sh --ssh, or make deps-all)")


def for_netns_lab(lab: str, topology: str, directory: Path) -> Path:
    """Write a target file (and its keys and ssh/sshd configs) for the running netns lab `lab`.

    Each node is reached by `ssh NODE`, whose ProxyCommand starts `sshd -i` inside the node's
    namespace: a real ssh session with a real sshd, nothing listening, nothing left running."""
    topo = load_topology(topology)
    sshd = _sshd()
    directory.mkdir(parents=True, exist_ok=True)
    host_key, user_key = directory / "host_ed25519", directory / "id_ed25519"
    for key in (host_key, user_key):
        if not key.exists():
            _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"l4lab target {lab}", "-f", str(key)],
                 "make an ssh key")
    (directory / "authorized_keys").write_text(Path(f"{user_key}.pub").read_text())
    os.chmod(directory / "authorized_keys", 0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    sshd_config = directory / "sshd_config"
    sshd_config.write_text("\n".join([
        f"HostKey {host_key}",
        f"AuthorizedKeysFile {directory / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "UsePAM no", "StrictModes no", "PrintMotd no", "AcceptEnv LANG LC_*", "",
    ]))
    known = directory / "known_hosts"
    pub = Path(f"{host_key}.pub").read_text().split()
    hosts = [node.name for node in topo.nodes if node.kind == "netns"]
    config = []
    for h in hosts:
        proxy = shlex.join(["nsenter", f"--net={netns_path(netns_name(lab, h))}", "--", sshd, "-i",
                            "-f", str(sshd_config)])
        config.append(f"Host {h}\n  HostName {h}\n  User root\n  IdentityFile {user_key}\n"
                      f"  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n  LogLevel ERROR\n"
                      f"  ProxyCommand {proxy}\n")
    (directory / "ssh_config").write_text("\n".join(config))
    known.write_text("".join(f"{h} {pub[0]} {pub[1]}\n" for h in hosts))
    lines = [f'name = "{lab}"', f'topology = "{topo.path}"', 'ssh_options = ["-F", "ssh_config"]', ""]
    for h in hosts:
        lines += [f"[nodes.{h}]", f'ssh = "{h}"', f'repo = "{REPO}"', f'python = "{sys.executable}"', ""]
    out = directory / "target.toml"
    out.write_text("\n".join(lines))
    return out


def for_vagrant(topology: str, directory: Path, ssh_config: str | None = None,
                env: Mapping[str, str] | None = None, machines: Sequence[str] | None = None,
                time_scale: float | None = None) -> Path:
    """Write a target file for the Vagrant lab of `topology` (run from the repository, after `vagrant up`).

    `ssh_config` is the output of `vagrant ssh-config` (read by running it when None). Vagrant logs
    in as the vagrant user, so every command runs through `sudo -n`; the checkout is the synced folder.
    `env` is the environment of `vagrant ssh-config` (default: this process's, with L4LAB_TOPOLOGY);
    `machines` the nodes that are up (default: every node of the topology); `time_scale` the file's
    (default TCG_TIME_SCALE when libvirt's driver is qemu, TCG, else 1)."""
    from lab.remote.vagrant import plan  # the Vagrant planner reads balancer configs (numpy): only Vagrant labs need it

    topo = load_topology(topology)
    p = plan(topo, driver="")
    if ssh_config is None:
        if shutil.which("vagrant") is None:
            raise LabError("vagrant not found: install it (scripts/setup.sh --vagrant) and `vagrant up` first")
        # only the machines that are up: one never created fails the whole command
        done = subprocess.run(["vagrant", "ssh-config", *(machines or ())], capture_output=True, text=True,
                              cwd=REPO, check=False,
                              env={**(env if env is not None else os.environ), "L4LAB_TOPOLOGY": topology})
        if done.returncode != 0:
            raise LabError(f"`vagrant ssh-config` failed (is the lab up? `L4LAB_TOPOLOGY={topology} vagrant up`): "
                           f"{done.stderr.strip()}")
        ssh_config = done.stdout
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "ssh_config").write_text(ssh_config)
    hosts = {line.split()[1] for line in ssh_config.splitlines() if line.strip().startswith("Host ")}
    nodes = [n for n in p["nodes"] if machines is None or n["name"] in machines]
    missing = [n["name"] for n in nodes if n["name"] not in hosts]
    if missing:
        raise LabError(f"`vagrant ssh-config` lists no host for {', '.join(missing)}: is every machine up?")
    if time_scale is None:
        time_scale = TCG_TIME_SCALE if driver() == "qemu" else 1.0
    lines = [f'name = "vagrant-{topo.name}"', f'topology = "{topo.path}"', 'ssh_options = ["-F", "ssh_config"]',
             f"time_scale = {time_scale:g}", ""]
    for n in nodes:
        lines += [f"[nodes.{n['name']}]", f'ssh = "{n["name"]}"', f'repo = "{p["synced_folder"]}"', "sudo = true",
                  ""]
    out = directory / "target.toml"
    out.write_text("\n".join(lines))
    return out


def _run(argv: Sequence[str], what: str) -> None:
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LabError(f"cannot {what}: '{' '.join(argv)}' failed: {done.stderr.strip()}", step=what,
                       command=" ".join(argv), stderr=done.stderr)
