"""The Vagrant plan of a topology: the machines, private networks and provisioning steps, as JSON-ready data.

The Vagrantfile reads `l4lab vagrant-plan TOPOLOGY` and only declares what the plan says; everything
a machine does to itself is in lab/remote/provision/*.sh, run with the arguments listed here. Decisions
that differ from the netns lab, because these are whole machines:

- Every lab link is a private network of its own; each NIC gets a MAC derived from (topology,
  node, interface), and common.sh renames the NIC holding that MAC to the topology's interface
  name, so sysctls, the balancer config and decap name the same interfaces as in the netns lab.
- The machines keep Vagrant's management NIC and its default route (ssh, apt): a topology
  `default` route becomes one route per lab network (every link subnet, VIP and LB source prefix
  that is not connected) via the topology's gateway.
- Reals always decapsulate with the kernel (tunl0, ip6tnl0 in mode any, `ip fou add port P gue`).
- The LB's next-hop MAC is known in advance (it is the router's derived MAC), so the balancer
  config is complete in the plan (`lb_config`, also printed by `l4lab vagrant-plan --lb-config`).
- The box is Debian's public `debian/bookworm64`, or with `--box local` (L4LAB_BOX=local) the box
  `l4lab vagrant-box` builds from Debian's packages (lab/remote/vagrantbox.py): everything provisioning
  needs is inside it, so its machines need no network but their own, and with it the management
  network is isolated (libvirt mode "none"; the public box keeps NAT for apt).
- On libvirt every lab link is a UDP tunnel between the two machines' NICs (qemu sockets on
  127.0.0.1): no host bridge, no host address on the lab's subnets, nothing else can reach them.
  Every libvirt name (domains, the management network) starts with `l4lab-vg-`; the driver is
  "kvm" only where a KVM guest really boots (lab/remote/libvirtd.py), else "qemu" (TCG).
"""

from __future__ import annotations

import hashlib
import ipaddress
from pathlib import Path
from typing import Any

from balancer import _abi
from balancer import config as cfg
from lab.errors import UsageError
from lab.lbconf import lb_link, real_addresses
from lab.remote import vagrantbox
from lab.remote.libvirtd import driver as probe
from lab.topology import TOPOLOGY_DIR, IpNetwork, Node, Topology

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
PLAN_SCHEMA = 1
BOX = "debian/bookworm64"  # Debian 12: its kernel has the ipip, ip6_tunnel and fou modules
LOCAL_BOX = "l4lab/debian12"  # built by `l4lab vagrant-box` (lab/remote/vagrantbox.py)
LIBVIRT_PREFIX = "l4lab-vg-"
MANAGEMENT_NETWORK = "192.168.127.0/24"
TUNNEL_PORT_BASE = 47000  # UDP ports on 127.0.0.1 of the libvirt links: base + 64 * (lab slot) + 2 * link
SYNCED_FOLDER = "/vagrant"
PROVISION_DIR = "lab/remote/provision"
GUE_PORT = int(_abi.Limits.DEFAULT_GUE_PORT)
LB_ENCAP = {4: "ipip", 6: "ipip"}
# (cpus, memory MiB) per role: small enough for six machines on 2 vCPUs; the LB builds the datapath
# (clang, ~150 MB) and runs it on two CPUs (per-CPU maps, more than one RX path).
RESOURCES = {"client": (1, 256), "router": (1, 256), "lb": (2, 384), "real": (1, 256)}


def mac_for(topology: str, node: str, ifname: str) -> str:
    """A stable, locally administered unicast MAC for one NIC of one machine."""
    digest = hashlib.sha256(f"{topology}/{node}/{ifname}".encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, 0x4C, *digest[:4]))


def network_name(topo: Topology, index: int) -> str:
    """The private network of link `index`: unique per topology and link."""
    return f"{LIBVIRT_PREFIX}{topo.name}-link{index}"


def tunnel_ports(lab: str, index: int) -> tuple[int, int]:
    """The UDP ports on 127.0.0.1 of link `index`'s two ends (a, b) in lab `lab` (libvirt's tunnels)."""
    slot = int.from_bytes(hashlib.sha256(lab.encode()).digest()[:2], "big") % 64  # 64 ports a lab
    port = TUNNEL_PORT_BASE + 64 * slot + 2 * index
    return port, port + 1


def resolve_box(box: str) -> str:
    """The Vagrant box name for `box`: "public" (the default), "local" (l4lab vagrant-box) or a box name."""
    return {"public": BOX, "local": LOCAL_BOX, "": BOX}.get(box, box)


def _lab_networks(topo: Topology) -> list[IpNetwork]:
    nets: list[IpNetwork] = []
    for link in topo.links:
        for ep in link.endpoints:
            nets += [a.network for a in ep.all_addresses]
    nets += [ipaddress.ip_network(v.address) for v in topo.vips]
    nets += list(topo.lb_source_prefixes)
    unique: list[IpNetwork] = []
    for net in nets:
        if net not in unique:
            unique.append(net)
    return unique


