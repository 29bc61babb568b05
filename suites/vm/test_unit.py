"""The lbctl unit under a real systemd: a qemu VM (Debian 12 booting systemd) is the default lab's LB.

The lab (`uvm-<hex>`, default topology, no balancer of its own) keeps its client, router and reals
(BPF decap, HTTP answering with the real's name); the VM's NIC is a tap in the router's namespace
(198.51.100.40/29) and the router sends the VIP to the VM instead of the lab's LB node. In the VM,
as a user would on a host without internet: a venv, `pip install` of this checkout's wheel and its
dependencies from a disk (lab/remote/unitvm.py), `packaging/install.sh`, the config in
/etc/l4lab/lb.toml (no nexthop_mac: the router's MAC is found by itself), then systemctl: start
(READY=1), the VIP answers, reload (a changed file, and the object it names swapped in), `lbctl
upgrade` handed to the unit's daemon, watchdog pings, stop (forwarding stays), start (adopts).
"""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from balancer import config as cfg
from lab import netns, topology
from lab.errors import LabError
from lab.harness import poll, unique_name
from lab.harness.vmlab import vm_skip_reason
from lab.lbconf import real_addresses
from lab.nsexec import nsenter_argv
from lab.remote.unitvm import MOUNT, UnitVm, data_disk, root_image
from lab.state import netns_name

VIP = "198.51.100.100"
ROUTER, VM_ADDR, PREFIX = "198.51.100.41", "198.51.100.42", 29
CURL = ["curl", "-s", "-m", "5", f"http://{VIP}/"]


def skip_reason() -> str | None:
    missing = [t for t in ("mmdebstrap", "mkfs.ext4") if shutil.which(t) is None]
    if missing:
        return f"the unit VM needs {', '.join(missing)}: run `bash scripts/setup.sh --extra vagrant`"
    return vm_skip_reason()


pytestmark = [pytest.mark.slow, pytest.mark.skipif(skip_reason() is not None, reason=str(skip_reason()))]


NEXT = "/etc/l4lab/balancer-next.o"  # a copy of the packaged object: another path, so a reload upgrades to it


def _config(topo: topology.Topology, reals: list[str], obj: str = "") -> str:
    addrs = real_addresses(topo, 4)
    vip = cfg.Vip(address=ipaddress.IPv4Address(VIP), port=80, proto="tcp", encap="ipip",
                  reals=tuple(cfg.Real(address=ipaddress.IPv4Address(addrs[r])) for r in reals))
    conf = cfg.Config(datapath=cfg.DatapathConfig(interfaces=("eth0",), mode="native", lru_size=4096,
                                                  ring_size=4099, max_vips=16, max_reals=64, object=obj),
                      encap=cfg.EncapConfig(src4=next(p for p in topo.lb_source_prefixes if p.version == 4)),
                      vips=(vip,))
    assert conf.encap.nexthop_mac == "auto"
    return cfg.dump(conf)


def _show(vm: UnitVm, *props: str) -> dict[str, str]:
    out = vm.sh("systemctl show lbctl " + " ".join(f"-p {p}" for p in props))
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def _events(vm: UnitVm, since: str = "") -> list[dict[str, object]]:
    """lbctl's JSON log lines in the journal (since a `journalctl --since` time)."""
    out = vm.sh("journalctl -u lbctl -o cat --no-pager" + (f" --since '{since}'" if since else ""))
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.timeout(1200)  # about five minutes under TCG on two shared CPUs: boot, pip install, units
def test_unit_under_systemd(tmp_path: Path) -> None:
    start = time.monotonic()
    topo = topology.load("default")
    name = unique_name("uvm")
    with ExitStack() as stack:
        netns.build(topo, name, balancers=False)
        stack.callback(netns.teardown, name)
        data = data_disk(tmp_path / "data", {"lb.toml": _config(topo, ["real1"]),
                                             "lb-changed.toml": _config(topo, ["real1", "real2"], NEXT)})
        vm = UnitVm("unit", netns_name(name, "router"), VM_ADDR, PREFIX, ROUTER, image=root_image(), data=data)
        vm.start()
        stack.callback(vm.stop)
        stack.push(lambda kind, _v, _tb: kind is not None and issubclass(kind, Exception) and _evidence(vm))
        print(f"\nunit VM: systemd booted to the control channel in {vm.boot_seconds:.1f} s "
              f"(guest uptime {vm.guest_uptime:.1f} s)")

        def client(check: bool = True) -> str:
            done = subprocess.run(nsenter_argv(netns_name(name, "client"), CURL), capture_output=True, text=True,
                                  timeout=30, check=False)
            assert not check or done.returncode == 0, f"curl exited {done.returncode}: {done.stderr}"
            return done.stdout.strip()

        _install(vm)
        status = _start(vm, name)
        first_ping = _last_ping(vm)
        _router(name, ["ip", "route", "replace", f"{VIP}/32", "via", VM_ADDR])
        assert client() == "real1"

        _reload(vm, client, status["object"])
        _upgrade_through_the_daemon(vm, client)
        _watchdog(vm, first_ping)
        _stop_and_adopt(vm, client)

        security = vm.sh("systemd-analyze security --no-pager lbctl", check=False)
        print("systemd-analyze security lbctl: " + next(
            (line.strip() for line in security.splitlines() if "Overall exposure level" in line), security[-300:]))
        vm.sh("systemctl stop lbctl && /opt/l4lab/bin/lbctl unload", timeout=120)
    print(f"test_unit_under_systemd: {time.monotonic() - start:.0f} s in all")


