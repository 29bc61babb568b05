"""lbconf.py: the balancer configuration a lab topology implies, for one LB node and one encap mode.

The topology already says everything the LB needs: its interface towards the router, the VIPs and
their ports, the reals' addresses (per family) and the outer source prefixes. The next-hop MAC is
left to the balancer (``nexthop_mac = "auto"``): it finds the router's MAC in the LB node's kernel,
as it would on any host, through the LB node's default route. `peer_mac` reads a MAC from the
running lab for checks that want to know it. A two-arm LB (its node's `egress`) receives on its
other link and sends encapsulated frames by the egress, to the egress link's neighbour (`encap.nexthop`:
its address there; the LB's default route leaves by the ingress), with that link's MTU as its too-big
limit. An LB VM (`uplink`) has its addresses on a VLAN device above the bond it balances on, where the
balancer does not look for neighbours: its next hop's MAC is given, read from the router's end.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection

from pyroute2 import IPRoute

from balancer import config as cfg
from lab.errors import LabError
from lab.nsexec import entered
from lab.state import netns_name
from lab.topology import Topology


def lb_link(topo: Topology, lb: str = "lb") -> tuple[str, str, str]:
    """(LB interface, peer node, peer interface) of the LB node's link where VIP traffic comes in (a
    two-arm LB's first link that is not its egress)."""
    egress = topo.node(lb).egress
    for link in topo.links:
        for mine, peer in ((link.a, link.b), (link.b, link.a)):
            if mine.node == lb and mine.ifname != egress:
                return mine.ifname, peer.node, peer.ifname
    raise LabError(f"topology '{topo.name}' gives node '{lb}' no link")


def egress_link(topo: Topology, lb: str = "lb") -> tuple[str, str, str, int] | None:
    """(LB interface, peer node, peer interface, MTU) of a two-arm LB's egress link; None for one-arm."""
    egress = topo.node(lb).egress
    for link in topo.links:
        for mine, peer in ((link.a, link.b), (link.b, link.a)):
            if egress and mine.node == lb and mine.ifname == egress:
                return mine.ifname, peer.node, peer.ifname, link.mtu
    return None


def shape(topo: Topology, lb: str = "lb") -> str:
    """How the LB node is wired (reports.demo.LbShape): "bond-vlan" (a VM on a bonded, tagged uplink),
    "two-arm" (in by one link, out by its egress), or "one-arm"."""
    node = topo.node(lb)
    return "bond-vlan" if node.uplink is not None else "two-arm" if node.egress else "one-arm"


def emitting_link(topo: Topology, lb: str = "lb") -> tuple[str, str, str]:
    """(LB interface, peer node, peer interface) of the link the LB's encapsulated frames leave by."""
    egress = egress_link(topo, lb)
    return egress[:3] if egress else lb_link(topo, lb)


def real_addresses(topo: Topology, family: int) -> dict[str, str]:
    """{real node: its first address of family} for every node with role real."""
    out: dict[str, str] = {}
    for node in topo.nodes_with_role("real"):
        for ep in topo.endpoints_of(node.name):
            for iface in ep.addresses:
                if iface.version == family and node.name not in out:
                    out[node.name] = str(iface.ip)
    return out


def vip_binds(topo: Topology, port: int) -> list[str]:
    """ADDR:PORT ([ADDR]:PORT for IPv6) of every VIP address of the topology, for services on the reals."""
    return [f"[{v.address}]:{port}" if v.address.version == 6 else f"{v.address}:{port}" for v in topo.vips]


def peer_mac(lab: str, node: str, ifname: str) -> str:
    with entered(netns_name(lab, node)), IPRoute() as ipr:
        idx = ipr.link_lookup(ifname=ifname)
        if not idx:
            raise LabError(f"cannot find {ifname} in {netns_name(lab, node)}: is lab '{lab}' up?")
        mac: str = ipr.get_links(idx[0])[0].get_attr("IFLA_ADDRESS")
        return mac


def _nexthop_mac(topo: Topology, lab: str, lb: str) -> str:
    """"auto", or for an LB VM the router's MAC on its link (read from the running lab)."""
    if topo.node(lb).uplink is None:
        return "auto"
    _, peer, peer_if = lb_link(topo, lb)
    return peer_mac(lab, peer, peer_if)


def _egress_neighbour(topo: Topology, lb: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """A two-arm LB's next hop: the first address of the egress link's other end."""
    egress = egress_link(topo, lb)
    assert egress is not None
    _, peer, peer_if, _ = egress
    for link in topo.links:
        for ep in link.endpoints:
            if (ep.node, ep.ifname) == (peer, peer_if) and ep.addresses:
                return ep.addresses[0].ip
    raise LabError(f"topology '{topo.name}' gives {peer}/{peer_if}, the egress link's other end, no address")


def balancer_config(topo: Topology, lab: str, *, encaps: dict[int, str], lb: str = "lb",
                    mode: str = "native", mtu: int | None = None, weights: dict[str, int] | None = None,
                    lru: bool = True, outer_src: str | None = None, ifname: str | None = None,
                    nexthop_mac: str | None = None, reals: Collection[str] | None = None) -> cfg.Config:
    """A balancer config for node lb: every VIP of a family in encaps, with that family's encap,
    served by every real node (or those named in `reals`) at weight 1 or as `weights` says.

    `mtu` is the too-big limit: 1500 by default, a two-arm LB's egress link's MTU. `ifname` and
    `nexthop_mac` replace the topology's interface name and the next hop the balancer finds itself,
    for a lab built elsewhere (lab/remote/target.py)."""
    lb_if = lb_link(topo, lb)[0]
    egress = egress_link(topo, lb)
    if mtu is None:
        mtu = egress[3] if egress else 1500
    src4 = next((p for p in topo.lb_source_prefixes if p.version == 4), ipaddress.IPv4Network("0.0.0.0/32"))
    src6 = next((p for p in topo.lb_source_prefixes if p.version == 6), ipaddress.IPv6Network("::/128"))
    vips = []
    for vip in topo.vips:
        fam = vip.address.version
        if fam not in encaps:
            continue
        members = tuple(cfg.Real(address=ipaddress.ip_address(a), weight=(weights or {}).get(n, 1))
                        for n, a in sorted(real_addresses(topo, fam).items()) if reals is None or n in reals)
        encap = encaps[fam]
        for port in vip.ports:
            vips.append(cfg.Vip(address=vip.address, port=port.port, proto=port.proto,  # type: ignore[arg-type]
                                encap=encap, lru=lru,  # type: ignore[arg-type]
                                outer_src=outer_src or ("flow" if encap == "ipip" else "fixed"),  # type: ignore[arg-type]
                                reals=members))
    return cfg.Config(
        datapath=cfg.DatapathConfig(interfaces=(ifname or lb_if,), mode=mode, mtu=mtu,  # type: ignore[arg-type]
                                    lru_size=4096, fallback_size=4096, egress=egress[0] if egress else ""),
        encap=cfg.EncapConfig(nexthop_mac=nexthop_mac or _nexthop_mac(topo, lab, lb), src4=src4, src6=src6,
                              nexthop=_egress_neighbour(topo, lb) if egress and not nexthop_mac else None),
        vips=tuple(vips),
    )
