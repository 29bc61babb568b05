"""Topology keys of the scale-out and VM labs (kind = "vm", decap mode "kernel", bgp_asn, [bgp]): valid and invalid."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from lab import frr, topology
from lab.errors import TopologyError
from lab.remote import vmnodes

# A router, an LB with BGP, and one VM real; each error case below changes one thing in it.
VALID = """
description = "router, lb, vm"
[bgp]
bfd_interval_ms = 50
[[nodes]]
name = "rt"
role = "router"
bgp_asn = 65000
[[nodes]]
name = "lb"
role = "lb"
bgp_asn = 65001
routes = [{ dst = "default", via = "10.0.0.1" }]
[[nodes]]
name = "vm1"
role = "real"
kind = "vm"
decap = { mode = "kernel" }
[[links]]
a = { node = "rt", ifname = "rt-lb", addresses = ["10.0.0.1/30", "2001:db8:1::1/64"] }
b = { node = "lb", ifname = "lb-rt", addresses = ["10.0.0.2/30", "2001:db8:1::2/64"] }
[[links]]
a = { node = "rt", ifname = "rt-vm1", addresses = ["10.0.1.1/30", "2001:db8:2::1/64"] }
b = { node = "vm1", ifname = "eth0", addresses = ["10.0.1.2/30", "2001:db8:2::2/64"] }
[[vips]]
address = "198.51.100.100"
ports = [{ proto = "tcp", port = 80, service = "http" }]
"""

ERRORS = [
    ("vm-role", ('role = "router"\nbgp_asn = 65000', 'role = "router"\nkind = "vm"'),
     "nodes[0].kind must be \"netns\" for a node of role 'router' (only reals and LBs can be VMs) but got 'vm'"),
    ("vm-bpf-decap", ('decap = { mode = "kernel" }', 'decap = { mode = "bpf", ifname = "eth0" }'),
     "nodes[2].decap.mode must be \"kernel\" on a VM (its kernel decapsulates) but got 'bpf'"),
    ("vm-no-decap", ('decap = { mode = "kernel" }', ""),
     "nodes[2].decap must be a table {mode = \"kernel\"} (a VM real decapsulates) but got None"),
    ("vm-routes", ('decap = { mode = "kernel" }', 'decap = { mode = "kernel" }\nroutes = []'),
     "nodes[2].routes must be absent on a VM (it routes via its tap and sets its own sysctls) but got []"),
    ("node-key", ('routes = [{ dst = "default", via = "10.0.0.1" }]',
                      'routes = [{ dst = "default", via = "10.0.0.1" }]\nrole2 = 1'),
     "nodes[1].role2 must be absent (known keys: name, role, kind, sysctls, routes, decap, bgp_asn, nic, egress, "
     "uplink) but got 1"),
    ("gue-port", ('decap = { mode = "kernel" }', 'decap = { mode = "kernel", gue_port = 0 }'),
     "nodes[2].decap.gue_port must be an integer 1..65535 but got 0"),
    ("vm-two-v4", ('"10.0.1.2/30", "2001:db8:2::2/64"', '"10.0.1.2/30", "10.0.1.3/30"'),
     "links[1].b.addresses must be one IPv4 and at most one IPv6 address on the VM's end "
     "but got ['10.0.1.2/30', '10.0.1.3/30']"),
    ("tap-subnet", ('"10.0.1.1/30", "2001:db8:2::1/64"', '"10.0.9.1/30", "2001:db8:2::1/64"'),
     "links[1].a.addresses must be one IPv4 address in the subnet of the VM's 10.0.1.0/30 (the VM's gateway) "
     "but got ['10.0.9.1/30', '2001:db8:2::1/64']"),
    ("tap-xdp", ('ifname = "rt-vm1", addresses', 'ifname = "rt-vm1", xdp = { object = "pass.o", program = "p" }, '
                                                  'addresses'),
     "links[1].a.xdp must be absent on a VM's tap but got XdpProgram(object='pass.o', program='p', mode='native')"),
    ("vm-mtu", ('[[links]]\na = { node = "rt", ifname = "rt-vm1"', '[[links]]\nmtu = 9000\na = { node = "rt", '
                                                                   'ifname = "rt-vm1"'),
     "links[1].mtu must be 1500 on a VM's link (its tap's MTU) but got 9000"),
    ("asn-on-real", ('decap = { mode = "kernel" }', 'decap = { mode = "kernel" }\nbgp_asn = 65002'),
     "nodes[2].bgp_asn must be absent on a vm node of role 'real' (FRR runs on netns nodes of role router or lb) "
     "but got 65002"),
    ("asn-range", ("bgp_asn = 65000", "bgp_asn = 0"), "nodes[0].bgp_asn must be an integer 1..4294967294 but got 0"),
    ("bfd-interval", ("bfd_interval_ms = 50", "bfd_interval_ms = 5"),
     "bgp.bfd_interval_ms must be an integer 10..60000 but got 5"),
    ("bgp-key", ("bfd_interval_ms = 50", "bfd_interval_ms = 50\nhold = 3"),
     "bgp.hold must be absent (known keys: bfd_interval_ms, bfd_multiplier) but got 3"),
]  # fmt: skip


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scaleout.toml"
    path.write_text(text)
    return path


def test_valid_scaleout_topology(tmp_path: Path) -> None:
    topo = topology.load(write(tmp_path, VALID))
    vm = topo.node("vm1")
    assert (vm.kind, vm.decap) == ("vm", topology.Decap("kernel", "eth0", "", 6080))
    assert [n.name for n in topo.netns_nodes()] == ["rt", "lb"]
    assert [n.name for n in topo.bgp_nodes()] == ["rt", "lb"]
    assert topo.bgp == topology.Bgp(bfd_interval_ms=50, bfd_multiplier=3)
    mine, tap = topo.vm_link("vm1")
    assert (mine.ifname, tap.node, tap.ifname) == ("eth0", "rt", "rt-vm1")
    assert topo.is_vm_endpoint(tap) and not topo.is_vm_endpoint(topo.links[0].a)


@pytest.mark.parametrize(("change", "message"), [(c, m) for _, c, m in ERRORS], ids=[i for i, _, _ in ERRORS])
def test_invalid_scaleout_topology_names_file_key_value(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    old, new = change
    assert VALID.count(old) >= 1, f"the case's anchor {old!r} is not in VALID"
    path = write(tmp_path, VALID.replace(old, new, 1))
    with pytest.raises(TopologyError) as err:
        topology.load(path)
    assert str(err.value) == f"{path}: {message}"


def test_bgp_sessions_follow_links_one_per_family(tmp_path: Path) -> None:
    topo = topology.load(write(tmp_path, VALID))
    assert frr.peers(topo, "rt") == [
        (ipaddress.ip_address("10.0.0.1"), ipaddress.ip_address("10.0.0.2"), 65001),
        (ipaddress.ip_address("2001:db8:1::1"), ipaddress.ip_address("2001:db8:1::2"), 65001),
    ]
    bgpd = frr.configs(topo, topo.node("lb"))["bgpd"]
    assert " neighbor 10.0.0.1 bfd profile lab" in bgpd
    assert "  network 198.51.100.100/32" in bgpd and " bgp network import-check" in bgpd
    assert "maximum-paths" in frr.configs(topo, topo.node("rt"))["bgpd"]
    assert "  receive-interval 50" in frr.configs(topo, topo.node("rt"))["bfdd"]


def test_vm_supervisor_gets_the_links_addresses_and_gateways(tmp_path: Path) -> None:
    topo = topology.load(write(tmp_path, VALID))
    argv = vmnodes.supervisor_argv("lab", "lab-rt", topo, topo.node("vm1"), Path("/x/vm1.ready"))
    pairs = dict(zip(argv[3::2], argv[4::2], strict=False))
    assert pairs["--tap"] == "rt-vm1"
    assert (pairs["--addr"], pairs["--gateway"]) == ("10.0.1.2/30", "10.0.1.1")
    assert (pairs["--addr6"], pairs["--gateway6"]) == ("2001:db8:2::2/64", "2001:db8:2::1")
    assert pairs["--vip"] == "198.51.100.100" and pairs["--gue-port"] == "6080"


def test_vtysh_in_l4lab_exec_is_pointed_at_the_node(tmp_path: Path) -> None:
    from lab.state import state_dir

    d = frr.node_dir("nolab-here", "router")
    assert frr.exec_argv("nolab-here", "router", ["ping", "x"]) == ["ping", "x"]
    # No such lab: vtysh stays as given (it would fail the same way either way).
    assert frr.exec_argv("nolab-here", "router", ["vtysh", "-c", "show ip bgp"]) == ["vtysh", "-c", "show ip bgp"]
    assert frr.vtysh_argv("l", "router", "show ip bgp") == [
        "vtysh", "--vty_socket", str(state_dir("l") / "frr" / "router"),
        "--config_dir", str(state_dir("l") / "frr" / "router"), "-c", "show ip bgp",
    ]  # fmt: skip
    assert not d.exists()