def _install(vm: UnitVm) -> None:
    """The checkout's wheel and its dependencies into a venv, the unit by packaging/install.sh, the VM's address."""
    t = time.monotonic()
    vm.sh(f"python3 -m venv --without-pip /opt/l4lab && /opt/l4lab/bin/python {MOUNT}/pip.whl/pip install -q "
          f"--no-index --no-compile --find-links {MOUNT}/wheels l4lab", timeout=900)
    installed = time.monotonic() - t
    print(f"pip install of the checkout's wheel and its dependencies in the VM: {installed:.1f} s")
    vm.sh(f"bash {MOUNT}/packaging/install.sh --lbctl /opt/l4lab/bin/lbctl && "
          f"cp {MOUNT}/lb.toml /etc/l4lab/lb.toml")
    vm.sh(f"ip addr add {VM_ADDR}/{PREFIX} dev eth0 && ip link set eth0 up && ip route add default via {ROUTER}")


def _start(vm: UnitVm, name: str) -> dict[str, Any]:
    """Type=notify: `systemctl start` returns once READY=1 came (the config applied)."""
    t = time.monotonic()
    vm.sh("systemctl start lbctl", timeout=300)
    print(f"systemctl start lbctl returned (READY=1) after {time.monotonic() - t:.1f} s")
    state = _show(vm, "ActiveState", "SubState", "StatusText", "Type", "WatchdogUSec")
    assert state["ActiveState"] == "active" and state["SubState"] == "running", state
    assert state["StatusText"].startswith("forwarding 1 VIPs; metrics at 127.0.0.1:9100"), state
    assert state["Type"] == "notify" and state["WatchdogUSec"] == "30s", state
    status = json.loads(vm.sh("/opt/l4lab/bin/lbctl status --json"))
    assert status["object"].startswith("/opt/l4lab/lib/") and status["object"].endswith("/_build/bpf/balancer.o")
    router_mac = json.loads(_router(name, ["ip", "-j", "link", "show", vm.tap]))[0]["address"]
    assert (status["nexthop"]["mac"], status["nexthop"]["source"], status["nexthop"]["address"]) == \
        (router_mac, "default route", ROUTER), status["nexthop"]
    print(f"XDP on the VM's eth0: {status['interfaces']['eth0']}; next hop {status['nexthop']['describe']}")
    return status


def _reload(vm: UnitVm, client: Callable[[], str], running: str) -> None:
    """The changed file is applied (a second real joins the ring) and the object it names replaces the
    program behind the link."""
    prog = _prog(vm)
    vm.sh(f"cp {running} {NEXT}")
    t = time.monotonic()
    vm.sh("cp /mnt/l4lab/lb-changed.toml /etc/l4lab/lb.toml && systemctl reload lbctl")
    poll(90.0, lambda: json.loads(vm.sh("/opt/l4lab/bin/lbctl status --json"))["object"] == NEXT,
         "the reload's upgrade to the object the config names")
    assert len(json.loads(vm.sh("/opt/l4lab/bin/lbctl status --json"))["vips"][0]["reals"]) == 2
    print(f"systemctl reload lbctl: the changed config applied and {NEXT} running within "
          f"{time.monotonic() - t:.1f} s")
    events = _events(vm)
    assert any(e.get("event") == "applied" and e.get("trigger") == "reload" for e in events)
    assert [(e["trigger"], e["object"]) for e in events if e.get("event") == "upgraded"] == [("reload", NEXT)]
    assert _prog(vm) != prog
    answered = {client() for _ in range(12)}
    assert answered <= {"real1", "real2"} and answered, answered


