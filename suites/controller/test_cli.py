"""lbctl end to end in a private netns: load on a real veth, edit, status, stats, bad input, unload."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from balancer import controller
from lab.harness import unique_name
from lab.nsexec import nsenter_argv

REPO = Path(__file__).resolve().parents[2]
CONFIG = """
[datapath]
interfaces = ["lbc0"]
ring_size = 251
max_vips = 8
max_reals = 16
lru_size = 256
fallback_size = 256

[encap]
nexthop_mac = "02:00:00:00:00:01"

[[vips]]
address = "198.51.100.100"
port = 80
proto = "tcp"
reals = [{ address = "203.0.113.18" }, { address = "203.0.113.34", weight = 2 }]
"""


class Ctl:
    """lbctl run as a command inside a netns with its own instance name."""

    def __init__(self, ns: str, instance: str, tmp: Path) -> None:
        self.ns, self.instance, self.tmp = ns, instance, tmp

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "balancer.cli", "--instance", self.instance, *args]
        return subprocess.run(nsenter_argv(self.ns, argv), capture_output=True, text=True, cwd=REPO,
                              timeout=60, check=False)

    def state(self) -> str:
        return Path(controller.STATE_ROOT, f"{self.instance}.json").read_text()


@pytest.fixture
def ctl(tmp_path: Path) -> Iterator[Ctl]:
    """Name: ctl. Scope: function. Depends: root, built balancer object.

    A netns `lct-XXXXXX` with a veth pair (lbc0, lbc1, the peer with an XDP-free GRO-on end) and an
    lbctl wrapper bound to a unique instance; everything removed afterwards::

        def test_x(ctl):
            assert ctl("load", "-c", str(conf)).returncode == 0
    """
    if os.geteuid() != 0:
        pytest.skip("needs root: run as root")
    ns = unique_name("lct")
    subprocess.run(["ip", "netns", "add", ns], check=True)
    try:
        subprocess.run(["ip", "-n", ns, "link", "add", "lbc0", "type", "veth", "peer", "name", "lbc1"], check=True)
        for dev in ("lbc0", "lbc1"):
            subprocess.run(["ip", "-n", ns, "link", "set", dev, "up"], check=True)
        (tmp_path / "lb.toml").write_text(CONFIG)
        c = Ctl(ns, unique_name("t", 4, sep=""), tmp_path)
        yield c
        c("unload")
    finally:
        subprocess.run(["ip", "netns", "del", ns], check=False)
        name = locals().get("c")
        if isinstance(name, Ctl):
            shutil.rmtree(controller.Instance.pin_dir(name.instance), ignore_errors=True)
            Path(controller.STATE_ROOT, f"{name.instance}.json").unlink(missing_ok=True)
            Path(controller.STATE_ROOT, f"{name.instance}.lock").unlink(missing_ok=True)


def test_load_status_stats_unload(ctl: Ctl) -> None:
    done = ctl("load", "--config", str(ctl.tmp / "lb.toml"))
    assert done.returncode == 0, done.stderr
    assert "lbc0 (native)" in done.stdout
    status = json.loads(ctl("status", "--json").stdout)
    assert status["interfaces"] == {"lbc0": "native"}
    assert [r["address"] for r in status["vips"][0]["reals"]] == ["203.0.113.18", "203.0.113.34"]
    stats = json.loads(ctl("stats", "--json").stdout)
    assert set(stats["vips"]) == {"198.51.100.100:80/tcp"}
    assert "DROP_NO_REAL" in stats["reasons"]
    assert ctl("apply", str(ctl.tmp / "lb.toml")).stdout.strip().endswith("nothing to change")
    assert ctl("unload").returncode == 0
    assert not Path(controller.Instance.pin_dir(ctl.instance)).exists()
    again = ctl("status")
    assert again.returncode == 1 and "run `lbctl load --interface IF` first" in again.stderr


def test_edits_through_the_cli(ctl: Ctl) -> None:
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    assert ctl("vip", "add", "198.51.100.100", "9000", "udp", "--encap", "gue1").returncode == 0
    assert ctl("real", "add", "198.51.100.100", "9000", "udp", "203.0.113.50", "--weight", "3").returncode == 0
    assert ctl("real", "set-weight", "198.51.100.100", "80", "tcp", "203.0.113.18", "--weight", "0").returncode == 0
    vips = {v["vip"]: v for v in json.loads(ctl("status", "--json").stdout)["vips"]}
    assert vips["198.51.100.100:9000/udp"]["encap"] == "gue1"
    assert vips["198.51.100.100:9000/udp"]["reals"][0]["weight"] == 3
    assert vips["198.51.100.100:80/tcp"]["reals"][0]["weight"] == 0
    assert ctl("real", "del", "198.51.100.100", "9000", "udp", "203.0.113.50").returncode == 0
    assert ctl("vip", "del", "198.51.100.100", "9000", "udp").returncode == 0
    listed = ctl("vip", "list").stdout
    assert "9000" not in listed and "198.51.100.100:80/tcp" in listed


BAD = [
    (("vip", "del", "198.51.100.7", "80", "tcp"), 2, "unknown VIP 198.51.100.7:80/tcp"),
    (("real", "add", "198.51.100.100", "80", "tcp", "203.0.113.18"), 2, "already behind"),
    (("real", "set-weight", "198.51.100.100", "80", "tcp", "203.0.113.18", "--weight", "70000"), 2,
     "weight must be 0..65535 but got 70000"),
    (("vip", "add", "198.51.100.101", "65536", "tcp"), 2, "port must be 0..65535 but got 65536"),
    (("real", "add", "198.51.100.100", "80", "tcp", "203.0.113.999"), 2, "does not appear to be an IPv4"),
    (("vip", "add", "198.51.100.300", "80", "tcp"), 2, "does not appear to be an IPv4 or IPv6 address"),
    (("vip", "add", "198.51.100.100", "80", "tcp"), 2, "VIP 198.51.100.100:80/tcp exists already"),
]


@pytest.mark.parametrize(("args", "code", "message"), BAD,
                         ids=[" ".join(b[0][:2]) + f"-{i}" for i, b in enumerate(BAD)])
def test_bad_input_is_one_line_and_changes_nothing(ctl: Ctl, args: tuple[str, ...], code: int,
                                                   message: str) -> None:
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    before = ctl.state()
    done = ctl(*args)
    assert done.returncode == code, done.stderr
    assert message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert ctl.state() == before


def test_ipv6_vip_refuses_an_ipv4_real(ctl: Ctl) -> None:
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    assert ctl("vip", "add", "2001:db8:100::100", "80", "tcp").returncode == 0
    before = ctl.state()
    done = ctl("real", "add", "2001:db8:100::100", "80", "tcp", "203.0.113.18")
    assert done.returncode == 2
    assert "an IPv6 VIP cannot be encapsulated to IPv4 real 203.0.113.18; use an IPv6 real" in done.stderr
    assert ctl.state() == before


def test_missing_interface_and_bad_config_fail_cleanly(ctl: Ctl) -> None:
    done = ctl("load", "--interface", "nope0")
    assert done.returncode == 1 and "cannot find interface 'nope0'" in done.stderr
    assert not Path(controller.Instance.pin_dir(ctl.instance)).exists()
    bad = ctl.tmp / "bad.toml"
    bad.write_text(CONFIG.replace('port = 80', 'port = 0\nproto2 = 1'))
    done = ctl("load", "--config", str(bad))
    assert done.returncode == 2 and done.stderr.startswith(f"lbctl: {bad}: vips[0]")
    assert not Path(controller.Instance.pin_dir(ctl.instance)).exists()


def test_native_mode_fails_instead_of_falling_back(ctl: Ctl) -> None:
    """A device without native XDP (here: lo) must fail in native mode, not run in generic mode."""
    done = ctl("load", "--interface", "lo", "--mode", "native")
    assert done.returncode == 1, done.stdout
    assert "cannot attach XDP program 'balancer_xdp' to 'lo' in native mode" in done.stderr
    assert "try --mode generic" in done.stderr
    generic = ctl("load", "--interface", "lo", "--mode", "generic")
    assert generic.returncode == 0, generic.stderr
    assert "WARNING: XDP runs in generic (skb) mode on 'lo'" in generic.stderr


def test_object_with_another_contract_is_refused(ctl: Ctl, tmp_path: Path) -> None:
    obj = tmp_path / "balancer.o"
    data = bytearray((REPO / "build" / "bpf" / "balancer.o").read_bytes())
    assert b"lb_vip_meta" in data
    obj.write_bytes(bytes(data).replace(b"lb_vip_meta", b"lb_vip_mota"))  # same layout, another contract
    done = ctl("load", "--interface", "lbc0", "--object", str(obj))
    assert done.returncode == 1
    assert "differs from balancer/_abi.py" in done.stderr and "run `make abi`" in done.stderr


def _bpftool(*args: str) -> Any:
    return json.loads(subprocess.run(["bpftool", "-j", *args], capture_output=True, text=True, check=True).stdout)


def test_upgrade_replaces_the_program_and_keeps_the_maps(ctl: Ctl) -> None:
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    pins = Path(controller.Instance.pin_dir(ctl.instance))
    old_prog = _bpftool("link", "show", "pinned", str(pins / "link_lbc0"))["prog_id"]
    map_ids = {name: _bpftool("map", "show", "pinned", str(pins / name))["id"]
               for name in ("lb_vips", "lb_ring", "lb_sessions", "lb_counts")}
    done = ctl("upgrade")
    assert done.returncode == 0, done.stderr
    new_prog = _bpftool("link", "show", "pinned", str(pins / "link_lbc0"))["prog_id"]
    assert new_prog != old_prog
    used = set(_bpftool("prog", "show", "id", str(new_prog))["map_ids"])
    assert set(map_ids.values()) <= used, "the new program must run on the pinned maps"
    assert {n: _bpftool("map", "show", "pinned", str(pins / n))["id"] for n in map_ids} == map_ids
    status = json.loads(ctl("status", "--json").stdout)
    assert status["interfaces"] == {"lbc0": "native"} and len(status["vips"]) == 1


def test_stats_watch_prints_rates(ctl: Ctl) -> None:
    assert ctl("load", "--config", str(ctl.tmp / "lb.toml")).returncode == 0
    done = ctl("stats", "--watch", "0.2", "--count", "2")
    assert done.returncode == 0, done.stderr
    tables = [t for t in done.stdout.split("\n\n\n") if t.strip()]
    assert done.stdout.count("pkt/s") == 2, done.stdout  # one table with a rate column per interval
    assert "events:" in tables[-1]
