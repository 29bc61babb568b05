"""A running lab's status, read live from its namespaces: nodes, links, addresses, routes, programs, VIPs.

`collect()` returns plain data (what `l4lab status --json` prints); `render()` makes it a text table.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from pyroute2 import IPRoute

from lab import services, topology
from lab.nsexec import entered, netns_path
from lab.state import LabState, netns_name

Report = dict[str, Any]
_BIND_FLAGS = ("--http", "--udp-echo")


def collect(lab: str) -> Report:
    """The status of lab `lab` as JSON-ready data."""
    state = LabState.load(lab)
    topo = topology.load(Path(state.topology_path))
    peers = {}
    for link in topo.links:
        peers[(link.a.node, link.a.ifname)] = f"{link.b.node}/{link.b.ifname}"
        peers[(link.b.node, link.b.ifname)] = f"{link.a.node}/{link.a.ifname}"
    nodes = []
    for node in topo.nodes:
        ns = netns_name(lab, node.name)
        entry: dict[str, Any] = {"name": node.name, "role": node.role, "kind": node.kind, "netns": ns}
        if node.kind == "vm":
            entry.update(_vm(state, topo, node.name))
        else:
            entry["present"] = netns_path(ns).exists()
            entry.update(
                _live(ns, {ep.ifname for ep in topo.endpoints_of(node.name)}) if entry["present"] else {}
            )
        for iface in entry.get("interfaces", []):
            iface["peer"] = peers.get((node.name, iface["ifname"]))
        entry["programs"] = [
            {
                "ifname": p.ifname,
                "hook": p.hook,
                "program": p.program,
                "object": p.object,
                "pin": p.pin,
                "pinned": os.path.exists(p.pin),
            }
            for p in state.programs
            if p.node == node.name
        ]
        entry["services"] = [
            {
                "pid": p.pid,
                "alive": services.starttime(p.pid) == p.starttime,
                "log": p.log,
                "binds": [
                    f"{flag[2:]} {value}"
                    for flag, value in zip(p.argv, p.argv[1:], strict=False)
                    if flag in _BIND_FLAGS
                ],
                "what": _process_label(p.argv),
            }
            for p in state.processes
            if p.node == node.name
        ]
        nodes.append(entry)
    return {
        "name": lab,
        "topology": topo.name,
        "topology_path": str(topo.path),
        "complete": state.complete,
        # Of an incomplete lab, whether it is still being built or its builder died (killed, a crash).
        "builder": builder(state),
        "nodes": nodes,
        "vips": [
            {
                "address": str(v.address),
                "ports": [{"proto": p.proto, "port": p.port, "service": p.service} for p in v.ports],
            }
            for v in topo.vips
        ],
        "lb_source_prefixes": [str(p) for p in topo.lb_source_prefixes],
    }


def builder(state: LabState) -> dict[str, Any]:
    """The builder's pid and whether that process still runs; both None for a state file written before
    they were recorded (a pid without its start time could be another process's by now)."""
    if not state.builder_pid or state.builder_start is None:
        return {"pid": None, "alive": None}
    return {"pid": state.builder_pid, "alive": services.starttime(state.builder_pid) == state.builder_start}


def _is_qemu(argv: list[str]) -> bool:
    return any(Path(a).name.startswith("qemu-system") for a in argv)


def _process_label(argv: list[str]) -> str:
    """What a lab process is, for the text view: its service binds, or qemu / the VM supervisor."""
    binds = [f"{flag[2:]} {value}" for flag, value in zip(argv, argv[1:], strict=False) if flag in _BIND_FLAGS]
    if binds:
        return " ".join(binds)
    if _is_qemu(argv):
        return "qemu (the VM)"
    return "VM supervisor" if "lab.remote.vmnodes" in argv else " ".join(Path(a).name for a in argv[:3])


def _vm(state: LabState, topo: topology.Topology, node: str) -> dict[str, Any]:
    """A VM node: no namespace here; its qemu process (alive or not) and the addresses it was given.

    The guest is not entered, so its interfaces show the topology's settings with state "vm"."""
    qemu = [p for p in state.processes if p.node == node and _is_qemu(p.argv)]
    alive = [p for p in qemu if services.starttime(p.pid) == p.starttime]
    interfaces = [{"ifname": ep.ifname, "state": "vm", "mtu": link.mtu, "mac": None, "xdp_attached": False,
                   "addresses": [str(a) for a in ep.all_addresses]}
                  for link in topo.links for ep in link.endpoints if ep.node == node]
    return {"netns": None, "present": bool(alive), "qemu_pid": alive[0].pid if alive else None,
            "interfaces": interfaces, "loopback": [f"{v.address}/{v.address.max_prefixlen}" for v in topo.vips],
            "routes": []}


def _live(ns: str, lab_ifnames: set[str]) -> dict[str, Any]:
    with entered(ns):
        ipr = IPRoute()
    with ipr:
        names: dict[int, str] = {}
        interfaces: list[dict[str, Any]] = []
        for link in ipr.get_links():
            name = link.get_attr("IFLA_IFNAME")
            names[link["index"]] = name
            if name in lab_ifnames:
                xdp = link.get_attr("IFLA_XDP")
                interfaces.append(
                    {
                        "ifname": name,
                        "state": link.get_attr("IFLA_OPERSTATE"),
                        "mtu": link.get_attr("IFLA_MTU"),
                        "mac": link.get_attr("IFLA_ADDRESS"),
                        "xdp_attached": bool(xdp is not None and xdp.get_attr("IFLA_XDP_ATTACHED")),
                        "addresses": [],
                    }
                )
        by_name = {i["ifname"]: i for i in interfaces}
        loopback: list[str] = []
        for addr in ipr.get_addr():
            if addr["scope"] == 253:  # link-local: not the lab's
                continue
            text = f"{addr.get_attr('IFA_ADDRESS')}/{addr['prefixlen']}"
            owner = names.get(addr["index"])
            if owner == "lo" and text not in ("127.0.0.1/8", "::1/128"):
                loopback.append(text)
            elif owner in by_name:
                by_name[owner]["addresses"].append(text)
        routes: list[str] = []
        for family in (socket.AF_INET, socket.AF_INET6):
            for route in ipr.get_routes(family=family, table=254):
                gateway = route.get_attr("RTA_GATEWAY")
                if gateway is None:
                    continue
                dst = route.get_attr("RTA_DST")
                routes.append(f"{dst}/{route['dst_len']} via {gateway}" if dst else f"default via {gateway}")
    return {"interfaces": interfaces, "loopback": loopback, "routes": routes}


def _incomplete(report: Report) -> str:
    if report["complete"]:
        return ""
    pid = report["builder"]["pid"]
    if pid is None:  # a state file from before the builder was recorded
        return " INCOMPLETE"
    if report["builder"]["alive"]:
        return f" INCOMPLETE: being built by pid {pid}"
    return f" INCOMPLETE: its builder (pid {pid}) ended; `l4lab down --name {report['name']}` removes it"


def render(report: Report) -> str:
    """The status as a text table, one line per interface, program and service."""
    lines = [f"lab {report['name']} (topology {report['topology']}){_incomplete(report)}"]
    for node in report["nodes"]:
        where = (f"vm qemu pid {node['qemu_pid']}" if node["present"] else "vm qemu NOT RUNNING") \
            if node["kind"] == "vm" else f"netns {node['netns']}" + ("" if node["present"] else " MISSING")
        lines.append(f"  {node['name']:<8} {node['role']:<7} {where}")
        for iface in node.get("interfaces", []):
            addrs = " ".join(iface["addresses"])
            xdp = " xdp" if iface["xdp_attached"] else ""
            lines.append(
                f"    {iface['ifname']:<8} -> {iface['peer'] or '?':<14} {iface['state']:<5} "
                f"mtu {iface['mtu']:<5}{xdp} {addrs}"
            )
        if node.get("loopback"):
            lines.append(f"    lo       {' '.join(node['loopback'])}")
        for route in node.get("routes", []):
            lines.append(f"    route    {route}")
        for prog in node["programs"]:
            pinned = "pinned" if prog["pinned"] else "NOT PINNED"
            lines.append(
                f"    program  {prog['program']} on {prog['ifname']} ({prog['hook']}), "
                f"{pinned} at {prog['pin']}"
            )
        for svc in node["services"]:
            alive = "running" if svc["alive"] else "NOT RUNNING"
            lines.append(f"    services pid {svc['pid']} {alive}: {svc['what']}")
    for vip in report["vips"]:
        ports = ", ".join(f"{p['proto']}/{p['port']} {p['service']}" for p in vip["ports"])
        lines.append(f"  vip {vip['address']}: {ports}")
    return "\n".join(lines)
