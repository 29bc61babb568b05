"""Every lbctl verb in a hostile environment: refused in one line, exit 1, the running datapath untouched.

One datapath is loaded per module (a private netns, one veth pair, IPv6 off so that no ND or MLD
frame reaches the program and moves a counter). Each case runs one verb as its own process under
one fault, then compares a dump of every pinned map and link (bpftool, one batch) and the state
file with the dump taken before: byte for byte, counters included.

    faults: bpffs hidden by a tmpfs in a private mount namespace (`unshare -m`); `ip netns exec`
            (remounts /sys); CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN and CAP_NET_ADMIN dropped
            (`setpriv`); a daemon that owns the instance; the metrics port taken; the interface
            deleted under a loaded instance; kernel BTF hidden (not a fault: nothing needs it).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from balancer import controller, preflight
from balancer.errors import HostError
from lab.harness import poll, unique_name

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
METRICS_PORT = 19411

CONFIG = """
[datapath]
interfaces = ["flt0"]
ring_size = 251
max_vips = 8
max_reals = 16
lru_size = 256
fallback_size = 256

[encap]
nexthop_mac = "02:00:00:00:00:01"

[metrics]
listen = "127.0.0.1:{port}"

[[vips]]
address = "198.51.100.100"
port = 80
proto = "tcp"
reals = [{{ address = "203.0.113.18" }}, {{ address = "203.0.113.34", weight = {weight} }}]
"""

# Every lbctl verb, with arguments that would change the datapath if it were carried out: a
# check that fails to fire shows up as a changed dump, not only as a wrong exit status.
VERBS: dict[str, tuple[str, ...]] = {
    "load": ("load", "--config", "{changed}"),
    "load-force": ("load", "--config", "{changed}", "--force-reload"),
    "apply": ("apply", "{changed}"),
    "upgrade": ("upgrade",),
    "unload": ("unload",),
    "status": ("status",),
    "stats": ("stats", "--json"),
    "vip-add": ("vip", "add", "198.51.100.101", "80", "tcp"),
    "vip-del": ("vip", "del", "198.51.100.100", "80", "tcp"),
    "vip-list": ("vip", "list"),
    "real-add": ("real", "add", "198.51.100.100", "80", "tcp", "203.0.113.50"),
    "real-del": ("real", "del", "198.51.100.100", "80", "tcp", "203.0.113.18"),
    "real-set-weight": ("real", "set-weight", "198.51.100.100", "80", "tcp", "203.0.113.18", "--weight", "5"),
    "real-list": ("real", "list", "198.51.100.100", "80", "tcp"),
    "run": ("run", "--config", "{changed}"),
}
READS = {"status", "stats", "vip-list", "real-list"}
HANDED_OVER = {"upgrade"}  # carried out by a daemon that owns the instance (balancer/handover.py)

DROPPED = "-bpf,-perfmon,-sys_admin,-net_admin"
HIDE_BPFFS = 'mount -t tmpfs tmpfs /sys/fs/bpf && exec "$@"'


@dataclass
class Lb:
    """The module's loaded datapath: its netns, instance, config files and a way to run lbctl."""

    ns: str
    instance: str
    config: Path
    changed: Path
    tmp: Path

    def argv(self, verb: str) -> list[str]:
        args = [a.format(changed=self.changed) for a in VERBS[verb]]
        return [PY, "-m", "balancer.cli", "--instance", self.instance, *args]

    def run(self, argv: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
        env = dict(os.environ, PYTHONPATH=str(REPO), TMPDIR=str(self.tmp))
        return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=timeout,
                              check=False)

    def inside(self, argv: list[str]) -> list[str]:
        return ["nsenter", f"--net=/run/netns/{self.ns}", *argv]

    def pins(self) -> Path:
        return Path(controller.Instance.pin_dir(self.instance))


def mac_only(lb: Lb) -> Path:
    """A config of defaults but the next-hop MAC (this netns has no router to find one through)."""
    path = lb.tmp / "mac-only.toml"
    path.write_text('[datapath]\ninterfaces = ["flt1"]\n\n[encap]\nnexthop_mac = "02:00:00:00:00:01"\n')
    return path


