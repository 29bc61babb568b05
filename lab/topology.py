"""Lab topologies: load a TOML file into validated, immutable data (nodes, links, routes, VIPs).

The file format (see lab/topologies/default.toml for a complete example):

    description = "one line"
    lb_source_prefixes = ["198.51.100.128/25", ...]      # recorded for the balancer config only
    [node_defaults] sysctls = {...}                       # every node
    [roles.<role>]  sysctls = {...}                       # every node of that role
    [bgp]      bfd_interval_ms = 100, bfd_multiplier = 3              (FRR BGP + BFD between nodes)
    [[nodes]]  name, role (client|router|lb|real), kind ("netns"|"vm"), sysctls, routes = [{dst, via}],
               decap = {mode = "bpf", ifname, attach = "tc"|"xdp"}         (netns reals)
               decap = {mode = "kernel", gue_port = 6080}                  (vm reals: tunl0, fou/GUE)
               nic = {queues = 4, rss = true}      (vm reals: a multiqueue virtio-net NIC, qemu's RSS on)
               bgp_asn = 65000                         (router and lb nodes that run FRR, see lab.frr)
               egress = "lb-eg"     (lb nodes, two-arm: encapsulated frames leave by this interface of the
                                     node, its link's MTU their limit; the node's other link is the ingress)
               uplink = {bond = "802.3ad", vlan = 100}     (an lb of kind "vm": its one link is a bond of
                                     two links (active-backup, 802.3ad or balance-xor) carrying that VLAN,
                                     named as the VM's end of the link; lab.remote.lbvm)
    [[links]]  mtu, a = {endpoint}, b = {endpoint}; endpoint = {node, ifname, addresses,
               extra_addresses, offloads = {tx = false}, xdp = {object, program, mode}}
    [[vips]]   address, ports = [{proto = "tcp"|"udp", port, service = "http"|"udp-echo"}]

A sysctl key with `*` in the interface position (`net.ipv4.conf.*.rp_filter`) applies to `all`,
`default`, `lo` and every lab interface of the node. Every real holds every VIP on its loopback
and runs the VIPs' services bound to them. Every error names the file, the key, the value and
what was expected.

A node of kind "vm" is a real server or an LB (`uplink`) in a qemu VM (lab.remote.vmnodes): it has exactly
one link, to a netns node whose end of the link is the VM's tap (that end carries the VM's gateway addresses);
the VM's own end has one IPv4 and at most one IPv6 address, and no routes, sysctls, offloads or XDP
of its own: its default routes point at the tap's addresses. Every node with `bgp_asn` runs FRR
(zebra, bgpd, bfdd) and peers over every link to another such node (eBGP, one session per family,
BFD on each); an LB node announces the VIPs while its balancer is loaded and healthy.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from balancer import _abi
from balancer.validate import Reader, join
from lab.errors import TopologyError, UsageError

TOPOLOGY_DIR = Path(__file__).resolve().parent / "topologies"

ROLES = ("client", "router", "lb", "real")
KINDS = ("netns", "vm")
SERVICES = {"http": "tcp", "udp-echo": "udp"}
DECAP_MODES = ("bpf", "kernel")
BGP_ROLES = ("router", "lb")
DEFAULT_GUE_PORT = int(_abi.Limits.DEFAULT_GUE_PORT)
DECAP_ATTACH = ("tc", "xdp")
BOND_MODES = ("active-backup", "802.3ad", "balance-xor")  # the modes XDP runs on a bond in (lab.remote.lbvm)
XDP_MODES = ("native", "generic")
OFFLOADS = ("tx",)
MAX_NIC_QUEUES = 8  # a VM NIC's queues are its vCPUs under TCG: more only slows the boot

_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,30}$")
_IFNAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,15}$")
_SYSCTL_RE = re.compile(r"^net(\.[A-Za-z0-9_*-]+)+$")

IpInterface = ipaddress.IPv4Interface | ipaddress.IPv6Interface
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class XdpProgram:
    """An XDP program attached to an endpoint (e.g. XDP_PASS on the peer of the LB's veth)."""

    object: str  # file name under build/bpf/
    program: str
    mode: str


@dataclass(frozen=True)
class Endpoint:
    """One end of a veth link: the node, its interface name and what is set on it."""

    node: str
    ifname: str
    addresses: tuple[IpInterface, ...]
    extra_addresses: tuple[IpInterface, ...]
    offloads: tuple[tuple[str, bool], ...]
    xdp: XdpProgram | None

    @property
    def all_addresses(self) -> tuple[IpInterface, ...]:
        return self.addresses + self.extra_addresses


@dataclass(frozen=True)
class Link:
    """A point-to-point veth pair between two nodes."""

    a: Endpoint
    b: Endpoint
    mtu: int

    @property
    def endpoints(self) -> tuple[Endpoint, Endpoint]:
        return (self.a, self.b)


@dataclass(frozen=True)
class Route:
    """A route in a node: `dst` (a network, or None for the default) via the gateway `via`."""

    dst: IpNetwork | None
    via: IpAddress

    @property
    def family(self) -> int:
        return self.via.version

    def describe(self) -> str:
        return f"{self.dst if self.dst is not None else 'default'} via {self.via}"


@dataclass(frozen=True)
class Decap:
    """How a real removes the LB's encapsulation."""

    mode: str  # "bpf" (our decap program) or "kernel" (tunl0, ip6tnl0 and fou in a VM)
    ifname: str
    attach: str  # "tc" or "xdp" for bpf; "" for kernel
    gue_port: int = DEFAULT_GUE_PORT  # kernel: `ip fou add port P gue` (both GUE variants)


@dataclass(frozen=True)
class Nic:
    """A VM real's NIC: its receive queues (and vCPUs), and whether qemu spreads them by Toeplitz RSS."""

    queues: int = 1
    rss: bool = False


@dataclass(frozen=True)
class Uplink:
    """An LB VM's uplink: a bond of two links in `bond` mode, carrying VLAN `vlan`."""

    bond: str
    vlan: int


@dataclass(frozen=True)
class Node:
    """A machine of the lab (a network namespace for kind = "netns")."""

    name: str
    role: str
    kind: str
    sysctls: tuple[tuple[str, str], ...]
    routes: tuple[Route, ...]
    decap: Decap | None
    bgp_asn: int | None = None  # runs FRR and peers over its links with other BGP nodes
    nic: Nic = Nic()  # a VM real's NIC; netns nodes keep the default
    egress: str = ""  # a two-arm LB's egress interface ("": one-arm)
    uplink: Uplink | None = None  # an LB VM's bonded, tagged uplink


@dataclass(frozen=True)
class Bgp:
    """Lab-wide BGP settings: the BFD timers every session uses."""

    bfd_interval_ms: int = 100
    bfd_multiplier: int = 3


@dataclass(frozen=True)
class VipPort:
    """One (protocol, port) served on a VIP, and the service the reals run for it."""

    proto: str
    port: int
    service: str


@dataclass(frozen=True)
class Vip:
    """A virtual IP address and its ports."""

    address: IpAddress
    ports: tuple[VipPort, ...]


@dataclass(frozen=True)
class Topology:
    """A whole lab topology, validated."""

    name: str
    path: Path
    description: str
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    vips: tuple[Vip, ...]
    lb_source_prefixes: tuple[IpNetwork, ...]
    bgp: Bgp = Bgp()

    def node(self, name: str) -> Node:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes)
        raise UsageError(f"topology '{self.name}' has no node '{name}' (nodes: {known})")

    def endpoints_of(self, node: str) -> list[Endpoint]:
        return [ep for link in self.links for ep in link.endpoints if ep.node == node]

    def nodes_with_role(self, role: str) -> list[Node]:
        return [n for n in self.nodes if n.role == role]

    def netns_nodes(self) -> list[Node]:
        """The nodes that are network namespaces (every node but the VMs)."""
        return [n for n in self.nodes if n.kind == "netns"]

    def vm_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.kind == "vm"]

    def bgp_nodes(self) -> list[Node]:
        return [n for n in self.nodes if n.bgp_asn is not None]

    def vm_link(self, node: str) -> tuple[Endpoint, Endpoint]:
        """(the VM's end, the tap's end) of the one link of VM node `node`."""
        for link in self.links:
            for mine, peer in ((link.a, link.b), (link.b, link.a)):
                if mine.node == node:
                    return mine, peer
        raise UsageError(f"topology '{self.name}' gives VM node '{node}' no link")

    def is_vm_endpoint(self, ep: Endpoint) -> bool:
        """Whether `ep` is on a link to a VM: the VM's end, or the tap that qemu's VM is joined by."""
        vms = {n.name for n in self.vm_nodes()}
        return any(
            ep in link.endpoints and (link.a.node in vms or link.b.node in vms) for link in self.links
        )


