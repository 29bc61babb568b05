"""A lab in a hostile environment: lbctl and l4lab refuse in one line, the lab keeps forwarding,
`l4lab down` removes everything the lab made whatever happened since `up`, and `up` works again.

The first test is issue 15's story: `ip netns exec LAB-lb lbctl --instance LAB-lb run --config
<the running config>` once loaded a second datapath over the running one, crashed, and left pins
that made the next `up` fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from balancer import controller
from balancer.libbpf import map_from_pin
from lab.harness import poll
from lab.state import pin_dir, state_dir
from suites.lab.probes import bpf_available, leftovers

REPO = Path(__file__).resolve().parents[2]
LBCTL = [sys.executable, "-m", "balancer.cli"]
pytestmark = pytest.mark.skipif(bpf_available() is not None, reason=f"{bpf_available()}")

HIDE_BPFFS = ["unshare", "-m", "--propagation", "private", "sh", "-c",
              'mount -t tmpfs tmpfs /sys/fs/bpf && exec "$@"', "sh"]
NO_CAPS = ["setpriv", "--inh-caps=-all", "--bounding-set=-bpf,-perfmon,-sys_admin,-net_admin"]


def run(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=timeout, check=False,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))


def l4lab(*args: str, wrap: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return run([*wrap, sys.executable, "-m", "lab.cli", *args])


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


def curl_vip(lab: str) -> str:
    done = l4lab("exec", "client", "--name", lab, "--", "curl", "-s", "-m", "3", "http://198.51.100.100/")
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def datapath(lab: str) -> dict[str, object]:
    """What a second load or a wrong unload would change: every pin's map or link id, the link's
    program, the VIP, real and settings entries, digests of every ring slot and of the VIP index, and
    the state file. (Counters and sessions move with the test's own traffic.)"""
    pins = Path(controller.Instance.pin_dir(f"{lab}-lb"))
    cmds = [f"{'link' if p.name.startswith('link_') else 'map'} show pinned {p}" for p in sorted(pins.iterdir())]
    cmds += [f"map dump pinned {pins / n}" for n in ("lb_vips", "lb_reals", "lb_settings")]
    done = subprocess.run(["bpftool", "-j", "batch", "file", "-"], input="\n".join(cmds) + "\n",
                          capture_output=True, text=True, check=True)
    out: dict[str, object] = {" ".join(r["command"]): r["output"] for r in json.loads(done.stdout)}
    ring = map_from_pin(str(pins / "lb_ring"))
    try:
        out["ring"] = hashlib.sha256(bytes(ring.mmap_u32())).hexdigest()
    finally:
        ring.close()
    index = map_from_pin(str(pins / "lb_vip_index"))
    try:
        out["vip index"] = hashlib.sha256(index.mmap_words().tobytes()).hexdigest()
    finally:
        index.close()
    out["state"] = controller.Instance.state_path(f"{lab}-lb").read_text()
    return out


def test_lbctl_under_ip_netns_exec_is_refused_and_down_then_up_work(lab_name: str) -> None:
    up = l4lab("up", "default", "--name", lab_name)
    assert up.returncode == 0, up.stderr
    assert curl_vip(lab_name) in {"real1", "real2", "real3"}
    before = datapath(lab_name)
    running = state_dir(lab_name) / "lb-lb.toml"
    instance = f"{lab_name}-lb"

    daemon = run(["ip", "netns", "exec", instance, *LBCTL, "--instance", instance, "run", "--config",
                  str(running)], timeout=60)
    assert daemon.returncode == 1, daemon.stderr
    rec = json.loads(one_line(daemon))
    assert rec["event"] == "start_failed"
    assert rec["error"].startswith("bpffs is hidden: /sys/fs/bpf/lbctl lies on sysfs (/sys)"), rec
    for verb in (("load", "--config", str(running)), ("apply", str(running)), ("unload",), ("status",)):
        done = run(["ip", "netns", "exec", instance, *LBCTL, "--instance", instance, *verb])
        assert done.returncode == 1, (verb, done.stderr)
        assert one_line(done).startswith("lbctl: bpffs is hidden"), verb
    assert datapath(lab_name) == before
    assert curl_vip(lab_name) in {"real1", "real2", "real3"}

    down = l4lab("down", "--name", lab_name)
    assert down.returncode == 0, down.stderr
    assert f"balancer instance {instance} (pins {controller.Instance.pin_dir(instance)})" in down.stdout
    assert leftovers(lab_name) == []
    again = l4lab("up", "default", "--name", lab_name)
    assert again.returncode == 0, again.stderr
    assert curl_vip(lab_name) in {"real1", "real2", "real3"}
    assert l4lab("down", "--name", lab_name).returncode == 0
    assert leftovers(lab_name) == []


def test_down_cleans_a_half_dead_lab_and_names_a_daemon_it_did_not_start(lab_name: str) -> None:
    """The balancer's state file removed (what the old `lbctl run` did), a service killed, a veth
    deleted by hand, and an operator's `lbctl run` owning the instance: `down` removes what the
    lab made, says what, and leaves the daemon (which it did not start) to its owner."""
    assert l4lab("up", "default", "--name", lab_name).returncode == 0
    instance = f"{lab_name}-lb"
    log = state_dir(lab_name).parent / f"{lab_name}-daemon.log"
    with open(log, "w") as out:
        daemon = subprocess.Popen(["nsenter", f"--net=/run/netns/{instance}", *LBCTL, "--instance", instance,
                                   "run", "--config", str(state_dir(lab_name) / "lb-lb.toml")],
                                  cwd=REPO, stderr=out, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        def running() -> bool:
            if '"event":"running"' in log.read_text():
                return True
            assert daemon.poll() is None, log.read_text()
            return False

        poll(30.0, running, f"the daemon's running event in {log}")
        controller.Instance.state_path(instance).unlink()
        services = json.loads((state_dir(lab_name) / "state.json").read_text())["processes"]
        os.kill(services[0]["pid"], signal.SIGKILL)
        assert run(["ip", "-n", f"{lab_name}-router", "link", "del", "rt-r3"]).returncode == 0
        (pin_dir(lab_name) / "router" / "stray").mkdir()  # something pinned into the lab's directory

        down = l4lab("down", "--name", lab_name)
        assert down.returncode == 0, down.stderr
        assert f"balancer instance {instance} (pins " in down.stdout
        assert f"lbctl run (pid {daemon.pid}) still holds its program attached until it exits" in down.stdout
        assert "removed 1 balancer instance, 2 processes, " in down.stdout  # one service was dead already
        assert leftovers(lab_name) == []
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=20)
        log.unlink(missing_ok=True)
    assert l4lab("up", "default", "--name", lab_name).returncode == 0
    assert curl_vip(lab_name) in {"real1", "real2", "real3"}


FAULTS = {
    "bpffs-hidden": (HIDE_BPFFS, "bpffs is hidden: /sys/fs/bpf lies on tmpfs (/sys/fs/bpf)"),
    "no-caps": (NO_CAPS, "lacks CAP_SYS_ADMIN, CAP_NET_ADMIN"),
}


def test_l4lab_verbs_under_a_host_fault_change_nothing(lab_name: str) -> None:
    """Under each fault (its verbs run at once), `up` of a new lab and `down` of a running one are
    refused in one line before any change, `status` reads (bpffs hidden) or refuses in one line (no
    capabilities), no verb shows a traceback; the running lab's datapath is unchanged and it keeps
    forwarding."""
    assert l4lab("up", "default", "--name", lab_name).returncode == 0
    before = datapath(lab_name)
    other = lab_name + "x"
    l4 = [sys.executable, "-m", "lab.cli"]
    verbs = {
        "up": [*l4, "up", "default", "--name", other],
        "down": [*l4, "down", "--name", lab_name],
        "status": [*l4, "status", "--name", lab_name],
        "exec": [*l4, "exec", "client", "--name", lab_name, "--", "true"],
        "shell": ["env", "SHELL=/bin/true", *l4, "shell", "client", "--name", lab_name],
        "vagrant-plan": [*l4, "vagrant-plan", "default"],
        "report": [*l4, "report", "--results", str(state_dir(lab_name).parent / "no-such-results")],
    }
    exits = {"up": {1}, "down": {1}, "exec": {0, 1}, "shell": {0, 1}, "vagrant-plan": {0}, "report": {2}}
    for fault, (wrap, message) in FAULTS.items():
        env = dict(os.environ, PYTHONPATH=str(REPO))
        procs = {v: subprocess.Popen([*wrap, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     cwd=REPO, env=env) for v, argv in verbs.items()}
        done = {}
        for v, proc in procs.items():
            out, err = proc.communicate(timeout=120)
            done[v] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        try:
            for v, ok in exits.items():
                assert done[v].returncode in ok and "Traceback" not in done[v].stderr, (fault, v, done[v].stderr)
                if done[v].returncode:
                    one_line(done[v])
            assert message in one_line(done["up"]), fault
            assert leftovers(other) == [], fault
        finally:
            if state_dir(other).exists():
                l4lab("down", "--name", other)
        assert one_line(done["down"]).startswith(f"l4lab: cannot take lab '{lab_name}' down from here: "), fault
        assert message in one_line(done["down"]), fault
        if fault == "no-caps":
            assert done["status"].returncode == 1
            assert one_line(done["status"]).endswith("run l4lab as root (it needs CAP_SYS_ADMIN and CAP_NET_ADMIN)")
        else:
            assert done["status"].returncode == 0, done["status"].stderr
        assert datapath(lab_name) == before, fault
        assert curl_vip(lab_name) in {"real1", "real2", "real3"}, fault


def test_up_over_leftover_pins_says_how_to_remove_them(lab_name: str) -> None:
    """Pins of `<lab>-lb` without a lab (what a crash used to leave): `up` refuses in one line naming
    them and the command that removes them, leaves nothing, and works once that command ran."""
    from balancer import config as cfg
    from balancer.controller import Instance

    instance = f"{lab_name}-lb"
    small = cfg.parse({"datapath": {"ring_size": 251, "max_vips": 2, "lru_size": 64, "fallback_size": 64}})
    Instance.load(instance, [], config=small).close()
    Instance.state_path(instance).unlink()
    try:
        up = l4lab("up", "default", "--name", lab_name)
        assert up.returncode == 1
        assert f"balancer instance {instance} exists already ({Instance.pin_dir(instance)})" in one_line(up)
        assert [x for x in leftovers(lab_name) if not x.startswith("balancer pins")] == []
        unload = run([*LBCTL, "--instance", instance, "unload"])
        assert unload.returncode == 0, unload.stderr
    finally:
        from balancer.datapath import Datapath

        Datapath.unpin(Instance.pin_dir(instance))
    assert l4lab("up", "default", "--name", lab_name).returncode == 0
    assert curl_vip(lab_name) in {"real1", "real2", "real3"}
