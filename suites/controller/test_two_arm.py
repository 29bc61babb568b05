"""lbctl two-arm (`datapath.egress`): load on one veth with another as egress, status, upgrade, bad input.

The netns of test_cli.py's `ctl` gets a second veth pair (lbe0, whose peer lbe1 has GRO on, as a
redirect target's peer must); lbe0 is the egress. What the program then does with a frame is
suites/datapath/test_two_arm.py's subject (test runs) and suites/conformance/test_two_arm.py's (a lab).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from balancer import _abi, controller
from balancer import config as cfg
from balancer.errors import ConfigError

from .test_cli import CONFIG, Ctl, _bpftool, _ctl_world

TWO_ARM = CONFIG.replace('interfaces = ["lbc0"]', 'interfaces = ["lbc0"]\negress = "lbe0"')


@pytest.fixture
def two_arm(tmp_path: Path) -> Iterator[Ctl]:
    """Name: two_arm. Scope: function. Depends: root, built balancer object.

    test_cli's ctl world plus the veth pair lbe0 (the egress) / lbe1, and two-arm.toml beside lb.toml::

        def test_x(two_arm):
            two_arm("load", "--config", str(two_arm.tmp / "two-arm.toml"))
    """
    with _ctl_world(tmp_path) as c:
        subprocess.run(["ip", "-n", c.ns, "link", "add", "lbe0", "type", "veth", "peer", "name", "lbe1"], check=True)
        for dev in ("lbe0", "lbe1"):
            subprocess.run(["ip", "-n", c.ns, "link", "set", dev, "up"], check=True)
        subprocess.run(["ip", "netns", "exec", c.ns, "ethtool", "-K", "lbe1", "gro", "on"], check=True)
        (c.tmp / "two-arm.toml").write_text(TWO_ARM)
        yield c


def _link(ns: str, ifname: str) -> dict[str, Any]:
    out = subprocess.run(["ip", "-n", ns, "-j", "link", "show", ifname], capture_output=True, text=True, check=True)
    link: dict[str, Any] = json.loads(out.stdout)[0]
    return link


def _rodata_of(prog_id: int) -> bytes:
    """The .rodata image of a loaded program (its map named *.rodata)."""
    for map_id in _bpftool("prog", "show", "id", str(prog_id))["map_ids"]:
        if _bpftool("map", "show", "id", str(map_id))["name"].endswith(".rodata"):
            dump = _bpftool("map", "dump", "id", str(map_id))
            return bytes(int(b, 16) for b in dump[0]["value"])
    raise AssertionError(f"program {prog_id} has no .rodata map")


def _egress_in(rodata: bytes) -> tuple[int, bytes]:
    off, size = _abi.RODATA["balancer"]["cfg_egress_ifindex"]
    moff, msize = _abi.RODATA["balancer"]["cfg_egress_mac"]
    return int.from_bytes(rodata[off:off + size], "little"), rodata[moff:moff + 6]


def test_status_shows_both_arms_and_the_program_knows_the_egress(two_arm: Ctl) -> None:
    done = two_arm("load", "--config", str(two_arm.tmp / "two-arm.toml"))
    assert done.returncode == 0, done.stderr
    lbe0 = _link(two_arm.ns, "lbe0")
    status = json.loads(two_arm("status", "--json").stdout)
    assert status["interfaces"] == {"lbc0": "native"}
    assert status["egress"] == {"ifname": "lbe0", "ifindex": lbe0["ifindex"], "mac": lbe0["address"],
                                "now": "lbe0", "mtu": lbe0["mtu"]}
    text = two_arm("status").stdout
    assert "interface lbc0: XDP native" in text
    assert f"egress lbe0: encapsulated frames leave by XDP_REDIRECT (ifindex {lbe0['ifindex']}" in text
    pins = Path(controller.Instance.pin_dir(two_arm.instance))
    prog = _bpftool("link", "show", "pinned", str(pins / "link_lbc0"))["prog_id"]
    assert _egress_in(_rodata_of(prog)) == (lbe0["ifindex"], bytes.fromhex(lbe0["address"].replace(":", "")))
    for devmap in ("lb_egress", "lb_egress_frags"):
        entry = _bpftool("map", "dump", "pinned", str(pins / devmap))
        assert [int.from_bytes(bytes(int(b, 16) for b in e["value"]), "little") for e in entry] == [lbe0["ifindex"]]


def test_one_arm_status_has_no_egress(two_arm: Ctl) -> None:
    assert two_arm("load", "--config", str(two_arm.tmp / "lb.toml")).returncode == 0
    assert json.loads(two_arm("status", "--json").stdout)["egress"] is None
    assert "egress" not in two_arm("status").stdout
    pins = Path(controller.Instance.pin_dir(two_arm.instance))
    prog = _bpftool("link", "show", "pinned", str(pins / "link_lbc0"))["prog_id"]
    assert _egress_in(_rodata_of(prog))[0] == 0


def test_the_egress_is_fixed_at_load(two_arm: Ctl) -> None:
    assert two_arm("load", "--config", str(two_arm.tmp / "two-arm.toml")).returncode == 0
    before = two_arm.state()
    done = two_arm("apply", str(two_arm.tmp / "lb.toml"))
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"lbctl: datapath.egress is absent (one-arm) but instance '{two_arm.instance}' was loaded with egress "
        "'lbe0'; the egress is fixed at load: `lbctl unload`, then `lbctl load` with the new config")
    assert two_arm.state() == before


def test_upgrade_keeps_the_egress(two_arm: Ctl) -> None:
    assert two_arm("load", "--config", str(two_arm.tmp / "two-arm.toml")).returncode == 0
    done = two_arm("upgrade")
    assert done.returncode == 0, done.stderr
    pins = Path(controller.Instance.pin_dir(two_arm.instance))
    prog = _bpftool("link", "show", "pinned", str(pins / "link_lbc0"))["prog_id"]
    lbe0 = _link(two_arm.ns, "lbe0")
    assert _egress_in(_rodata_of(prog))[0] == lbe0["ifindex"], "the new program redirects to the same egress"
    assert json.loads(two_arm("status", "--json").stdout)["egress"]["ifname"] == "lbe0"


def test_a_missing_egress_fails_in_one_line_and_leaves_nothing(two_arm: Ctl) -> None:
    (two_arm.tmp / "gone.toml").write_text(TWO_ARM.replace('egress = "lbe0"', 'egress = "nope0"'))
    done = two_arm("load", "--config", str(two_arm.tmp / "gone.toml"))
    assert done.returncode == 1
    assert done.stderr.strip() == ("lbctl: cannot find the egress interface 'nope0' (datapath.egress): "
                                   "No such device; check the name with `ip link` in the LB's namespace")
    assert not Path(controller.Instance.pin_dir(two_arm.instance)).exists()
    assert not controller.Instance.state_path(two_arm.instance).exists()


def test_a_too_big_limit_above_the_egress_mtu_is_refused(two_arm: Ctl) -> None:
    subprocess.run(["ip", "-n", two_arm.ns, "link", "set", "lbe0", "mtu", "1400"], check=True)
    expected = ("cannot use datapath.mtu = 1500 with egress 'lbe0': Invalid argument; its MTU is 1400: frames "
                "above it would be dropped there, unanswered; set datapath.mtu = 1400 (or less)")
    done = two_arm("load", "--config", str(two_arm.tmp / "two-arm.toml"))
    assert (done.returncode, done.stderr.strip()) == (1, f"lbctl: {expected}")
    assert not controller.Instance.state_path(two_arm.instance).exists()
    (two_arm.tmp / "1400.toml").write_text(TWO_ARM.replace("[datapath]", "[datapath]\nmtu = 1400"))
    assert two_arm("load", "--config", str(two_arm.tmp / "1400.toml")).returncode == 0
    before = two_arm.state()
    done = two_arm("apply", str(two_arm.tmp / "two-arm.toml"))
    assert (done.returncode, done.stderr.strip()) == (1, f"lbctl: {expected}")
    assert two_arm.state() == before


def test_a_deleted_egress_shows_in_status(two_arm: Ctl) -> None:
    assert two_arm("load", "--config", str(two_arm.tmp / "two-arm.toml")).returncode == 0
    subprocess.run(["ip", "-n", two_arm.ns, "link", "del", "lbe0"], check=True)
    status = json.loads(two_arm("status", "--json").stdout)["egress"]
    assert (status["now"], status["mtu"]) == ("", 0)
    assert "deleted; encapsulated frames drop as DROP_NO_EGRESS" in two_arm("status").stdout


@pytest.mark.parametrize(("egress", "message"), [
    ('"lbc0"', "datapath.egress must be an interface not in datapath.interfaces (leave egress out for one-arm) "
               "but got \"lbc0\""),
    ('"a/b"', "datapath.egress must be an interface name of 1..15 characters without '/', ':' or spaces "
              "but got \"a/b\""),
    ("7", "datapath.egress must be an interface name (two-arm), or absent (one-arm)"),
])
def test_bad_egress_values_name_the_key(egress: str, message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        cfg.loads(CONFIG.replace('interfaces = ["lbc0"]', f'interfaces = ["lbc0"]\negress = {egress}'), "lb.toml")
    assert message in str(exc.value)


def test_egress_survives_dump_and_one_arm_dumps_without_it() -> None:
    two = cfg.loads(TWO_ARM)
    assert two.datapath.egress == "lbe0" and cfg.loads(cfg.dump(two)) == two
    one = cfg.loads(CONFIG)
    assert "egress" not in cfg.dump(one) and cfg.loads(cfg.dump(one)) == one
