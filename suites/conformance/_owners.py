"""_owners.py: the real the running balancer's ring gives each client flow, asked of the program (test run).

    python -m suites.conformance._owners --instance cf-1a2b3c-lb --vip 198.51.100.100 --port 7007 \\
        --client 192.0.2.2 --sports 40001,40002

Runs on the LB node. It loads a second copy of the instance's balancer object that *shares* the
running instance's VIP, real, ring and settings maps (so it reads exactly what the attached program
reads) but has its own, empty session tables (IPv4 sets, IPv6 LRU) and counters: the SYN it test-runs for
each flow is hashed onto the live ring and leaves no trace in the running datapath. The answer, one
JSON object {sport: real address}, is the ring owner of every flow — where the flow goes when no
session holds it (a new flow, a flow of a VIP without the LRU, a flow whose session was evicted).
A flow the program does not send to a real maps to "XDP_<action>".

`ring_owners` (in the test) asks it for a churn client's connections and names the reals by node.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import struct
import sys
from typing import Any

from balancer.controller import Instance
from balancer.datapath import BALANCER_MAPS, XDP_ACTIONS, Datapath, patch_rodata, sets_rodata, verify_abi
from balancer.libbpf import BpfObject
from balancer.maplayout import SESSION_SETS, SESSION_TABLES, session_sets
from lab.emitted import ETH, XDP_TX, _frame, _template
from lab.lbconf import real_addresses

# what the ring choice reads (lb_vip_cidrs: the VIPs that are prefixes)
SHARED = ("lb_vips", "lb_vip_index", "lb_reals", "lb_ring", "lb_settings", "lb_vip_cidrs")


def _udp(tmpl: bytearray, l4_off: int) -> bytearray:
    """The SYN template as a UDP datagram of the same flow (protocol, UDP header, lengths): 12 bytes of
    payload, where _frame writes its TCP checksum (the UDP checksum stays 0, none)."""
    eth, ip = tmpl[:ETH], tmpl[ETH:l4_off]
    udp = bytearray(struct.pack("!HHHH", 40000, int.from_bytes(tmpl[l4_off + 2: l4_off + 4], "big"), 20, 0)) + bytes(12)
    if ip[0] >> 4 == 4:
        ip[9], ip[2:4] = 17, struct.pack("!H", 20 + len(udp))
    else:
        ip[6], ip[4:6] = 17, struct.pack("!H", len(udp))
    return bytearray(eth + ip + udp)


def owners(instance: str, vip: str, port: int, client: str, sports: list[int], proto: str = "tcp") -> dict[int, str]:
    """The real address the instance's ring gives each flow client:sport -> vip:port (TCP or UDP)."""
    inst = Instance.open(instance)
    try:
        obj_path = inst.state.object
        verify_abi(obj_path)
        obj = BpfObject(obj_path)
        try:
            patch_rodata(obj, "balancer", {"cfg_ring_size": inst.dp.ring_size, **sets_rodata(session_sets(64)),
                                            "cfg_katran_max_vips": inst.config.datapath.katran_max_vips})
            # its own tables (the IPv4 sets, the IPv6 LRU): the running sessions are not consulted
            obj.set_max_entries(SESSION_SETS, session_sets(64))
            for table in SESSION_TABLES:
                obj.set_max_entries(table, 64)
            obj.set_autoload("balancer_xdp_frags", False)  # only balancer_xdp runs: half the verifier's work
            for name in SHARED:
                obj.reuse_map(name, inst.dp.maps[name].fd)
            obj.load()
        except BaseException:
            obj.close()
            raise
        shadow = Datapath({n: obj.map(n) for n in BALANCER_MAPS},
                          {"balancer_xdp": obj.program("balancer_xdp")}, inst.dp.ring_size, obj)
        with shadow:
            tmpl, src_off, l4_off = _template(vip, port)
            if proto == "udp":
                tmpl = _udp(tmpl, l4_off)
            src = ipaddress.ip_address(client).packed
            out: dict[int, str] = {}
            for sport in sports:
                verdict, data = shadow.run(_frame(tmpl, src_off, l4_off, src, sport))
                out[sport] = _outer_dst(data) if verdict == XDP_TX else XDP_ACTIONS.get(verdict, str(verdict))
            return out
    finally:
        inst.close()


def _outer_dst(frame: bytes) -> str:
    if frame[12:14] == b"\x86\xdd":
        return str(ipaddress.IPv6Address(frame[ETH + 24: ETH + 40]))
    return str(ipaddress.IPv4Address(frame[ETH + 16: ETH + 20]))


def ring_owners(lab: Any, balancer: Any, vip: str, port: int, conns: list[dict[str, Any]],
                proto: str = "tcp") -> dict[int, str]:
    """The node its VIP's ring gives each connection ({index, addr, port} of a churn client) now.

    `lab` is a lab.harness.Lab, `balancer` a lab.harness.LabBalancer (run on its node)."""
    by_addr = {a: n for n, a in real_addresses(lab.topology, balancer.family).items()}
    out: dict[int, str] = {}
    for client in sorted({c["addr"] for c in conns}):
        mine = [c for c in conns if c["addr"] == client]
        answer = json.loads(lab.python(
            balancer.node, "suites.conformance._owners", "--instance", balancer.instance, "--vip", vip,
            "--port", str(port), "--client", client, "--proto", proto,
            "--sports", ",".join(str(c["port"]) for c in mine)).stdout)
        out.update({c["index"]: by_addr.get(answer[str(c["port"])], answer[str(c["port"])]) for c in mine})
    return out


def owner_changed(before: dict[int, str], after: dict[int, str]) -> set[int]:
    """The connections whose ring owner differs between two readings of ring_owners."""
    return {i for i, node in before.items() if after[i] != node}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m suites.conformance._owners")
    ap.add_argument("--instance", required=True)
    ap.add_argument("--vip", required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--client", required=True, help="the client's address (the flows' source)")
    ap.add_argument("--sports", required=True, help="comma-separated client ports")
    ap.add_argument("--proto", choices=("tcp", "udp"), default="tcp", help="the flows' protocol")
    args = ap.parse_args(argv)
    sports = [int(p) for p in args.sports.split(",") if p]
    found = owners(args.instance, args.vip, args.port, args.client, sports, args.proto)
    json.dump({str(k): v for k, v in found.items()}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