def routes(topo: Topology, node: Node) -> list[dict[str, str]]:
    """The node's routes, with each `default` expanded into routes to the lab networks it lacks."""
    mine = [ep for ep in topo.endpoints_of(node.name)]
    connected = {a.network for ep in mine for a in ep.all_addresses}
    vips = {ipaddress.ip_network(v.address) for v in topo.vips} if node.role == "real" else set()
    explicit = {r.dst for r in node.routes if r.dst is not None}
    out: list[dict[str, str]] = []
    for route in node.routes:
        if route.dst is not None:
            out.append({"dst": str(route.dst), "via": str(route.via)})
            continue
        for net in _lab_networks(topo):
            if net.version != route.family or net in connected or net in vips or net in explicit:
                continue
            if any(net.subnet_of(c) for c in connected if c.version == net.version):  # type: ignore[arg-type]
                continue
            out.append({"dst": str(net), "via": str(route.via)})
    return out


def sysctls(topo: Topology, node: Node) -> dict[str, str]:
    """The node's sysctls with `*` expanded as the netns lab does (all, default, lo, lab interfaces)."""
    ifnames = [ep.ifname for ep in topo.endpoints_of(node.name)]
    out: dict[str, str] = {}
    for key, value in node.sysctls:
        if ".*." in key:
            for ifname in ("all", "default", "lo", *ifnames):
                out[key.replace(".*.", f".{ifname}.")] = value
        else:
            out[key] = value
    return out


