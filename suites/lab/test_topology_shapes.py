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


@pytest.mark.parametrize(("old", "new", "key", "message"), EGRESS_ERRORS, ids=["not-an-lb", "not-its-interface"])
def test_invalid_egress_names_file_key_value(tmp_path: Path, old: str, new: str, key: str, message: str) -> None:
    text = topology.load("two-arm").path.read_text()
    assert old in text
    path = tmp_path / "topo.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(TopologyError) as err:
        topology.load(path)
    assert str(err.value) == f"{path}: {key} must be {message}"
