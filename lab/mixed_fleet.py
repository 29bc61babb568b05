"""mixed_fleet.py: a multi-LB lab whose LB nodes run different balancers behind one ECMP router.

The pieces a mixed-fleet check needs beside the multi-lb topology (lab/topologies/multi-lb.toml):

- `KatranNode`: Katran's balancer (lab/dut/katran.py, built from the user's checkout) in native XDP
  on an LB node's link, serving one VIP with the ring Katran's own control-plane code builds
  (lab/dut/katran_ring.py) for weighted reals, as a Katran node of a real fleet would. Katran has no
  lbctl instance for the lab's health hook to watch, so the node announces its VIP itself: a
  blackhole route in its namespace, which its FRR redistributes (lab/frr.py), withdrawn by `close()`.
- `ecmp_paths`: the LB node the router's multipath route sends each client flow to now, asked of
  the router's kernel (`ip route get ... ipproto tcp sport S dport D iif IF`: the same L4 hash).
- `reshuffle`: a new multipath hash seed on the router (net.ipv4.fib_multipath_hash_seed, which
  IPv6 uses too): about half the flows move to the other LB node, as when a router reboots or a
  fleet's membership changes, with no node failing.

    with KatranNode(lab, "lb1", checkout, vip, port, {"203.0.113.18": 1}) as node:
        paths = ecmp_paths(lab.name, lab.topology, vip, port, [("192.0.2.2", 40001)])
        reshuffle(lab.name, seed=2)
"""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path

from balancer import katran_hash, maglev
from lab.dut import katran, katran_ring
from lab.errors import LabError
from lab.lbconf import lb_link, peer_mac
from lab.nsexec import entered
from lab.state import netns_name
from lab.topology import Topology

ROUTER = "router"


class KatranNode:
    """Katran serving `vip`:`port`/TCP on LB node `node` of netns lab `lab`, to `reals` {address: weight}."""

    def __init__(self, lab: str, topo: Topology, node: str, checkout: katran.Checkout, vip: str, port: int,
                 reals: Mapping[str, int], out_dir: Path, ring: katran_hash.RingKind = "v1") -> None:
        self.lab, self.topo, self.node = lab, topo, node
        self.vip, self.port, self.reals, self.ring = vip, port, dict(reals), ring
        self.obj = katran.build(checkout, "ipip", out_dir)
        self.ring_code = katran_ring.build(checkout, out_dir)
        self.numbers = {a: i + 1 for i, a in enumerate(sorted(self.reals, key=lambda a: ipaddress.ip_address(a).packed,
                                                              reverse=True))}  # Katran's own numbering
        self._stack = ExitStack()
        self.katran: katran.Katran | None = None

    def __enter__(self) -> KatranNode:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Load and attach Katran (empty session tables, as after a restart), then announce the VIP."""
        if self.katran is not None:
            raise LabError(f"Katran is already running on {self.node}")
        kt = self._stack.enter_context(katran.Katran(self.obj, lru_size=1 << 16).load())
        lb_if, router, router_if = lb_link(self.topo, self.node)
        with entered(netns_name(self.lab, self.node)):
            kt.attach(lb_if, "native")
        kt.set_router_mac(peer_mac(self.lab, router, router_if))
        for addr, num in self.numbers.items():
            kt.add_real(num, addr)
        kt.add_vip(self.vip, self.port, 6, 0)
        backends = [maglev.Backend(self.numbers[a], a, w) for a, w in self.reals.items()]
        kt.set_ring(0, list(katran_ring.ring(self.ring_code, backends, katran.RING_SIZE, self.ring)))
        self.katran = kt
        self._route("replace")
        self._stack.callback(self._route, "del")

    def stop(self, announce: bool = True) -> None:
        """Detach Katran (its sessions go with it); with `announce`, also withdraw the VIP's route.
        A node that dies silently keeps its route: only BFD's silence tells the router."""
        if not announce:
            self._stack.pop_all()  # the route stays: no withdrawal on a silent death
            if self.katran is not None:
                self.katran.close()
        self._stack.close()
        self.katran = None

    close = stop

    def forwarded(self) -> dict[str, int]:
        """Packets Katran sent to each real (its per-real counters), by address."""
        if self.katran is None:
            return {}
        return {a: self.katran.real_counter(n)[0] for a, n in self.numbers.items()}

    def _route(self, verb: str) -> None:
        plen = ipaddress.ip_address(self.vip).max_prefixlen
        done = subprocess.run(["ip", "-n", netns_name(self.lab, self.node), "route", verb, "blackhole",
                               f"{self.vip}/{plen}"], capture_output=True, text=True, check=False)
        if done.returncode != 0 and not (verb == "del" and "No such process" in done.stderr):
            raise LabError(f"cannot {verb} the route of {self.vip} on {self.node}: {done.stderr.strip()}",
                           command=" ".join(done.args), stderr=done.stderr)


def _router_link_to(topo: Topology, node: str) -> str:
    """The router's interface on its link to `node`."""
    for link in topo.links:
        for mine, peer in ((link.a, link.b), (link.b, link.a)):
            if mine.node == ROUTER and peer.node == node:
                return mine.ifname
    raise LabError(f"topology '{topo.name}' has no link between {ROUTER} and {node}")


def ecmp_paths(lab: str, topo: Topology, vip: str, port: int, flows: Sequence[tuple[str, int]],
               client: str = "client") -> list[str]:
    """For each (client address, client port) TCP flow to vip:port, the LB node the router sends it to now."""
    iif = _router_link_to(topo, client)
    nodes = {_router_link_to(topo, n.name): n.name for n in topo.nodes if n.role == "lb"}
    script = "".join(f"route get {vip} from {src} iif {iif} ipproto tcp sport {sport} dport {port}\n"
                     for src, sport in flows)
    done = subprocess.run(["ip", "-n", netns_name(lab, ROUTER), "-j", "-batch", "-"], input=script,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise LabError(f"the router of lab {lab} cannot say where flows to {vip} go: {done.stderr.strip()}",
                       command="ip -batch route get", stderr=done.stderr)
    answers = [json.loads(line)[0] for line in done.stdout.splitlines() if line.strip()]
    if len(answers) != len(flows):
        raise LabError(f"the router answered {len(answers)} of {len(flows)} route lookups for {vip}")
    return [nodes.get(a.get("dev", ""), a.get("dev", "?")) for a in answers]


def reshuffle(lab: str, seed: int) -> None:
    """Give the router's multipath hash a new seed (1..2^32-1): flows move between the LB nodes."""
    if not 0 < seed < 2**32:
        raise LabError(f"a multipath hash seed is 1..4294967295 (0 means random) but got {seed}")
    path = "/proc/sys/net/ipv4/fib_multipath_hash_seed"
    with entered(netns_name(lab, ROUTER)):
        try:
            Path(path).write_text(f"{seed}\n")
        except OSError as exc:
            raise LabError(f"cannot set {path} in lab {lab}'s router: {exc.strerror} (the kernel needs "
                           "6.11 or later for a settable multipath hash seed)") from exc