def snapshot(lb: Lb) -> dict[str, object]:
    """Every pinned map's id and contents, every pinned link's program, and the state file."""
    pins = sorted(lb.pins().iterdir())
    cmds = []
    for p in pins:
        if p.name.startswith("link_"):
            cmds.append(f"link show pinned {p}")
        else:
            cmds += [f"map show pinned {p}", f"map dump pinned {p}"]
    done = subprocess.run(["bpftool", "-j", "batch", "file", "-"], input="\n".join(cmds) + "\n",
                          capture_output=True, text=True, check=True)
    out: dict[str, object] = {" ".join(r["command"]): r["output"] for r in json.loads(done.stdout)}
    out["state"] = controller.Instance.state_path(lb.instance).read_text()
    return out


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got {len(lines)}:\n{stderr}"
    assert "Traceback" not in stderr
    return lines[0]


def refusal(done: subprocess.CompletedProcess[str], verb: str) -> str:
    """The one message of a refused verb: lbctl's stderr line, or the daemon's start_failed JSON line."""
    line = one_line(done.stderr)
    if verb == "run":
        rec = json.loads(line)
        assert rec["event"] == "start_failed", line
        return str(rec["error"])
    assert line.startswith("lbctl: "), line
    return line


@pytest.fixture(scope="module")
def lb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lb]:
    """Name: lb. Scope: module. Depends: root, bpffs, built balancer object, bpftool, setpriv, unshare.

    A netns `flt-XXXXXX` with a veth pair (flt0, flt1; IPv6 off), the balancer loaded on flt0 by
    `lbctl load` under a unique instance, removed afterwards with everything of it::

        def test_x(lb):
            before = snapshot(lb); lb.run(lb.inside(lb.argv("status")))
    """
    if os.geteuid() != 0:
        pytest.skip("needs root")
    for tool in ("bpftool", "setpriv", "unshare", "nsenter"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: run `make deps`")
    tmp = tmp_path_factory.mktemp("faults")
    ns = unique_name("flt")
    subprocess.run(["ip", "netns", "add", ns], check=True)
    instance = ns
    try:
        for key in ("all", "default"):
            subprocess.run(["ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv6.conf.{key}.disable_ipv6=1"],
                           check=True)
        subprocess.run(["ip", "-n", ns, "link", "add", "flt0", "type", "veth", "peer", "name", "flt1"], check=True)
        for dev in ("flt0", "flt1"):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        config, changed = tmp / "lb.toml", tmp / "changed.toml"
        config.write_text(CONFIG.format(port=METRICS_PORT, weight=2))
        changed.write_text(CONFIG.format(port=METRICS_PORT, weight=3))
        handle = Lb(ns, instance, config, changed, tmp)
        done = handle.run(handle.inside([PY, "-m", "balancer.cli", "--instance", instance, "load",
                                         "--config", str(config)]))
        assert done.returncode == 0, done.stderr
        yield handle
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(controller.Instance.pin_dir(instance), ignore_errors=True)
        controller.Instance.state_path(instance).unlink(missing_ok=True)
        preflight.lock_path(controller.STATE_ROOT, instance).unlink(missing_ok=True)


FAULTS: dict[str, tuple[Callable[[Lb, list[str]], list[str]], str]] = {
    # fault: (how the command is run, what its one line must say)
    "bpffs-hidden": (lambda lb, argv: lb.inside(["unshare", "-m", "--propagation", "private",
                                                 "sh", "-c", HIDE_BPFFS, "sh", *argv]),
                     "bpffs is hidden: /sys/fs/bpf/lbctl lies on tmpfs (/sys/fs/bpf)"),
    "ip-netns-exec": (lambda lb, argv: ["ip", "netns", "exec", lb.ns, *argv],
                      "bpffs is hidden: /sys/fs/bpf/lbctl lies on sysfs (/sys)"),
    "no-caps": (lambda lb, argv: lb.inside(["setpriv", "--inh-caps=-all", f"--bounding-set={DROPPED}", *argv]),
                "needs CAP_BPF"),
    "not-root": (lambda lb, argv: lb.inside(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                             *argv]),
                 "lacks CAP_BPF"),
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_verb_under_a_host_fault_is_one_line_and_changes_nothing(lb: Lb, fault: str) -> None:
    """All verbs of one fault run at once (each its own process: seconds, not a minute); any that
    got past its check would show in the dump taken after all of them."""
    wrap, message = FAULTS[fault]
    before = snapshot(lb)
    wrong = {}
    for verb, done in run_all({verb: wrap(lb, lb.argv(verb)) for verb in VERBS}).items():
        try:
            assert done.returncode == 1 and done.stdout == "", f"exit {done.returncode}"
            assert message in refusal(done, verb)
        except AssertionError as exc:
            wrong[verb] = f"{exc}: {done.stderr.strip()}"
    assert wrong == {}
    assert snapshot(lb) == before


def run_all(argvs: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run every command at once (each its own process) and wait for all."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = {k: subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                                 env=env) for k, argv in argvs.items()}
    out = {}
    for k, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        out[k] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return out


def test_the_hidden_bpffs_message_says_how_to_reach_it(lb: Lb) -> None:
    done = lb.run(["ip", "netns", "exec", lb.ns, *lb.argv("status")])
    line = one_line(done.stderr)
    assert "`ip netns exec` remounts /sys" in line and "nsenter --net=/run/netns/NS" in line
    assert "l4lab exec NODE -- lbctl" in line


def test_a_state_file_whose_pins_are_unseen_is_not_stale(lb: Lb) -> None:
    """A fresh bpffs mounted over the host's one (what an operator might do after the hint) shows
    no pins: the state file then names a datapath running elsewhere, and nothing loads over it,
    --force-reload included while the interface has an XDP program."""
    fresh = 'mount -t bpf bpf /sys/fs/bpf && exec "$@"'
    before = snapshot(lb)
    link = before[f"link show pinned {lb.pins() / 'link_flt0'}"]
    assert isinstance(link, dict)
    unseen = f"instance '{lb.instance}' has a state file"
    for verb, message in (("run", unseen), ("load", unseen), ("status", unseen), ("apply", unseen),
                          ("load-force", f"attached to flt0 (prog id {link['prog_id']})")):
        argv = lb.inside(["unshare", "-m", "--propagation", "private", "sh", "-c", fresh, "sh", *lb.argv(verb)])
        done = lb.run(argv)
        assert done.returncode == 1, (verb, done.stderr)
        assert message in refusal(done, verb), verb
        assert snapshot(lb) == before, verb


def test_force_reload_loads_once_the_interface_is_free(lb: Lb) -> None:
    """Pins gone for good (removed by hand, which detached the link) while the state file stayed:
    refused without the flag, loaded with it, because no XDP program is on the interface any more."""
    before = snapshot(lb)
    other = lb.instance + "-fr"
    argv = [PY, "-m", "balancer.cli", "--instance", other, "load", "--interface", "flt1", "--mode", "generic",
            "--config", str(mac_only(lb))]
    try:
        assert lb.run(lb.inside(argv)).returncode == 0
        shutil.rmtree(controller.Instance.pin_dir(other))
        refused = lb.run(lb.inside(argv))
        assert refused.returncode == 1
        assert f"instance '{other}' has a state file" in one_line(refused.stderr)
        assert "if no XDP program is attached to flt1" in one_line(refused.stderr)
        forced = lb.run(lb.inside([*argv, "--force-reload"]))
        assert forced.returncode == 0, forced.stderr
        assert (lb.pins().parent / other / "link_flt1").exists()
        assert lb.run(lb.inside([PY, "-m", "balancer.cli", "--instance", other, "unload"])).returncode == 0
    finally:
        shutil.rmtree(controller.Instance.pin_dir(other), ignore_errors=True)
        controller.Instance.state_path(other).unlink(missing_ok=True)
        preflight.lock_path(controller.STATE_ROOT, other).unlink(missing_ok=True)
    assert snapshot(lb) == before


def test_a_daemon_owns_the_instance(lb: Lb) -> None:
    """While `lbctl run` runs, a second daemon and every verb that writes but upgrade are refused naming
    it; reads still work; nothing changes. Upgrade is handed to the daemon."""
    log = lb.tmp / "daemon.log"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    with open(log, "w") as out:
        daemon = subprocess.Popen(lb.inside([PY, "-m", "balancer.cli", "--instance", lb.instance, "run",
                                             "--config", str(lb.config)]), cwd=REPO, env=env, stderr=out)
    try:
        def running() -> bool:
            if '"event":"running"' in log.read_text():
                return True
            assert daemon.poll() is None, log.read_text()
            return False

        poll(30.0, running, f"the daemon's running event in {log}")
        before = snapshot(lb)
        refused = {verb: argv for verb in VERBS if verb not in HANDED_OVER for argv in [lb.inside(lb.argv(verb))]}
        for verb, done in run_all(refused).items():
            if verb in READS:
                assert done.returncode == 0, (verb, done.stderr)
                continue
            assert done.returncode == 1, (verb, done.stderr)
            assert f"instance '{lb.instance}' is owned by lbctl run (pid {daemon.pid})" in refusal(done, verb), verb
        assert snapshot(lb) == before
        # upgrade is the daemon's to carry out (test_daemon.py checks it in full): it swaps the program only.
        done = lb.run(lb.inside(lb.argv("upgrade")))
        assert done.returncode == 0 and done.stdout.startswith("replaced the program behind"), done.stderr
        after = snapshot(lb)
        # Links and the tail-call arrays (lb_progs*) hold program ids: an upgrade changes exactly those.
        def same(k: str) -> bool:
            return "link show" not in k and "/lb_progs" not in k
        assert {k: v for k, v in after.items() if same(k)} == {k: v for k, v in before.items() if same(k)}
        assert after != before  # the link runs another program
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=20) == 0, log.read_text()


def test_a_taken_metrics_port_refuses_the_daemon_before_it_touches_anything(lb: Lb) -> None:
    before = snapshot(lb)
    holder = subprocess.Popen(lb.inside([PY, "-c", (
        "import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1);"
        f"s.bind(('127.0.0.1', {METRICS_PORT})); s.listen(); print('ready', flush=True); sys.stdin.read()")]),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        done = lb.run(lb.inside(lb.argv("run")))
        assert done.returncode == 1, done.stderr
        assert f"cannot listen for metrics on 127.0.0.1:{METRICS_PORT}: Address already in use" \
            in refusal(done, "run")
        assert snapshot(lb) == before
    finally:
        holder.kill()
        holder.wait()


def test_kernel_btf_is_not_needed(lb: Lb) -> None:
    """With /sys/kernel/btf hidden every read works and an unchanged config applies with 0 writes."""
    hide = 'mount -t tmpfs tmpfs /sys/kernel/btf && exec "$@"'
    before = snapshot(lb)
    for argv in (lb.argv("status"), lb.argv("stats"),
                 [PY, "-m", "balancer.cli", "--instance", lb.instance, "apply", str(lb.config)]):
        done = lb.run(lb.inside(["unshare", "-m", "--propagation", "private", "sh", "-c", hide, "sh", *argv]))
        assert done.returncode == 0, done.stderr
    assert "nothing to change" in done.stdout
    assert snapshot(lb) == before


def test_an_interface_deleted_under_a_loaded_instance(lb: Lb) -> None:
    """A second instance on its own veth; the veth goes: status says so, a load on it is one line,
    every verb runs without a traceback, unload removes the pins; the module's datapath is untouched."""
    before = snapshot(lb)
    other = lb.instance + "-if"
    subprocess.run(["ip", "-n", lb.ns, "link", "add", "fltx0", "type", "veth", "peer", "name", "fltx1"], check=True)
    subprocess.run(["ip", "-n", lb.ns, "link", "set", "fltx0", "up"], check=True)
    conf = lb.tmp / "other.toml"
    conf.write_text(CONFIG.replace('"flt0"', '"fltx0"').format(port=METRICS_PORT + 1, weight=1))

    def ctl(*args: str) -> subprocess.CompletedProcess[str]:
        return lb.run(lb.inside([PY, "-m", "balancer.cli", "--instance", other, *args]))

    try:
        assert ctl("load", "--config", str(conf)).returncode == 0
        for step in (["set", "fltx0", "down"], ["set", "fltx0", "name", "fltx9"]):
            subprocess.run(["ip", "-n", lb.ns, "link", *step], check=True)
        status = json.loads(ctl("status", "--json").stdout)
        assert status["interfaces"] == {"fltx0": "missing"}
        assert status["missing_interfaces"]["fltx0"].startswith("renamed to 'fltx9' (ifindex ")
        subprocess.run(["ip", "-n", lb.ns, "link", "del", "fltx9"], check=True)
        status = ctl("status", "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["interfaces"] == {"fltx0": "missing"}
        assert json.loads(status.stdout)["missing_interfaces"]["fltx0"].startswith("deleted; its XDP link is detached")
        for args in (("stats",), ("apply", str(conf)), ("vip", "list"), ("upgrade",)):
            done = ctl(*args)
            assert "Traceback" not in done.stderr, (args, done.stderr)
        again = ctl("load", "--interface", "fltx0", "--force-reload")
        assert again.returncode == 1
        assert "already loaded" in one_line(again.stderr)
        gone = lb.run(lb.inside([PY, "-m", "balancer.cli", "--instance", other + "-b", "load", "--interface",
                                 "fltx0"]))
        assert gone.returncode == 1 and "cannot find interface 'fltx0'" in one_line(gone.stderr)
        assert not Path(controller.Instance.pin_dir(other + "-b")).exists()
        assert ctl("unload").returncode == 0
        assert not Path(controller.Instance.pin_dir(other)).exists()
        assert not preflight.lock_path(controller.STATE_ROOT, other).exists()
    finally:
        for dev in ("fltx0", "fltx9"):
            subprocess.run(["ip", "-n", lb.ns, "link", "del", dev], check=False, capture_output=True)
        shutil.rmtree(controller.Instance.pin_dir(other), ignore_errors=True)
        controller.Instance.state_path(other).unlink(missing_ok=True)
        preflight.lock_path(controller.STATE_ROOT, other).unlink(missing_ok=True)
    assert snapshot(lb) == before


def test_native_xdp_the_driver_lacks_is_one_line_and_leaves_nothing(lb: Lb) -> None:
    """lo has no native XDP: the load fails at attach, after maps were made and pinned, and takes
    back exactly what it made."""
    before = snapshot(lb)
    other = lb.instance + "-lo"
    done = lb.run(lb.inside([PY, "-m", "balancer.cli", "--instance", other, "load", "--interface", "lo",
                             "--mode", "native"]))
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert "cannot attach XDP program 'balancer_xdp' to 'lo' in native mode" in line and "try --mode generic" in line
    assert not Path(controller.Instance.pin_dir(other)).exists()
    assert not controller.Instance.state_path(other).exists()
    assert not preflight.lock_path(controller.STATE_ROOT, other).exists()
    assert snapshot(lb) == before


@pytest.mark.parametrize("key", ["lru_size"])
def test_map_sizes_the_kernel_refuses_are_one_line_and_leave_nothing(lb: Lb, key: str) -> None:
    """2^32 - 1 entries per CPU: the kernel refuses the IPv4 sets (2^31 sets of 128 bytes: ENOMEM, as
    the memory cgroup charges them) or the IPv6 hash map (E2BIG), whichever it creates first, and
    nothing is left. (RLIMIT_MEMLOCK no longer limits BPF maps since Linux 5.11: the memory cgroup does.)"""
    before = snapshot(lb)
    other = lb.instance + "-big"
    conf = lb.tmp / f"{key}.toml"
    conf.write_text(CONFIG.format(port=METRICS_PORT, weight=1).replace(f"{key} = 256", f"{key} = 4294967295"))
    done = lb.run(lb.inside([PY, "-m", "balancer.cli", "--instance", other, "load", "--config", str(conf)]))
    assert done.returncode == 1
    line = one_line(done.stderr)
    assert "(map 'lb_sess4_sets'): Cannot allocate memory" in line or \
        "(map 'lb_sessions'): Argument list too long" in line, line
    assert "the kernel refused the map sizes: lower datapath.lru_size" in line
    assert not Path(controller.Instance.pin_dir(other)).exists()
    assert not controller.Instance.state_path(other).exists()
    assert not preflight.lock_path(controller.STATE_ROOT, other).exists()
    assert snapshot(lb) == before


def test_unload_removes_pins_left_without_a_state_file(lb: Lb) -> None:
    """What the old `lbctl run` left (pins, no state): `lbctl unload` removes them, nothing else."""
    before = snapshot(lb)
    other = lb.instance + "-left"
    try:
        assert lb.run(lb.inside([PY, "-m", "balancer.cli", "--instance", other, "load", "--interface",
                                 "flt1", "--config", str(mac_only(lb))])).returncode == 0
        controller.Instance.state_path(other).unlink()
        done = lb.run(lb.inside([PY, "-m", "balancer.cli", "--instance", other, "unload"]))
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"unloaded instance '{other}' (it had pins under ")
        assert not Path(controller.Instance.pin_dir(other)).exists()
        assert not preflight.lock_path(controller.STATE_ROOT, other).exists()
    finally:
        shutil.rmtree(controller.Instance.pin_dir(other), ignore_errors=True)
        controller.Instance.state_path(other).unlink(missing_ok=True)
    assert snapshot(lb) == before


def test_a_damaged_state_file_is_one_line(lb: Lb) -> None:
    state = controller.Instance.state_path(lb.instance)
    saved = state.read_bytes()
    before = snapshot(lb)
    try:
        for text in ("{not json", '{"instance": 1}'):
            state.write_text(text)
            for verb in ("status", "apply", "unload"):
                done = lb.run(lb.inside(lb.argv(verb)))
                assert done.returncode == 1, (text, verb, done.stderr)
                assert f"the state file {state} of instance '{lb.instance}' is damaged (" in one_line(done.stderr)
    finally:
        state.write_bytes(saved)
    assert snapshot(lb) == before


def test_an_unexpected_error_is_one_line_and_a_log(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A bug (here: a verb that raises RuntimeError) prints one line naming the log of its traceback."""
    import dataclasses

    from balancer import cli

    def broken(_args: object) -> int:
        raise RuntimeError("a bug\nover two lines")

    monkeypatch.setitem(cli.VERBS, "vip", dataclasses.replace(cli.VERBS["vip"], run=broken))
    monkeypatch.setattr(controller, "STATE_ROOT", str(tmp_path))
    assert cli.main(["--instance", "nobody", "vip", "list"]) == 1
    line = one_line(capsys.readouterr().err)
    assert line.startswith("lbctl: unexpected error (RuntimeError: a bug); the traceback is in ")
    log = Path(line.rsplit("the traceback is in ", 1)[1])
    assert log.parent == tmp_path and "in broken" in log.read_text()


def test_tunnel_health_checks_need_tcx() -> None:
    """TCX links came with Linux 6.6; an older kernel is refused in one line naming the fix."""
    with pytest.raises(HostError, match=r'probe attaches through TCX, which needs Linux 6.6 or newer, but this '
                                        r'kernel is 6.1.0-18-amd64; use via = "direct"'):
        preflight.require_tcx("probe", "6.1.0-18-amd64")
    for release in ("6.6.0", "6.18.44-fc-v1147", "7.0.1"):
        preflight.require_tcx("probe", release)


MOUNTS = {
    "host": ["22 1 0:20 / /sys rw - sysfs sysfs rw", "30 22 0:28 / /sys/fs/bpf rw - bpf bpf rw"],
    "ip netns exec": ["22 1 0:20 / /sys rw - sysfs sysfs rw", "30 22 0:28 / /sys/fs/bpf rw - bpf bpf rw",
                      "41 1 0:40 / /sys rw - sysfs sysfs rw"],  # a new /sys over the old one hides its mounts
    "tmpfs over": ["22 1 0:20 / /sys rw - sysfs sysfs rw", "30 22 0:28 / /sys/fs/bpf rw - bpf bpf rw",
                   "42 30 0:41 / /sys/fs/bpf rw - tmpfs tmpfs rw"],
    "never mounted": ["22 1 0:20 / /sys rw - sysfs sysfs rw"],
}


@pytest.mark.parametrize(("mine", "host", "expected"), [
    ("host", "host", None),
    ("ip netns exec", "host", "bpffs is hidden: /sys/fs/bpf/lbctl lies on sysfs (/sys) in this mount namespace"),
    ("tmpfs over", "host", "bpffs is hidden: /sys/fs/bpf/lbctl lies on tmpfs (/sys/fs/bpf)"),
    ("never mounted", "never mounted", "bpffs is not mounted: /sys/fs/bpf/lbctl lies on sysfs (/sys); "
                                       "mount it with `mount -t bpf bpf /sys/fs/bpf`"),
], ids=["host", "ip-netns-exec", "tmpfs-over", "never-mounted"])
def test_where_bpffs_is_found_from_the_mount_tables(tmp_path: Path, mine: str, host: str,
                                                    expected: str | None) -> None:
    """The mount tables of each case, as /proc/PID/mountinfo lists them (mounts in order)."""
    files = []
    for name, which in (("self", mine), ("init", host)):
        files.append(tmp_path / name)
        files[-1].write_text("\n".join(MOUNTS[which]) + "\n")
    if expected is None:
        preflight.require_bpffs("/sys/fs/bpf/lbctl", mountinfo=(str(files[0]), str(files[1])))
        return
    with pytest.raises(HostError) as err:
        preflight.require_bpffs("/sys/fs/bpf/lbctl", mountinfo=(str(files[0]), str(files[1])))
    assert str(err.value).startswith(expected), str(err.value)
