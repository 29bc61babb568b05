"""`nexthop_mac = "auto"`: the next hop's MAC found in the kernel, shown by `lbctl status`, refused when absent.

Two namespaces joined by a veth: ``nht-<id>-lb`` holds lb0 (192.0.2.1/24), where the balancer
attaches; ``nht-<id>-rt`` holds rt0 (192.0.2.2/24), the router. The daemon's following of a changed
MAC is checked end to end in the default lab (suites/conformance/test_nexthop_follow.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from balancer import controller
from balancer.controller import Instance
from balancer.datapath import Datapath
from lab.harness import unique_name
from lab.nsexec import nsenter_argv

REPO = Path(__file__).resolve().parents[2]
OBJ = REPO / "build" / "bpf" / "balancer.o"
CONFIG = """
[datapath]
interfaces = ["lb0"]
ring_size = 251
max_vips = 8
max_reals = 16
lru_size = 256
fallback_size = 256

[encap]
{encap}

[[vips]]
address = "198.51.100.100"
port = 80
proto = "tcp"
reals = [{{ address = "203.0.113.18" }}]
"""

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.ismount("/sys/fs/bpf"),
                                reason="needs root and bpffs mounted at /sys/fs/bpf")


@dataclass
class Link:
    lb: str
    rt: str
    instance: str
    tmp: Path

    def ip(self, ns: str, *args: str) -> str:
        return subprocess.run(["ip", "-n", ns, *args], check=True, capture_output=True, text=True).stdout

    def lbctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(nsenter_argv(self.lb, [sys.executable, "-m", "balancer.cli", "--instance",
                                                     self.instance, *args]),
                              capture_output=True, text=True, cwd=REPO, timeout=60, check=False)

    def config(self, encap: str) -> Path:
        path = self.tmp / "lb.toml"
        path.write_text(CONFIG.format(encap=encap))
        return path

    def rt_mac(self) -> str:
        return str(json.loads(self.ip(self.rt, "-j", "link", "show", "rt0"))[0]["address"])

    def settings_mac(self) -> str:
        inst = Instance.open(self.instance)
        try:
            return ":".join(f"{b:02x}" for b in bytes(inst.dp.settings().nexthop_mac))
        finally:
            inst.close()


@pytest.fixture
def link(tmp_path: Path) -> Iterator[Link]:
    """Name: link. Scope: function. Depends: root, bpffs, the built balancer object.

    The LB and router namespaces joined by lb0/rt0, no default route yet; all removed afterwards::

        def test_x(link):
            link.ip(link.lb, "route", "add", "default", "via", "192.0.2.2")
    """
    if not OBJ.exists():
        pytest.fail(f"{OBJ} is missing: run `make bpf` first")
    name = unique_name("nht")
    w = Link(f"{name}-lb", f"{name}-rt", name, tmp_path)
    try:
        for ns in (w.lb, w.rt):
            subprocess.run(["ip", "netns", "add", ns], check=True)
        w.ip(w.lb, "link", "add", "lb0", "type", "veth", "peer", "name", "rt0", "netns", w.rt)
        for ns, dev, addr in ((w.lb, "lb0", "192.0.2.1/24"), (w.rt, "rt0", "192.0.2.2/24")):
            w.ip(ns, "addr", "add", addr, "dev", dev)
            w.ip(ns, "link", "set", dev, "up")
        yield w
    finally:
        w.lbctl("unload")
        Datapath.unpin(Instance.pin_dir(name))
        Instance.state_path(name).unlink(missing_ok=True)
        Path(controller.STATE_ROOT, f"{name}.lock").unlink(missing_ok=True)
        for ns in (w.lb, w.rt):
            subprocess.run(["ip", "netns", "del", ns], check=False)


def test_auto_finds_the_default_gateway_s_mac_and_status_says_where_from(link: Link) -> None:
    link.ip(link.lb, "route", "add", "default", "via", "192.0.2.2")
    assert "192.0.2.2" not in link.ip(link.lb, "neigh", "show", "dev", "lb0")  # never talked to: resolved on demand
    done = link.lbctl("load", "--config", str(link.config("")))
    assert done.returncode == 0, done.stderr
    mac = link.rt_mac()
    assert link.settings_mac() == mac
    status = link.lbctl("status")
    assert f"  next hop {mac} (neighbour 192.0.2.2 on lb0, the default route's gateway)\n" in status.stdout
    hop = json.loads(link.lbctl("status", "--json").stdout)["nexthop"]
    assert {k: hop[k] for k in ("mac", "source", "address", "interface")} == \
        {"mac": mac, "source": "default route", "address": "192.0.2.2", "interface": "lb0"}

    # The router's MAC replaced: the next apply writes the new one (the daemon does it by itself).
    link.ip(link.rt, "link", "set", "rt0", "address", "02:00:5e:10:00:22")
    link.ip(link.lb, "neigh", "replace", "192.0.2.2", "lladdr", "02:00:5e:10:00:22", "dev", "lb0")
    done = link.lbctl("apply", "--json", str(link.tmp / "lb.toml"))
    assert done.returncode == 0 and json.loads(done.stdout)["settings"] == 1, done.stdout + done.stderr
    assert link.settings_mac() == "02:00:5e:10:00:22"


def test_a_configured_nexthop_address_is_looked_up_on_its_link(link: Link) -> None:
    done = link.lbctl("load", "--config", str(link.config('nexthop = "192.0.2.2"')))
    assert done.returncode == 0, done.stderr
    assert link.settings_mac() == link.rt_mac()
    assert "(neighbour 192.0.2.2 on lb0, set by encap.nexthop)" in link.lbctl("status").stdout


@pytest.mark.parametrize(("encap", "error"), [
    ("", "lbctl: no next hop to resolve: no default route leaves through lb0; add one (`ip route add default via "
         'ROUTER dev IF`), set encap.nexthop = "<router address>" or encap.nexthop_mac = "<router MAC>"'),
    ('nexthop = "192.0.2.99"', "lbctl: no next-hop MAC: lb0 has no neighbour entry for 192.0.2.99 (encap.nexthop) "
                               "after 3 s of asking; check that 192.0.2.99 is up on that link (`ip neigh show dev "
                               'lb0`), or set encap.nexthop_mac = "<its MAC>"'),
    ('nexthop = "198.51.100.1"', "lbctl: encap.nexthop 198.51.100.1 is not on the link of lb0"),
], ids=["no-default-route", "no-neighbour", "off-link"])
def test_no_next_hop_is_refused_in_one_line_and_leaves_nothing(link: Link, encap: str, error: str) -> None:
    if "198.51.100.1" in encap:
        link.ip(link.lb, "route", "add", "198.51.100.0/24", "via", "192.0.2.2")
    done = link.lbctl("load", "--config", str(link.config(encap)))
    assert done.returncode == 1
    assert done.stderr.startswith(error) and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not Path(Instance.pin_dir(link.instance)).exists()
    assert not Instance.state_path(link.instance).exists()
    assert "xdp" not in link.ip(link.lb, "link", "show", "lb0")