def _networks(topo: Topology, node: Node, lab: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for index, link in enumerate(topo.links):
        ports = tunnel_ports(lab, index)
        for side, (mine, peer) in enumerate(((link.a, link.b), (link.b, link.a))):
            if mine.node != node.name:
                continue
            addresses = mine.all_addresses
            if not addresses:
                raise UsageError(
                    f"topology '{topo.name}': {node.name}:{mine.ifname} has no address; "
                    "a Vagrant private network needs one"
                )
            primary = next((a for a in addresses if a.version == 4), addresses[0])
            out.append({
                "network": network_name(topo, index),
                "link": index,
                "ifname": mine.ifname,
                "peer": f"{peer.node}:{peer.ifname}",
                "mac": mac_for(topo.name, node.name, mine.ifname),
                "mtu": link.mtu,
                "ip": str(primary.ip),
                "netmask": str(primary.netmask) if primary.version == 4 else str(primary.network.prefixlen),
                "addresses": [str(a) for a in addresses],
                "offloads": {k: v for k, v in mine.offloads},
                "tunnel": {"local_port": ports[side], "peer_port": ports[1 - side]},
            })
    return out


def _vips(topo: Topology) -> list[dict[str, Any]]:
    return [
        {
            "address": str(v.address),
            "services": [{"proto": p.proto, "port": p.port, "service": p.service} for p in v.ports],
        }
        for v in topo.vips
    ]


def _router_address(topo: Topology, node: str, ifname: str) -> cfg.IpAddress:
    """The first address (IPv4 first) of node's interface ifname: the LB's next hop."""
    ep = next(e for e in topo.endpoints_of(node) if e.ifname == ifname)
    return min((a.ip for a in ep.addresses), key=lambda ip: ip.version)


def lb_config(topo: Topology, lb: str) -> str:
    """The balancer config (TOML) of LB node `lb` on its Vagrant machine."""
    ifname, peer, peer_if = lb_link(topo, lb)
    src4 = next((p for p in topo.lb_source_prefixes if p.version == 4), ipaddress.IPv4Network("0.0.0.0/32"))
    src6 = next((p for p in topo.lb_source_prefixes if p.version == 6), ipaddress.IPv6Network("::/128"))
    vips: list[cfg.Vip] = []
    for vip in topo.vips:
        family = vip.address.version
        reals = tuple(
            cfg.Real(address=ipaddress.ip_address(a)) for _, a in sorted(real_addresses(topo, family).items())
        )
        encap = LB_ENCAP[family]
        for port in vip.ports:
            vips.append(cfg.Vip(
                address=vip.address, port=port.port, proto=port.proto,  # type: ignore[arg-type]
                encap=encap,  # type: ignore[arg-type]
                outer_src="flow" if encap == "ipip" else "fixed", reals=reals,
            ))
    config = cfg.Config(
        # virtio-net may refuse native XDP (too few queues): auto falls back to generic.
        datapath=cfg.DatapathConfig(interfaces=(ifname,), mode="auto"),
        # The machine's default route is Vagrant's management NIC: name the router on the lab link,
        # whose MAC the balancer finds itself (nexthop_mac = "auto").
        encap=cfg.EncapConfig(nexthop=_router_address(topo, peer, peer_if), gue_port=GUE_PORT,
                              src4=src4, src6=src6),
        vips=tuple(vips),
    )
    return cfg.dump(config)


def topology_ref(topo: Topology) -> str:
    """How a machine names the topology: its name if shipped, else its path inside the synced repo."""
    path = topo.path.resolve()
    if path.parent == TOPOLOGY_DIR.resolve():
        return topo.name
    try:
        return f"{SYNCED_FOLDER}/{path.relative_to(REPO_ROOT)}"
    except ValueError:
        raise UsageError(
            f"topology file {topo.path} is outside the repository {REPO_ROOT}, so the machines cannot "
            "read it from the synced folder; copy it into the repository"
        ) from None


def _provision(topo: Topology, node: Node, networks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    args: list[str] = ["--name", node.name]
    for net in networks:
        args += ["--iface", net["mac"], net["ifname"], str(net["mtu"])]
        for addr in net["addresses"]:
            args += ["--addr", net["ifname"], addr]
        for feature, on in net["offloads"].items():
            args += ["--offload", net["ifname"], feature, "on" if on else "off"]
    for key, value in sysctls(topo, node).items():
        args += ["--sysctl", key, value]
    for route in routes(topo, node):
        args += ["--route", route["dst"], route["via"]]
    steps = [{"script": f"{PROVISION_DIR}/common.sh", "args": args}]
    if node.role == "real":
        real_args = ["--name", node.name, "--repo", SYNCED_FOLDER, "--gue-port", str(GUE_PORT)]
        for vip in topo.vips:
            real_args += ["--vip", str(vip.address)]
            for port in vip.ports:
                real_args += [f"--{port.service}", f"{vip.address}:{port.port}"
                              if vip.address.version == 4 else f"[{vip.address}]:{port.port}"]
        steps.append({"script": f"{PROVISION_DIR}/real.sh", "args": real_args})
    elif node.role == "router":
        steps.append({"script": f"{PROVISION_DIR}/router.sh",
                      "args": ["--iface-all", *[n["ifname"] for n in networks]]})
    elif node.role == "lb":
        steps.append({"script": f"{PROVISION_DIR}/lb.sh",
                      "args": ["--repo", SYNCED_FOLDER, "--topology", topology_ref(topo), "--node", node.name]})
    else:
        steps.append({"script": f"{PROVISION_DIR}/client.sh", "args": ["--repo", SYNCED_FOLDER]})
    return steps


def node_plan(topo: Topology, node: Node, box: str = BOX, lab: str | None = None) -> dict[str, Any]:
    """The plan of one machine."""
    cpus, memory = RESOURCES[node.role]
    networks = _networks(topo, node, lab or topo.name)
    entry: dict[str, Any] = {
        "name": node.name,
        "hostname": f"{topo.name}-{node.name}",
        "role": node.role,
        "box": box,
        "cpus": cpus,
        "memory": memory,
        "networks": networks,
        "routes": routes(topo, node),
        "sysctls": sysctls(topo, node),
        "vips": _vips(topo) if node.role == "real" else [],
        "decap": (
            {"mode": "kernel", "ipip": "tunl0", "ip6": "ip6tnl0", "gue_ports": [GUE_PORT]}
            if node.role == "real" else None
        ),
        "provision": _provision(topo, node, networks),
    }
    if node.role == "lb":
        entry["lb_config"] = lb_config(topo, node.name)
    return entry


def libvirt(box: str, lab: str, driver: str | None = None, init: str = "systemd") -> dict[str, Any]:
    """The libvirt settings of lab `lab`: driver, domain name prefix, the management network, and with
    the local box's light init (`init` "light") the kernel command line that boots it."""
    if driver is None:
        driver = probe()
    if init != "systemd" and box != LOCAL_BOX:
        raise UsageError(f"the box init '{init}' is the local box's ({LOCAL_BOX}, --box local); {box} boots its own")
    cmd_line = vagrantbox.cmdline(init)  # UsageError when unknown
    return {
        # The light init's machines live minutes on the isolated management network, which only this
        # host reaches: they keep Vagrant's insecure key (replacing it cost 30-70 s a machine under TCG).
        **({"cmd_line": cmd_line, "ssh_insert_key": False} if init != "systemd" else {}),
        "driver": driver,
        "prefix": f"{LIBVIRT_PREFIX}{lab}-",
        "management_network": {
            "name": f"{LIBVIRT_PREFIX}mgmt",
            "address": MANAGEMENT_NETWORK,
            # The local box needs nothing from outside: its management network is isolated.
            "mode": "none" if box == LOCAL_BOX else "nat",
        },
    }


def plan(topo: Topology, box: str = "public", driver: str | None = None, lab: str | None = None,
         init: str = "systemd") -> dict[str, Any]:
    """The whole plan: one entry per node, in the topology's order.

    `box` is "public", "local" or a box name (resolve_box); `driver` the libvirt driver (probed when
    None); `lab` names this lab's libvirt domains and tunnel ports (default: the topology's name),
    so two labs of one topology can run side by side; `init` "light" boots the local box's light init
    (lab/remote/vagrantbox.py: no systemd, quicker under TCG) instead of systemd."""
    name = resolve_box(box)
    lab = lab or topo.name
    return {
        "schema": PLAN_SCHEMA,
        "topology": topo.name,
        "description": topo.description,
        "synced_folder": SYNCED_FOLDER,
        "lab": lab,
        "box": name,
        "libvirt": libvirt(name, lab, driver, init),
        "nodes": [node_plan(topo, node, name, lab) for node in topo.nodes],
    }