def _upgrade_through_the_daemon(vm: UnitVm, client: Callable[[], str]) -> None:
    """`lbctl upgrade` while the unit runs: handed to the daemon on its control socket, in its sandbox."""
    prog, t = _prog(vm), time.monotonic()
    done = vm.sh(f"/opt/l4lab/bin/lbctl upgrade --object {NEXT}", timeout=300)
    assert done.startswith(f"replaced the program behind 1 link(s) with {NEXT}"), done
    assert _prog(vm) != prog and client() in {"real1", "real2"}
    print(f"lbctl upgrade through the unit's daemon: XDP program {prog} -> {_prog(vm)} in "
          f"{time.monotonic() - t:.1f} s")


def _last_ping(vm: UnitVm) -> int:
    """CLOCK_MONOTONIC microseconds of the last WATCHDOG=1 systemd recorded for the unit."""
    return int(_show(vm, "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"])


def _watchdog(vm: UnitVm, first: int) -> None:
    """systemd recorded a WATCHDOG=1 after the one seen at start (WatchdogSec=30s: one at least every 15 s),
    and never had to restart the unit (a ping over 30 s late would have killed it: Restart=on-failure).
    The reload and the upgrade between them take longer than 15 s, so the poll rarely waits."""
    later = poll(40.0, lambda: (now if (now := _last_ping(vm)) != first else None), "a later watchdog ping",
                 interval_s=1.0)
    assert later is not None and later > first
    state = _show(vm, "NRestarts", "ActiveState")
    assert state == {"NRestarts": "0", "ActiveState": "active"}, state
    print(f"watchdog: systemd recorded a ping {(later - first) / 1e6:.1f} s after the one at start (WatchdogSec=30s)")


def _stop_and_adopt(vm: UnitVm, client: Callable[[], str]) -> None:
    """Stopped, the pinned datapath keeps forwarding; the next start adopts it."""
    vm.sh("systemctl stop lbctl", timeout=120)
    assert _show(vm, "ActiveState")["ActiveState"] == "inactive"
    prog = _prog(vm)
    assert prog, f"no XDP program on eth0 after the stop: {vm.sh('ip -d link show eth0')}"
    print(f"systemctl stop lbctl: XDP program {prog} still on eth0, the VIP answered by {client()}")
    since = vm.sh("date '+%Y-%m-%d %H:%M:%S'").strip()
    vm.sh("systemctl start lbctl", timeout=300)
    events = [e.get("event") for e in _events(vm, since)]
    assert "adopted" in events and "loaded" not in events and "upgraded" not in events, events
    assert _prog(vm) == prog
    print(f"systemctl start lbctl again: adopted XDP program {prog}; the VIP answered by {client()}")


def _evidence(vm: UnitVm) -> None:
    """On a failure: the unit's state and journal, as the VM has them."""
    for command in ("systemctl status --no-pager lbctl", "journalctl -u lbctl -o cat --no-pager -n 60"):
        try:
            print(f"--- {command}\n{vm.sh(command, timeout=30, check=False)[-6000:]}")
        except LabError as exc:  # the channel is busy or gone: the failure itself is what matters
            print(f"--- {command}: no answer ({exc})")


def _prog(vm: UnitVm) -> int:
    """The id of the XDP program on the VM's eth0 (0: none)."""
    link = json.loads(vm.sh("ip -j link show eth0"))[0]
    return int(link.get("xdp", {}).get("prog", {}).get("id", 0))


def _router(lab: str, argv: list[str]) -> str:
    done = subprocess.run(nsenter_argv(netns_name(lab, "router"), argv), capture_output=True, text=True,
                          timeout=30, check=True)
    return done.stdout