def shipped() -> list[str]:
    """Names of the topologies shipped in lab/topologies."""
    return sorted(p.stem for p in TOPOLOGY_DIR.glob("*.toml"))


def resolve(spec: str) -> Path:
    """Turn a topology name (from lab/topologies) or a path into the file's path."""
    if "/" in spec or spec.endswith(".toml"):
        path = Path(spec)
        if not path.is_file():
            raise UsageError(
                f"topology file '{spec}' does not exist; give a path or one of: {', '.join(shipped())}"
            )
        return path
    path = TOPOLOGY_DIR / f"{spec}.toml"
    if not path.is_file():
        raise UsageError(f"unknown topology '{spec}'; shipped topologies: {', '.join(shipped())}")
    return path


def load(spec: str | Path) -> Topology:
    """Load and validate a topology given by name or path."""
    path = spec if isinstance(spec, Path) else resolve(spec)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise TopologyError(str(path), "(file)", str(exc), "valid TOML") from exc
    except OSError as exc:
        raise UsageError(f"cannot read topology '{path}': {exc.strerror}") from exc
    return _Reader(str(path)).topology(raw, path)


class _Reader:
    """The topology's sections, read through balancer.validate's checks (``self.check``).

    The accessors below take (table, key, path) and add the topology's defaults: an optional
    table or array reads as empty.
    """

    def __init__(self, file: str) -> None:
        self.file = file
        self.check = Reader(self.fail)

    def fail(self, key: str, value: object, expected: str) -> TopologyError:
        return TopologyError(self.file, key, value, expected)

    def table(self, raw: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> dict[str, Any]:
        value = raw.get(key)
        if value is None and not required:
            return {}
        return self.check.table(value, join(where, key))

    def array(self, raw: Mapping[str, Any], key: str, where: str, *, required: bool = True) -> list[Any]:
        value = raw.get(key)
        if value is None and not required:
            return []
        return self.check.array(value, join(where, key))

    def string(
        self,
        raw: Mapping[str, Any],
        key: str,
        where: str,
        *,
        choices: Sequence[str] = (),
        default: str | None = None,
    ) -> str:
        return self.check.string(raw.get(key, default), join(where, key), choices=choices)

    def integer(
        self, raw: Mapping[str, Any], key: str, where: str, lo: int, hi: int, default: int | None = None
    ) -> int:
        return self.check.integer(raw.get(key, default), join(where, key), lo, hi)

    def nic(self, raw: Mapping[str, Any], where: str) -> Nic:
        """A VM real's `nic = {queues, rss}`: RSS needs at least two queues to spread over."""
        body = self.table(raw, "nic", where, required=False)
        self.check.known_keys(body, ("queues", "rss"), f"{where}.nic")
        queues = self.integer(body, "queues", f"{where}.nic", 1, MAX_NIC_QUEUES, default=1)
        rss = self.check.boolean(body.get("rss", False), f"{where}.nic.rss")
        if rss and queues < 2:
            raise self.fail(f"{where}.nic.queues", queues, "at least 2 with rss = true (RSS spreads over queues)")
        return Nic(queues, rss)

    def sysctls(self, raw: Mapping[str, Any], where: str) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in raw.items():
            path = f"{where}.{key!r}" if "." in key else join(where, key)
            if not _SYSCTL_RE.match(key):
                raise self.fail(path, key, "a sysctl name under net. like 'net.ipv4.ip_forward'")
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise self.fail(path, value, "an integer or a string")
            out[key] = str(value)
        return out

    # ---- the sections

    def topology(self, raw: dict[str, Any], path: Path) -> Topology:
        self.check.known_keys(
            raw,
            ("description", "lb_source_prefixes", "bgp", "node_defaults", "roles", "nodes", "links", "vips"),
            "",
        )
        description = self.string(raw, "description", "")
        prefixes = tuple(
            self.check.network(p, f"lb_source_prefixes[{i}]")
            for i, p in enumerate(self.array(raw, "lb_source_prefixes", "", required=False))
        )
        defaults = self.table(raw, "node_defaults", "", required=False)
        self.check.known_keys(defaults, ("sysctls",), "node_defaults")
        base_sysctls = self.sysctls(
            self.table(defaults, "sysctls", "node_defaults", required=False), "node_defaults.sysctls"
        )
        role_sysctls = self.role_sysctls(raw)
        node_tables = self.node_tables(raw)
        names = {self.string(body, "name", where) for where, body in node_tables}
        links = tuple(
            self.link(body, f"links[{i}]", names) for i, body in enumerate(self.array(raw, "links", ""))
        )
        seen_if: dict[tuple[str, str], str] = {}
        for i, link in enumerate(links):
            for side, ep in (("a", link.a), ("b", link.b)):
                if (ep.node, ep.ifname) in seen_if:
                    raise self.fail(
                        f"links[{i}].{side}.ifname",
                        ep.ifname,
                        f"an interface name not already used in node '{ep.node}'",
                    )
                seen_if[(ep.node, ep.ifname)] = f"links[{i}].{side}"
            if link.a.node == link.b.node:
                raise self.fail(f"links[{i}].b.node", link.b.node, "a node other than a.node")
            if link.mtu < 1280 and any(a.version == 6 for ep in link.endpoints for a in ep.all_addresses):
                raise self.fail(f"links[{i}].mtu", link.mtu, "at least 1280 on a link with IPv6 addresses")

        nodes = tuple(
            self.node(body, where, base_sysctls, role_sysctls, links) for where, body in node_tables
        )
        vips = tuple(
            self.vip(body, f"vips[{i}]") for i, body in enumerate(self.array(raw, "vips", "", required=False))
        )
        kinds = {n.name: n.kind for n in nodes}
        for i, link in enumerate(links):
            for side, ep, peer in (("a", link.a, link.b), ("b", link.b, link.a)):
                if kinds[ep.node] == "vm":
                    self.vm_endpoints(f"links[{i}]", side, ep, peer, kinds[peer.node])
                    if link.mtu != 1500:
                        raise self.fail(f"links[{i}].mtu", link.mtu, "1500 on a VM's link (its tap's MTU)")
        if any(n.kind == "vm" and n.role == "real" for n in nodes):
            self.vm_services(vips)
        body = self.table(raw, "bgp", "", required=False)
        self.check.known_keys(body, ("bfd_interval_ms", "bfd_multiplier"), "bgp")
        bgp = Bgp(
            self.integer(body, "bfd_interval_ms", "bgp", 10, 60000, default=Bgp.bfd_interval_ms),
            self.integer(body, "bfd_multiplier", "bgp", 2, 255, default=Bgp.bfd_multiplier),
        )
        return Topology(path.stem, path, description, nodes, links, vips, prefixes, bgp)

    def role_sysctls(self, raw: dict[str, Any]) -> dict[str, dict[str, str]]:
        """The [roles.<role>.sysctls] tables, by role."""
        role_sysctls: dict[str, dict[str, str]] = {}
        for role, body in self.table(raw, "roles", "", required=False).items():
            if role not in ROLES:
                raise self.fail(f"roles.{role}", role, "a role: " + ", ".join(ROLES))
            body = self.check.table(body, f"roles.{role}")
            self.check.known_keys(body, ("sysctls",), f"roles.{role}")
            role_sysctls[role] = self.sysctls(
                self.table(body, "sysctls", f"roles.{role}", required=False), f"roles.{role}.sysctls"
            )
        return role_sysctls

    def node_tables(self, raw: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """The [[nodes]] tables with where each is, their names checked: well-formed and unique."""
        raw_nodes = self.array(raw, "nodes", "")
        if not raw_nodes:
            raise self.fail("nodes", raw_nodes, "at least one [[nodes]] entry")
        names: set[str] = set()
        node_tables: list[tuple[str, dict[str, Any]]] = []
        for i, body in enumerate(raw_nodes):
            where = f"nodes[{i}]"
            body = self.check.table(body, where)
            name = self.string(body, "name", where)
            if not _NAME_RE.match(name):
                raise self.fail(
                    f"{where}.name", name, "lower-case letters, digits and '-', starting with a letter"
                )
            if name in names:
                raise self.fail(f"{where}.name", name, "a name not used by another node")
            names.add(name)
            node_tables.append((where, body))
        return node_tables

    def vm_endpoints(self, where: str, side: str, ep: Endpoint, peer: Endpoint, peer_kind: str) -> None:
        """A link to a VM: the VM's end and the tap's end must fit what a VmReal can be given."""
        other = "b" if side == "a" else "a"
        if peer_kind != "netns":
            raise self.fail(f"{where}.{other}.node", peer.node, "a netns node (the VM's tap lives in it)")
        for key, value in (("extra_addresses", ep.extra_addresses), ("offloads", ep.offloads)):
            if value:
                raise self.fail(f"{where}.{side}.{key}", value, f"absent on the VM's end (node '{ep.node}')")
        if ep.xdp is not None:
            raise self.fail(f"{where}.{side}.xdp", ep.xdp, f"absent on the VM's end (node '{ep.node}')")
        for key, value in (("extra_addresses", peer.extra_addresses), ("offloads", peer.offloads)):
            if value:
                raise self.fail(f"{where}.{other}.{key}", value, "absent on a VM's tap")
        if peer.xdp is not None:
            raise self.fail(f"{where}.{other}.xdp", peer.xdp, "absent on a VM's tap")
        for version in (4, 6):
            mine = [a for a in ep.addresses if a.version == version]
            theirs = [a for a in peer.addresses if a.version == version]
            if len(mine) > 1 or (version == 4 and not mine):
                raise self.fail(
                    f"{where}.{side}.addresses",
                    [str(a) for a in ep.addresses],
                    "one IPv4 and at most one IPv6 address on the VM's end",
                )
            if len(theirs) > 1 or (mine and (not theirs or theirs[0].network != mine[0].network)):
                raise self.fail(
                    f"{where}.{other}.addresses",
                    [str(a) for a in peer.addresses],
                    f"one IPv{version} address in the subnet of the VM's "
                    + (str(mine[0].network) if mine else f"IPv{version} address (it has none)")
                    + " (the VM's gateway)",
                )

    def vm_services(self, vips: tuple[Vip, ...]) -> None:
        """A VM serves HTTP on one port and UDP echo on one port, on every VIP."""
        for service in SERVICES:
            ports = {p.port for v in vips for p in v.ports if p.service == service}
            if len(ports) > 1:
                raise self.fail(
                    "vips",
                    sorted(ports),
                    f"one port for service '{service}' on every VIP (a VM real serves one)",
                )

    def endpoint(self, raw: object, where: str, nodes: set[str]) -> Endpoint:
        raw = self.check.table(raw, where, "a table {node, ifname, addresses}")
        self.check.known_keys(raw, ("node", "ifname", "addresses", "extra_addresses", "offloads", "xdp"), where)
        node = self.string(raw, "node", where)
        if node not in nodes:
            raise self.fail(f"{where}.node", node, "the name of a node: " + ", ".join(sorted(nodes)))
        ifname = self.string(raw, "ifname", where)
        if not _IFNAME_RE.match(ifname) or ifname in ("all", "default", "lo"):
            raise self.fail(
                f"{where}.ifname", ifname, "an interface name of 1..15 letters, digits, '-' or '_'"
            )
        addresses = tuple(
            self.check.interface(a, f"{where}.addresses[{j}]")
            for j, a in enumerate(self.array(raw, "addresses", where))
        )
        extra = tuple(
            self.check.interface(a, f"{where}.extra_addresses[{j}]")
            for j, a in enumerate(self.array(raw, "extra_addresses", where, required=False))
        )
        offloads_raw = self.table(raw, "offloads", where, required=False)
        offloads: list[tuple[str, bool]] = []
        for key, value in offloads_raw.items():
            if key not in OFFLOADS:
                raise self.fail(
                    f"{where}.offloads.{key}", value, "absent (known offloads: " + ", ".join(OFFLOADS) + ")"
                )
            offloads.append((key, self.check.boolean(value, f"{where}.offloads.{key}")))
        xdp = None
        if "xdp" in raw:
            body = self.table(raw, "xdp", where)
            self.check.known_keys(body, ("object", "program", "mode"), f"{where}.xdp")
            xdp = XdpProgram(
                self.string(body, "object", f"{where}.xdp"),
                self.string(body, "program", f"{where}.xdp"),
                self.string(body, "mode", f"{where}.xdp", choices=XDP_MODES, default="native"),
            )
        return Endpoint(node, ifname, addresses, extra, tuple(offloads), xdp)

    def link(self, raw: object, where: str, nodes: set[str]) -> Link:
        raw = self.check.table(raw, where, "a table {a, b, mtu}")
        self.check.known_keys(raw, ("a", "b", "mtu"), where)
        mtu = self.integer(raw, "mtu", where, 68, 65535, default=1500)
        return Link(
            self.endpoint(raw.get("a"), f"{where}.a", nodes),
            self.endpoint(raw.get("b"), f"{where}.b", nodes),
            mtu,
        )

    def node(
        self,
        raw: dict[str, Any],
        where: str,
        base: dict[str, str],
        by_role: dict[str, dict[str, str]],
        links: tuple[Link, ...],
    ) -> Node:
        self.check.known_keys(raw, ("name", "role", "kind", "sysctls", "routes", "decap", "bgp_asn", "nic", "egress",
                                    "uplink"), where)
        name = raw["name"]
        role = self.string(raw, "role", where, choices=ROLES)
        kind = self.string(raw, "kind", where, choices=KINDS, default="netns")
        if kind == "vm" and role not in ("real", "lb"):
            raise self.fail(
                f"{where}.kind", kind, f"\"netns\" for a node of role '{role}' (only reals and LBs can be VMs)"
            )
        bgp_asn = None
        if "bgp_asn" in raw:
            bgp_asn = self.integer(raw, "bgp_asn", where, 1, 4294967294)
            if role not in BGP_ROLES or kind != "netns":
                raise self.fail(
                    f"{where}.bgp_asn", bgp_asn, f"absent on a {kind} node of role '{role}' (FRR runs on "
                    "netns nodes of role " + " or ".join(BGP_ROLES) + ")"
                )
        if kind == "vm":
            for key in ("routes", "sysctls"):
                if key in raw:
                    raise self.fail(
                        f"{where}.{key}",
                        raw[key],
                        "absent on a VM (it routes via its tap and sets its own sysctls)",
                    )
            if role == "real" and "decap" not in raw:
                raise self.fail(f"{where}.decap", None, 'a table {mode = "kernel"} (a VM real decapsulates)')
            if role == "lb" and "uplink" not in raw:
                raise self.fail(f"{where}.uplink", None, 'a table {bond = "802.3ad", vlan = 100} (an LB VM\'s uplink)')
        elif "nic" in raw:
            raise self.fail(f"{where}.nic", raw["nic"], 'absent on a netns node (only a VM real has a NIC to set)')
        sysctls = {
            **base,
            **by_role.get(role, {}),
            **self.sysctls(self.table(raw, "sysctls", where, required=False), f"{where}.sysctls"),
        }
        mine = [ep for link in links for ep in link.endpoints if ep.node == name]
        routes = self.routes(raw, where, name, [a.network for ep in mine for a in ep.all_addresses])
        decap = self.decap(raw, where, name, role, kind, mine) if "decap" in raw else None
        nic = self.nic(raw, where) if kind == "vm" else Nic()
        egress = self.egress(raw, where, role, mine) if "egress" in raw else ""
        uplink = self.uplink(raw, where, name, role, kind, mine) if "uplink" in raw else None
        return Node(name, role, kind, tuple(sysctls.items()), routes, decap, bgp_asn, nic, egress, uplink)

    def uplink(self, raw: Mapping[str, Any], where: str, name: str, role: str, kind: str,
               mine: list[Endpoint]) -> Uplink:
        """An LB VM's `uplink = {bond, vlan}`, on its one link."""
        body = self.table(raw, "uplink", where)
        if (role, kind) != ("lb", "vm"):
            raise self.fail(f"{where}.uplink", body, f"absent on a {kind} node of role '{role}' (an LB VM's uplink)")
        self.check.known_keys(body, ("bond", "vlan"), f"{where}.uplink")
        if len(mine) != 1:
            raise self.fail(f"{where}.name", name, f"a VM with exactly one link (it has {len(mine)})")
        return Uplink(self.string(body, "bond", f"{where}.uplink", choices=BOND_MODES),
                      self.integer(body, "vlan", f"{where}.uplink", 1, 4094))

    def egress(self, raw: Mapping[str, Any], where: str, role: str, mine: list[Endpoint]) -> str:
        """A two-arm LB's `egress`: one of its interfaces, with another one left for the ingress."""
        ifname = self.string(raw, "egress", where)
        if role != "lb":
            raise self.fail(f"{where}.egress", ifname, f"absent on a node of role '{role}' (only an LB has arms)")
        names = [ep.ifname for ep in mine]
        if ifname not in names or len(names) < 2:
            raise self.fail(f"{where}.egress", ifname,
                            "one of the node's two or more interfaces (" + ", ".join(names) + "), another one "
                            "being the ingress")
        return ifname

    def routes(self, raw: Mapping[str, Any], where: str, name: str, connected: list[IpNetwork]) -> tuple[Route, ...]:
        """A node's `routes = [{dst, via}]`: each gateway inside one of the node's subnets."""
        routes: list[Route] = []
        for j, body in enumerate(self.array(raw, "routes", where, required=False)):
            at = f"{where}.routes[{j}]"
            body = self.check.table(body, at, "a table {dst, via}")
            self.check.known_keys(body, ("dst", "via"), at)
            dst_raw = self.string(body, "dst", at)
            dst = None if dst_raw == "default" else self.check.network(dst_raw, f"{at}.dst")
            via = self.check.address(body.get("via"), f"{at}.via")
            if dst is not None and dst.version != via.version:
                raise self.fail(
                    f"{at}.via", str(via), f"an IPv{dst.version} gateway for the IPv{dst.version} dst {dst}"
                )
            if not any(via in net for net in connected):
                raise self.fail(
                    f"{at}.via",
                    str(via),
                    f"a gateway inside a subnet of node '{name}' ({', '.join(map(str, connected))})",
                )
            routes.append(Route(dst, via))
        return tuple(routes)

    def decap(
        self, raw: Mapping[str, Any], where: str, name: str, role: str, kind: str, mine: list[Endpoint]
    ) -> Decap:
        """A real's `decap`: the kernel's on a VM (its one link), our BPF program on a netns node."""
        body = self.table(raw, "decap", where)
        if role != "real":
            raise self.fail(f"{where}.decap", body, f"absent on a node of role '{role}' (only reals decapsulate)")
        mode = body.get("mode")
        if kind == "vm":
            if mode != "kernel":
                raise self.fail(f"{where}.decap.mode", mode, '"kernel" on a VM (its kernel decapsulates)')
            self.check.known_keys(body, ("mode", "gue_port"), f"{where}.decap")
            if len(mine) != 1:
                raise self.fail(f"{where}.name", name, f"a VM with exactly one link (it has {len(mine)})")
            port = self.integer(body, "gue_port", f"{where}.decap", 1, 65535, default=DEFAULT_GUE_PORT)
            return Decap("kernel", mine[0].ifname, "", port)
        self.check.known_keys(body, ("mode", "ifname", "attach"), f"{where}.decap")
        if mode == "kernel":
            raise self.fail(f"{where}.decap.mode", mode, '"bpf" (kernel decap needs kind = "vm")')
        mode = self.string(body, "mode", f"{where}.decap", choices=("bpf",))
        ifname = self.string(body, "ifname", f"{where}.decap")
        if ifname not in [ep.ifname for ep in mine]:
            raise self.fail(
                f"{where}.decap.ifname",
                ifname,
                "an interface of node '{}': {}".format(name, ", ".join(ep.ifname for ep in mine)),
            )
        return Decap(mode, ifname, self.string(body, "attach", f"{where}.decap", choices=DECAP_ATTACH, default="tc"))

    def vip(self, raw: object, where: str) -> Vip:
        raw = self.check.table(raw, where, "a table {address, ports}")
        self.check.known_keys(raw, ("address", "ports"), where)
        address = self.check.address(raw.get("address"), f"{where}.address")
        ports: list[VipPort] = []
        for j, body in enumerate(self.array(raw, "ports", where)):
            at = f"{where}.ports[{j}]"
            body = self.check.table(body, at, "a table {proto, port, service}")
            self.check.known_keys(body, ("proto", "port", "service"), at)
            proto = self.string(body, "proto", at, choices=("tcp", "udp"))
            port = self.integer(body, "port", at, 1, 65535)
            service = self.string(body, "service", at, choices=tuple(SERVICES))
            if SERVICES[service] != proto:
                raise self.fail(f"{at}.proto", proto, f"'{SERVICES[service]}' for service '{service}'")
            ports.append(VipPort(proto, port, service))
        return Vip(address, tuple(ports))

