"""The deployment shapes' topology keys: a two-arm LB's `egress`, checked by key and value; the shipped shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from lab import topology
from lab.errors import TopologyError
from lab.lbconf import egress_link, emitting_link, lb_link


def test_two_arm_has_an_ingress_and_an_egress_arm() -> None:
    topo = topology.load("two-arm")
    assert topo.node("lb").egress == "lb-eg"
    assert lb_link(topo) == ("lb-rt", "router", "rt-lb")
    assert egress_link(topo) == ("lb-eg", "router", "rt-eg", 1500)
    assert emitting_link(topo) == ("lb-eg", "router", "rt-eg")
    ingress_mtu = next(link.mtu for link in topo.links if link.b.ifname == "lb-rt")
    assert ingress_mtu > 1500, "only the egress arm may limit what the LB emits"
    default = topology.load("default")
    assert egress_link(default) is None and emitting_link(default) == lb_link(default)


EGRESS_ERRORS = [
    ('name = "real1"\nrole = "real"', 'name = "real1"\nrole = "real"\negress = "r1-rt"', "nodes[3].egress",
     "absent on a node of role 'real' (only an LB has arms) but got 'r1-rt'"),
    ('egress = "lb-eg"', 'egress = "lb-xx"', "nodes[2].egress",
     "one of the node's two or more interfaces (lb-rt, lb-eg), another one being the ingress but got 'lb-xx'"),
]


def test_bond_vlan_has_an_lb_vm_with_a_bonded_tagged_uplink(tmp_path: Path) -> None:
    from lab.remote import vmnodes

    topo = topology.load("bond-vlan")
    lb = topo.node("lb")
    assert (lb.kind, lb.uplink) == ("vm", topology.Uplink("802.3ad", 100))
    assert lb_link(topo) == ("bond0", "router", "rt-lb"), "the balancer attaches to the bond"
    argv = vmnodes.supervisor_argv("lab", "lab-router", topo, lb, tmp_path / "lb.ready")
    at = {flag: argv[argv.index(flag) + 1] for flag in ("--tap", "--addr", "--gateway", "--addr6", "--bond",
                                                        "--vlan", "--ifname")}
    assert at == {"--tap": "rt-lb", "--addr": "198.51.100.2/28", "--gateway": "198.51.100.1",
                  "--addr6": "2001:db8:1b::2/64", "--bond": "802.3ad", "--vlan": "100", "--ifname": "bond0"}
    assert "--gue-port" not in argv and "--vip" not in argv, "an LB VM is no real: no decap, no VIPs on lo"


UPLINK_ERRORS = [
    ('uplink = { bond = "802.3ad", vlan = 100 }', 'uplink = { bond = "round-robin", vlan = 100 }',
     "nodes[2].uplink.bond", "one of 'active-backup', '802.3ad', 'balance-xor' but got 'round-robin'"),
    ('uplink = { bond = "802.3ad", vlan = 100 }', 'uplink = { bond = "802.3ad", vlan = 4095 }',
     "nodes[2].uplink.vlan", "an integer 1..4094 but got 4095"),
    ('uplink = { bond = "802.3ad", vlan = 100 }\n', "", "nodes[2].uplink",
     "a table {bond = \"802.3ad\", vlan = 100} (an LB VM's uplink) but got None"),
    ('kind = "vm"\nuplink', 'kind = "netns"\nuplink', "nodes[2].uplink",
     "absent on a netns node of role 'lb' (an LB VM's uplink) but got {'bond': '802.3ad', 'vlan': 100}"),
]


KEY_ERRORS = [("two-arm", *e) for e in EGRESS_ERRORS] + [("bond-vlan", *e) for e in UPLINK_ERRORS]


@pytest.mark.parametrize(("name", "old", "new", "key", "message"), KEY_ERRORS,
                         ids=["egress-not-an-lb", "egress-not-its-interface", "uplink-bond-mode", "uplink-vlan-range",
                              "uplink-missing", "uplink-on-netns"])
def test_invalid_shape_keys_name_file_key_value(tmp_path: Path, name: str, old: str, new: str, key: str,
                                                message: str) -> None:
    text = topology.load(name).path.read_text()
    assert old in text
    path = tmp_path / "topo.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(TopologyError) as err:
        topology.load(path)
    assert str(err.value) == f"{path}: {key} must be {message}"
