"""Topology files: the shipped ones hold what the lab promises; invalid ones are refused by key and value."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from lab import topology
from lab.errors import TopologyError, UsageError

# A two-node topology that is valid; each error case below changes one thing in it.
MINIMAL = """
description = "two nodes"
[[nodes]]
name = "a"
role = "client"
kind = "netns"
routes = [{ dst = "default", via = "10.0.0.2" }]
[[nodes]]
name = "b"
role = "real"
kind = "netns"
decap = { mode = "bpf", ifname = "b-a" }
[[links]]
mtu = 1500
a = { node = "a", ifname = "a-b", addresses = ["10.0.0.1/30"] }
b = { node = "b", ifname = "b-a", addresses = ["10.0.0.2/30"] }
[[vips]]
address = "198.51.100.100"
ports = [{ proto = "tcp", port = 80, service = "http" }]
"""

ERRORS = [
    ("vm-kind", ('kind = "netns"\nrou', 'kind = "vm"\nrou'),
     """nodes[0].kind must be "netns" for a node of role 'client' (only reals and LBs can be VMs) but got 'vm'"""),
    ("bad-role", ('role = "client"', 'role = "server"'),
     "nodes[0].role must be one of 'client', 'router', 'lb', 'real' but got 'server'"),
    ("route-off-link", ('via = "10.0.0.2"', 'via = "10.9.9.9"'),
     "nodes[0].routes[0].via must be a gateway inside a subnet of node 'a' (10.0.0.0/30) but got '10.9.9.9'"),
    ("route-family", ('dst = "default", via = "10.0.0.2"', 'dst = "2001:db8::/64", via = "10.0.0.2"'),
     "nodes[0].routes[0].via must be an IPv6 gateway for the IPv6 dst 2001:db8::/64 but got '10.0.0.2'"),
    ("long-ifname", ('ifname = "a-b"', 'ifname = "a-very-long-name"'),
     "links[0].a.ifname must be an interface name of 1..15 letters, digits, '-' or '_' "
     "but got 'a-very-long-name'"),
    ("no-prefix", ('["10.0.0.1/30"]', '["10.0.0.1"]'),
     "links[0].a.addresses[0] must be an address with prefix length like '192.0.2.1/28' but got '10.0.0.1'"),
    ("unknown-node", ('b = { node = "b"', 'b = { node = "c"'),
     "links[0].b.node must be the name of a node: a, b but got 'c'"),
    ("mtu", ("mtu = 1500", "mtu = 10"), "links[0].mtu must be an integer 68..65535 but got 10"),
    ("port", ("port = 80", "port = 0"), "vips[0].ports[0].port must be an integer 1..65535 but got 0"),
    ("service-proto", ('proto = "tcp"', 'proto = "udp"'),
     "vips[0].ports[0].proto must be 'tcp' for service 'http' but got 'udp'"),
    ("vip-address", ('address = "198.51.100.100"', 'address = "198.51.100.300"'),
     "vips[0].address must be an IPv4 or IPv6 address but got '198.51.100.300'"),
    ("unknown-key", ('description = "two nodes"', 'description = "two nodes"\ncolour = "red"'),
     "colour must be absent (known keys: description, lb_source_prefixes, bgp, node_defaults, roles, nodes, "
     "links, vips) but got 'red'"),
    ("kernel-decap", ('mode = "bpf"', 'mode = "kernel"'),
     'nodes[1].decap.mode must be "bpf" (kernel decap needs kind = "vm") '
     "but got 'kernel'"),
    ("decap-ifname", ('ifname = "b-a" }\n[[links]]', 'ifname = "eth0" }\n[[links]]'),
     "nodes[1].decap.ifname must be an interface of node 'b': b-a but got 'eth0'"),
    ("duplicate-node", ('name = "b"', 'name = "a"'),
     "nodes[1].name must be a name not used by another node but got 'a'"),
    ("nic-on-netns", ('ifname = "b-a" }\n[[links]]', 'ifname = "b-a" }\nnic = { queues = 4 }\n[[links]]'),
     "nodes[1].nic must be absent on a netns node (only a VM real has a NIC to set) but got {'queues': 4}"),
    ("sysctl-name", ('kind = "netns"\nrou', 'kind = "netns"\nsysctls = { "kernel.panic" = 1 }\nrou'),
     "nodes[0].sysctls.'kernel.panic' must be a sysctl name under net. like 'net.ipv4.ip_forward' "
     "but got 'kernel.panic'"),
]  # fmt: skip


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "topo.toml"
    path.write_text(text)
    return path


def test_minimal_topology_is_valid(tmp_path: Path) -> None:
    topo = topology.load(write(tmp_path, MINIMAL))
    assert [n.name for n in topo.nodes] == ["a", "b"]
    assert topo.links[0].a.addresses == (ipaddress.ip_interface("10.0.0.1/30"),)


@pytest.mark.parametrize(("change", "message"), [(c, m) for _, c, m in ERRORS], ids=[i for i, _, _ in ERRORS])
def test_invalid_topology_names_file_key_value(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    old, new = change
    assert MINIMAL.count(old) >= 1, f"the case's anchor {old!r} is not in MINIMAL"
    path = write(tmp_path, MINIMAL.replace(old, new, 1))
    with pytest.raises(TopologyError) as err:
        topology.load(path)
    assert str(err.value) == f"{path}: {message}"
    assert err.value.file == str(path)


def test_invalid_toml_is_a_topology_error(tmp_path: Path) -> None:
    path = write(tmp_path, "description = \n")
    with pytest.raises(TopologyError, match=r"topo\.toml: \(file\) must be valid TOML but got"):
        topology.load(path)


def test_unknown_topology_name_lists_the_shipped_ones() -> None:
    with pytest.raises(UsageError, match="unknown topology 'nope'; shipped topologies: bond-vlan, default, dual-stack"):
        topology.load("nope")


@pytest.mark.parametrize("name", topology.shipped())
def test_shipped_topology_is_a_valid_netns_lab(name: str) -> None:
    topo = topology.load(name)
    roles = {n.role for n in topo.nodes}
    assert {"client", "router", "lb", "real"} <= roles
    assert all(n.kind == "netns" or (n.role, n.uplink is not None) in (("real", False), ("lb", True))
               for n in topo.nodes)
    for link in topo.links:
        for ep in link.endpoints:
            assert len(ep.ifname) <= 15
    for real in topo.nodes_with_role("real"):
        assert real.decap is not None and real.decap.mode == ("bpf" if real.kind == "netns" else "kernel")
    for lb in topo.nodes_with_role("lb"):
        links = [link for link in topo.links if {link.a.node, link.b.node} == {"router", lb.name}]
        (rt_lb,) = [lk.a if lk.a.node == "router" else lk.b for lk in links
                    if lb.egress not in (lk.a.ifname, lk.b.ifname)]
        assert rt_lb.ifname == f"rt-{lb.name}"
        if lb.kind == "vm":  # the router's end is the LB VM's tap: no veth rules there (bond-vlan.toml)
            continue
        assert rt_lb.offloads == (("tx", False),)
        assert rt_lb.xdp == topology.XdpProgram("pass.o", "xdp_pass", "native")
        for link in links:  # a two-arm LB's egress: a redirect target's peer needs an XDP program too
            if lb.egress in (link.a.ifname, link.b.ifname):
                assert (link.a if link.a.node == "router" else link.b).xdp == rt_lb.xdp


def test_default_topology_has_the_documented_plan() -> None:
    topo = topology.load("default")
    assert [(n.name, n.role) for n in topo.nodes] == [
        ("client", "client"), ("router", "router"), ("lb", "lb"),
        ("real1", "real"), ("real2", "real"), ("real3", "real"),
    ]  # fmt: skip
    eps = {ep.ifname: ep for link in topo.links for ep in link.endpoints}
    assert [str(a) for a in eps["cl-rt"].addresses] == ["192.0.2.2/28", "2001:db8:c::2/64"]
    assert [str(a) for a in eps["rt-cl"].addresses] == ["192.0.2.1/28", "2001:db8:c::1/64"]
    assert [str(a) for a in eps["rt-lb"].addresses] == ["198.51.100.1/28", "2001:db8:1b::1/64"]
    assert [str(a) for a in eps["lb-rt"].addresses] == ["198.51.100.2/28", "2001:db8:1b::2/64"]
    for i in (1, 2, 3):
        assert [str(a) for a in eps[f"rt-r{i}"].addresses] == [
            f"203.0.113.{16 * i + 1}/28",
            f"2001:db8:e{i}::1/64",
        ]
        assert [str(a) for a in eps[f"r{i}-rt"].addresses] == [
            f"203.0.113.{16 * i + 2}/28",
            f"2001:db8:e{i}::2/64",
        ]
    assert {(str(v.address), p.proto, p.port) for v in topo.vips for p in v.ports} == {
        ("198.51.100.100", "tcp", 80), ("198.51.100.100", "udp", 9000),
        ("2001:db8:100::100", "tcp", 80), ("2001:db8:100::100", "udp", 9000),
    }  # fmt: skip
    assert {r.describe() for r in topo.node("router").routes} == {
        "198.51.100.100/32 via 198.51.100.2", "2001:db8:100::100/128 via 2001:db8:1b::2",
    }  # fmt: skip
    assert [str(p) for p in topo.lb_source_prefixes] == ["198.51.100.128/25", "2001:db8:1b:80::/64"]
    router = dict(topo.node("router").sysctls)
    assert router["net.ipv4.ip_forward"] == "1" and router["net.ipv4.conf.*.rp_filter"] == "0"
    real = dict(topo.node("real1").sysctls)
    assert real["net.ipv4.conf.all.arp_ignore"] == "1" and real["net.ipv4.conf.all.arp_announce"] == "2"


def test_many_reals_has_sixteen_reals_on_distinct_subnets() -> None:
    topo = topology.load("many-reals")
    reals = topo.nodes_with_role("real")
    assert len(reals) == 16
    nets = [a.network for link in topo.links for ep in link.endpoints for a in ep.addresses]
    assert len(set(nets)) == len(nets) // 2  # every link its own subnets, shared by exactly two ends


def test_mtu_topology_has_jumbo_client_side_and_1500_elsewhere() -> None:
    topo = topology.load("mtu")
    mtus = {link.a.ifname: link.mtu for link in topo.links}
    assert mtus.pop("cl-rt") == 9000
    assert set(mtus.values()) == {1500}


NIC_ERRORS = [
    ("nic = { queues = 1, rss = true }", "nodes[3].nic.queues must be at least 2 with rss = true (RSS spreads "
                                         "over queues) but got 1"),
    ("nic = { queues = 9 }", "nodes[3].nic.queues must be an integer 1..8 but got 9"),
    ('nic = { queues = 4, rss = "yes" }', "nodes[3].nic.rss must be true or false but got 'yes'"),
    ("nic = { queues = 4, hash = 1 }", "nodes[3].nic.hash must be absent (known keys: queues, rss) but got 1"),
]


def test_nic_rss_topology_has_a_four_queue_rss_vm_real() -> None:
    topo = topology.load("nic-rss")
    (real,) = topo.nodes_with_role("real")
    assert (real.kind, real.nic) == ("vm", topology.Nic(queues=4, rss=True))
    assert all(n.nic == topology.Nic() for n in topo.netns_nodes())


@pytest.mark.parametrize(("line", "message"), NIC_ERRORS, ids=[m.split(" must")[0] for _, m in NIC_ERRORS])
def test_invalid_vm_nic_names_file_key_value(tmp_path: Path, line: str, message: str) -> None:
    text = topology.load("nic-rss").path.read_text()
    anchor = "nic = { queues = 4, rss = true }"
    assert anchor in text
    path = write(tmp_path, text.replace(anchor, line))
    with pytest.raises(TopologyError) as err:
        topology.load(path)
    assert str(err.value) == f"{path}: {message}"
