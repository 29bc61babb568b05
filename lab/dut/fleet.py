"""fleet.py: several instances of one DUT behind the router's ECMP, for the multi-LB checks.

Topology multi-lb. l4lab and Katran run one instance per LB node (lb1, lb2); each node's bgpd
announces the VIPs while its instance serves them (l4lab: the lab's health hook; Katran: a
blackhole route the member adds, which bgpd's import-check turns into an announcement), and BFD
(3 x 100 ms) tells the router when a node went silent. IPVS runs one VM per instance beside the
router, which holds one static ECMP route over them; a VM killed takes its tap's carrier with it,
and the router (ignore_routes_with_linkdown) stops using that next hop. Either way the router
spreads flows by the L4 hash (the topology's fib_multipath_hash_policy).

    with make_fleet("katran", lab, workdir) as fleet:
        fleet.configure("ip4-ipip", orders=[None, reversed_order])
        outage = fleet.kill(0)        # seconds until the router's route left member 0
"""

from __future__ import annotations

import abc
import contextlib
import json
import time
from collections.abc import Sequence
from types import TracebackType

from lab.dut.base import EVIDENCE_CHARS, Dut, LabLike
from lab.errors import LabError
from lab.poll import poll

ROUTE_DEADLINE_S = 20.0
ROUTER = "router"


def paths(lab: LabLike, vip: str) -> set[str]:
    """The router's interfaces its route to `vip` leaves by now (several: an ECMP route), next hops
    the kernel skips (dead, or linkdown under ignore_routes_with_linkdown) left out."""
    family = "-6" if ":" in vip else "-4"
    out = lab.run(ROUTER, ["ip", "-j", family, "route", "show", f"{vip}/{128 if ':' in vip else 32}"]).stdout
    found: set[str] = set()
    for route in json.loads(out or "[]"):
        hops = route.get("nexthops") or [route]
        found |= {h["dev"] for h in hops if "dev" in h and not {"dead", "linkdown"} & set(h.get("flags", []))}
    return found


def member_evidence(members: Sequence[tuple[str, str]]) -> str:
    """Each member's evidence under its link's name, cut to EVIDENCE_CHARS apiece: one member's long
    connection table must not push the next out of the report (the finding may be theirs together)."""
    return "\n".join(f"--- member {i} ({ifname}) ---\n{said[:EVIDENCE_CHARS]}"
                     for i, (ifname, said) in enumerate(members))


def evidence_limit(device: object) -> int:
    """What a finding's report keeps of a device's evidence: EVIDENCE_CHARS and a heading's room, a
    fleet's for each member (member_evidence's headings are under 80 characters: an ifname is at most 15)."""
    return len(getattr(device, "members", [device])) * (EVIDENCE_CHARS + 80)


class Fleet(abc.ABC):
    """`members` of one DUT kind behind the router's ECMP; each member's link is its path."""

    def __init__(self, lab: LabLike, members: Sequence[Dut]) -> None:
        self.lab = lab
        self.members = list(members)
        self._stack = contextlib.ExitStack()   # the members' stop()
        self._faults = contextlib.ExitStack()  # what kill() did, undone by stop() or the next configure()

    def __enter__(self) -> Fleet:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> None:
        try:
            for member in self.members:
                member.start()
                self._stack.callback(member.stop)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        try:
            self._faults.close()
            self._stack.close()
        finally:
            self._faults, self._stack = contextlib.ExitStack(), contextlib.ExitStack()

    @property
    def name(self) -> str:
        return self.members[0].name

    def vip(self, family: int = 4) -> str:
        return next(str(v.address) for v in self.lab.topology.vips if v.address.version == family)

    def member_paths(self) -> list[str]:
        """The router's interface towards each member (the router's side of its link)."""
        return [m.link().ifname for m in self.members]

    def wait_paths(self, want: set[str], what: str) -> float:
        """Poll until the router's route to the VIP leaves by exactly `want`; when (monotonic) it did."""
        vip = self.vip()
        got = poll(ROUTE_DEADLINE_S, lambda: paths(self.lab, vip), what, until=lambda p: p == want,
                   check=False, interval_s=0.005)
        if got != want:
            raise LabError(f"the router's route to {vip} leaves by {sorted(got)}, not {sorted(want)}, "
                           f"{ROUTE_DEADLINE_S:g} s on ({what})")
        return time.monotonic()

    def configure(self, encap_id: str, extra_ports: Sequence[tuple[int, str]] = (),
                  orders: Sequence[list[str] | None] = ()) -> None:
        """Every member serves the VIPs (member i told of the reals in `orders[i]`, by name if None),
        and the router's route to the VIP leaves by every member."""
        for i, member in enumerate(self.members):
            member.order = orders[i] if i < len(orders) else None
            self._revive(i)
            member.configure(encap_id, extra_ports=extra_ports)
        self._join()
        self.wait_paths(set(self.member_paths()), "the route using every member")

    def _revive(self, index: int) -> None:
        """Bring a member killed by an earlier check back (a fleet outlives its checks)."""
        self._faults.close()
        self._faults = contextlib.ExitStack()

    @abc.abstractmethod
    def _join(self) -> None:
        """Put every member into the router's ECMP route."""

    @abc.abstractmethod
    def withdraw(self, index: int) -> float:
        """Take member `index` out of the ECMP route as an operator would, the member still running;
        returns when (monotonic) the route left it."""

    @abc.abstractmethod
    def kill(self, index: int) -> float:
        """Member `index` dies without a word; returns the seconds until the router's route left it."""

    def forwarded(self, index: int) -> int:
        return sum(self.members[index].forwarded().values())

    def evidence(self) -> str:
        return member_evidence([(m.link().ifname, m.evidence()) for m in self.members])


class BgpFleet(Fleet):
    """Members in the LB nodes lb1, lb2 of topology multi-lb, announced by their nodes' bgpd (each
    member's `announce(present)`); a member dies silently: the router drops everything on its
    link, and BFD notices."""

    def _join(self) -> None:
        for member in self.members:
            member.announce(True)

    def withdraw(self, index: int) -> float:
        self.members[index].announce(False)
        rest = {p for i, p in enumerate(self.member_paths()) if i != index}
        return self.wait_paths(rest, f"the route leaving member {index} after its withdrawal")

    def kill(self, index: int) -> float:
        ifname = self.member_paths()[index]
        rules = [["INPUT", "-i", ifname], ["OUTPUT", "-o", ifname], ["FORWARD", "-i", ifname],
                 ["FORWARD", "-o", ifname]]
        died = time.monotonic()
        for rule in rules:
            self.lab.run(ROUTER, ["iptables", "-I", *rule, "-j", "DROP"])
            self._faults.callback(self.lab.run, ROUTER, ["iptables", "-D", *rule, "-j", "DROP"], check=False)
        rest = {p for i, p in enumerate(self.member_paths()) if i != index}
        return self.wait_paths(rest, f"BFD taking member {index} out of the route") - died


def lb_nodes(lab: LabLike, count: int) -> list[str]:
    """The first `count` LB nodes of the lab's topology (multi-lb: lb1, lb2)."""
    nodes = [n.name for n in lab.topology.nodes_with_role("lb")][:count]
    if len(nodes) < count:
        raise LabError(f"topology '{lab.topology.name}' has {len(nodes)} LB nodes; a fleet of {count} needs multi-lb")
    return nodes
