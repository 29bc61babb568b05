"""The device under test (DUT): any L4 load balancer that the conformance suites grade the same way.

A DUT balances a lab's VIP traffic to its reals by encapsulation and declares what it can do
(`Capability`); a test that needs a capability the DUT lacks is *not applicable*, never a pass.
Three DUTs live here: l4lab's own XDP balancer in the lab's LB node (`L4labDut`, through lbctl);
Linux IPVS in tunnel mode in a qemu VM that takes the LB node's place (`IpvsDut`, lab/dut/ipvs.py);
Katran built from the user's checkout, attached like l4lab (`KatranDut`, lab/dut/katran.py).

Example::

    dut = make_dut("ipvs", lab)
    with dut:
        dut.configure("ip4-gue0")
        before = dut.forwarded()
        ...
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import ipaddress
import json
import operator
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

from balancer import encaps
from lab.errors import LabError
from lab.lbconf import balancer_config, lb_link, real_addresses
from lab.poll import poll
from lab.topology import Topology

DUT_NAMES = ("l4lab", "ipvs", "katran")


class Capability(StrEnum):
    """What a DUT may or may not do; tests name the ones they need."""

    IPV6 = "ipv6"
    WEIGHTS = "weights"                      # reals receive new flows in proportion to weight
    CONSISTENT_HASHING = "consistent-hashing"  # removing a real moves only its own flows
    PMTU_GENERATION = "pmtu-generation"      # the LB answers too-big itself
    ICMP_STEERING = "icmp-steering"          # ICMP errors follow their flow to its real
    COUNTERS = "counters"                    # per-real or total forwarded-packet counters
    COUNTERS_PER_REASON = "counters-per-reason"  # every drop counted under a named reason
    HITLESS_RESTART = "hitless-restart"      # the control plane restarts without moving a flow
    HITLESS_UPGRADE = "hitless-upgrade"      # the datapath program is swapped under traffic on the same state
    CRASH_SAFE_APPLY = "crash-safe-apply"    # a control plane killed mid-update converges on the next apply
    OWNER_QUERY = "owner-query"              # asked which real a given flow hashes to, without sending it
    RING_READBACK = "ring-readback"          # the lookup table can be read back slot by slot
    SESSION_READBACK = "session-readback"    # the connection table can be read entry by entry, per flow
    SESSION_TABLE_OFF = "session-table-off"  # a VIP can do without connection state (hash only)
    OUTER_SOURCE_CHOICE = "outer-source-choice"  # the outer source is configured: fixed, or per flow in a prefix
    PACKET_TEST_RUN = "packet-test-run"      # the datapath runs on a synthetic packet without a wire
    MULTI_LB = "multi-lb"                    # several instances announce one VIP (BGP, BFD) with one ring
    NEXTHOP_FOLLOW = "nexthop-follow"        # finds its next hop's MAC itself and follows the router's changes
    SERVER_ID_ROUTING = "server-id-routing"  # a real's id in a QUIC connection id / TCP option picks the real
    SOURCE_PINNING = "source-pinning"        # client prefixes pinned to a real (longest prefix match)
    INLINE_DECAP = "inline-decap"            # tunnels addressed to the LB itself stripped and balanced
    TWO_ARM = "two-arm"                      # receives on one interface, sends what it encapsulates out of another
    BOND_VLAN = "bond-vlan"                  # balances 802.1Q-tagged traffic on a bond, keeping the tag


def encap_capability(encap_id: str) -> str:
    """The capability string of one encapsulation id (`encap:ip4-gue1`)."""
    return f"encap:{encap_id}"


class LabLike(Protocol):
    """What a DUT needs of a running lab (lab.harness.Lab and lab.state objects have it)."""

    name: str
    topology: Topology

    def python(self, node: str, module: str, *args: str, check: bool = True,
               timeout: float = 120.0) -> subprocess.CompletedProcess[str]: ...

    def write(self, node: str, path: str, text: str) -> None: ...

    def mac(self, node: str, ifname: str) -> str: ...

    def netns(self, node: str) -> str: ...


@dataclass(frozen=True)
class LbLink:
    """Where the DUT's traffic can be watched: the router's side of its link, and the DUT's MAC."""

    node: str
    ifname: str
    dut_mac: str


class Dut(abc.ABC):
    """A load balancer under test, attached to a running lab in place of (or in) its LB node."""

    name: str = ""
    capabilities: frozenset[str] = frozenset()

    def __init__(self, lab: LabLike, workdir: Path) -> None:
        self.lab = lab
        self.workdir = workdir
        self.encap_id: str | None = None
        self.weights: dict[str, int] = {}
        self.extra_ports: tuple[tuple[int, str], ...] = ()

    def __enter__(self) -> Dut:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def missing(self, needs: Iterable[str]) -> list[str]:
        """The capabilities of `needs` that this DUT lacks (empty: the test applies)."""
        return [n for n in needs if n not in self.capabilities]

    @property
    def family(self) -> int:
        if self.encap_id is None:
            raise LabError(f"DUT {self.name} is not configured: call configure(encap) first")
        return encaps.by_id(self.encap_id).vip_family

    def vips(self) -> list[str]:
        return sorted({str(v.address) for v in self.lab.topology.vips if v.address.version == self.family})

    def reals(self) -> dict[str, str]:
        """{real node: its address} in the configured family."""
        return real_addresses(self.lab.topology, self.family)

    @abc.abstractmethod
    def start(self) -> None:
        """Attach to the lab (load the program, boot the VM); undo everything on failure."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Detach and remove everything start() made; safe to repeat."""

    @abc.abstractmethod
    def configure(self, encap_id: str, weights: Mapping[str, int] | None = None,
                  extra_ports: Sequence[tuple[int, str]] = ()) -> None:
        """Serve the topology's VIPs of `encap_id`'s family with every real (weight 1 unless given),
        on their ports and on `extra_ports` ((port, proto) pairs) too."""

    @abc.abstractmethod
    def set_weight(self, real: str, weight: int) -> None:
        """Change one real's weight; 0 drains it (no new flows, existing ones go on)."""

    @abc.abstractmethod
    def remove_real(self, real: str) -> None:
        """Take `real` out of every VIP."""

    @abc.abstractmethod
    def add_real(self, real: str, weight: int = 1) -> None:
        """Put `real` (back) into every VIP."""

    @abc.abstractmethod
    def forwarded(self) -> dict[str, int]:
        """Packets the DUT encapsulated so far, per real node (its own counters)."""

    @abc.abstractmethod
    def link(self) -> LbLink:
        """The router's side of the DUT's link, for captures."""

    def settle(self) -> None:
        """Wait until the DUT has forgotten idle flows that a change should now place anew (its
        connection table, where it keeps one apart from the hash); l4lab's sessions are the
        behaviour under test, so it has nothing to wait for."""
        return None

    def evidence(self) -> str:
        """What the DUT says about itself, for a failing test's report."""
        return ""


class L4labDut(Dut):
    """l4lab's XDP balancer, loaded by lbctl in the lab's `lb` node (native XDP on its link)."""

    name = "l4lab"
    capabilities = frozenset({
        *(encap_capability(e) for e in encaps.SAME_FAMILY), Capability.IPV6, Capability.WEIGHTS,
        Capability.CONSISTENT_HASHING, Capability.PMTU_GENERATION, Capability.ICMP_STEERING,
        Capability.COUNTERS, Capability.COUNTERS_PER_REASON, Capability.HITLESS_RESTART,
        Capability.HITLESS_UPGRADE, Capability.CRASH_SAFE_APPLY, Capability.OWNER_QUERY,
        Capability.RING_READBACK, Capability.SESSION_READBACK, Capability.SESSION_TABLE_OFF,
        Capability.OUTER_SOURCE_CHOICE, Capability.PACKET_TEST_RUN, Capability.MULTI_LB,
        Capability.NEXTHOP_FOLLOW,
        Capability.SERVER_ID_ROUTING, Capability.SOURCE_PINNING, Capability.INLINE_DECAP,
        Capability.TWO_ARM, Capability.BOND_VLAN,
    })
    node = "lb"

    def __init__(self, lab: LabLike, workdir: Path) -> None:
        super().__init__(lab, workdir)
        self._loaded = False

    @property
    def instance(self) -> str:
        return f"{self.lab.name}-{self.node}"

    def lbctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.lab.python(self.node, "balancer.cli", "--instance", self.instance, *args, check=check)

    def start(self) -> None:
        self._loaded = False

    def stop(self) -> None:
        if self._loaded:
            self.lbctl("unload", check=False)
            self._loaded = False

    def _write(self) -> str:
        from balancer import config as cfg

        assert self.encap_id is not None
        case = encaps.by_id(self.encap_id)
        fam, mode = case.vip_family, case.config_name
        # A --target lab names the LB's interface and its next hop's MAC (its peer is no local netns).
        overrides = self.lab.link_overrides(self.node) if hasattr(self.lab, "link_overrides") else {}
        config = balancer_config(self.lab.topology, self.lab.name, encaps={fam: mode}, lb=self.node,
                                 weights=self.weights, reals=set(self.weights), **overrides)
        first = {v.address: v for v in reversed(config.vips)}
        extra = tuple(dataclasses.replace(v, port=port, proto=proto)  # type: ignore[arg-type]
                      for v in first.values() for port, proto in self.extra_ports)
        config = dataclasses.replace(config, vips=config.vips + extra)
        path = self.workdir / f"{self.instance}.toml"
        self.workdir.mkdir(parents=True, exist_ok=True)
        path.write_text(cfg.dump(config))
        # On a --target host the node reads its config from its own /tmp (as suites.conftest.Balancer).
        where = f"/tmp/{self.instance}.toml" if getattr(self.lab, "target", None) is not None else str(path)
        self.lab.write(self.node, where, path.read_text())
        return where

    def configure(self, encap_id: str, weights: Mapping[str, int] | None = None,
                  extra_ports: Sequence[tuple[int, str]] = ()) -> None:
        self.encap_id = encap_id
        self.weights = {n: 1 for n in self.reals()} | dict(weights or {})
        self.extra_ports = tuple(extra_ports)
        path = self._write()
        if not self._loaded:
            ifname = lb_link(self.lab.topology, self.node)[0]
            if hasattr(self.lab, "ifname"):  # a --target host's name for the topology's interface
                ifname = self.lab.ifname(self.node, ifname)
            self.lbctl("load", "--interface", ifname, "--mode", "native", "--config", path)
            self._loaded = True
        else:
            self.lbctl("apply", path)

    def set_weight(self, real: str, weight: int) -> None:
        self.weights[real] = weight
        self.lbctl("apply", self._write())

    def remove_real(self, real: str) -> None:
        self.weights.pop(real, None)
        self.lbctl("apply", self._write())

    def add_real(self, real: str, weight: int = 1) -> None:
        self.weights[real] = weight
        self.lbctl("apply", self._write())

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.lbctl("stats", "--json").stdout)
        return result

    def forwarded(self) -> dict[str, int]:
        by_addr = {a: n for n, a in self.reals().items()}
        out = {n: 0 for n in self.reals()}
        for addr, real in self.stats().get("reals", {}).items():
            node = by_addr.get(addr)
            if node is not None:
                out[node] += int(real["packets"])
        return out

    def link(self) -> LbLink:
        lb_if, router, router_if = lb_link(self.lab.topology, self.node)
        return LbLink(router, router_if, self.lab.mac(self.node, lb_if).lower())

    def evidence(self) -> str:
        try:
            return json.dumps(self.stats().get("reasons", {}), indent=1)[:4000]
        # AssertionError: a lab's command that exited non-zero (lab.harness); the report must not die on it
        except (LabError, AssertionError, subprocess.CalledProcessError, json.JSONDecodeError) as exc:
            return f"lbctl stats failed: {exc}"


# The IPVS VM's own link: a /29 and a /64 beside the router, outside every topology's prefixes.
IPVS_NET4 = ipaddress.ip_network("198.51.100.32/29")
IPVS_NET6 = ipaddress.ip_network("2001:db8:1c::/64")


class IpvsDut(Dut):
    """Linux IPVS (tunnel mode, Maglev scheduler `mh` hashing ports too) in a VM beside the router.

    The VM's tap sits in the router's namespace on its own subnet, and the router's VIP routes
    are pointed at the VM while it runs (and restored after), so the lab's LB node stands idle.
    """

    name = "ipvs"
    # GUE in IPVS is variant 0 (a 4-byte header) only; its IPv6 form carries proto 41, not an id we name.
    capabilities = frozenset({
        encap_capability(encaps.IP4_IPIP), encap_capability(encaps.IP4_GUE0), encap_capability(encaps.IP6_IP6IP6),
        Capability.IPV6, Capability.WEIGHTS, Capability.CONSISTENT_HASHING, Capability.PMTU_GENERATION,
        Capability.ICMP_STEERING, Capability.COUNTERS,
    })
    router = "router"
    tap = "vm-ipvs"

    def __init__(self, lab: LabLike, workdir: Path, scheduler: str = "mh",
                 flags: tuple[str, ...] = ("mh-port",)) -> None:
        super().__init__(lab, workdir)
        self.scheduler = scheduler
        self.flags = flags
        self.capabilities = self.with_scheduler(scheduler)
        self.vm: Any = None
        self._stack = contextlib.ExitStack()
        self._services: list[Any] = []

    @classmethod
    def with_scheduler(cls, scheduler: str) -> frozenset[str]:
        """What IPVS can do with `scheduler`: rr ignores weights; rr and wrr place flows by turn,
        so removing a real moves others too."""
        lacks = {"rr": {Capability.WEIGHTS, Capability.CONSISTENT_HASHING},
                 "wrr": {Capability.CONSISTENT_HASHING}}.get(scheduler, set())
        return frozenset(cls.capabilities - lacks)

    def start(self) -> None:
        from lab.dut.ipvs import IpvsLb

        hosts4 = list(IPVS_NET4.hosts())
        gw4, addr4 = str(hosts4[0]), str(hosts4[1])
        gw6, addr6 = str(IPVS_NET6[1]), str(IPVS_NET6[2])
        all_vips = sorted({str(v.address) for v in self.lab.topology.vips})
        try:
            self.vm = IpvsLb(f"{self.lab.name}-ipvs", netns=self.lab.netns(self.router), addr=addr4,
                             prefix=IPVS_NET4.prefixlen, gateway=gw4, vips=all_vips, tap=self.tap,
                             addr6=addr6, prefix6=IPVS_NET6.prefixlen, gateway6=gw6)
            self.vm.start()
            self._stack.callback(self.vm.stop)
            self._steer_vips(addr4, addr6)
        except BaseException:
            self.stop()
            raise

    def _steer_vips(self, addr4: str, addr6: str) -> None:
        """Point the router's VIP routes at the VM; restore the topology's routes on stop()."""
        ns = self.lab.netns(self.router)
        for vip in self.lab.topology.vips:
            v = vip.address
            dst = f"{v}/{v.max_prefixlen}"
            via = addr4 if v.version == 4 else addr6
            old = subprocess.run(["ip", "-n", ns, "-j", f"-{v.version}", "route", "show", dst],
                                 capture_output=True, text=True, check=True).stdout
            previous = json.loads(old or "[]")
            _ip(ns, f"-{v.version}", "route", "replace", dst, "via", via)
            if previous and previous[0].get("gateway"):
                self._stack.callback(_ip, ns, f"-{v.version}", "route", "replace", dst, "via",
                                     previous[0]["gateway"])
            else:
                self._stack.callback(_ip, ns, f"-{v.version}", "route", "del", dst)

    def stop(self) -> None:
        try:
            self._stack.close()
        finally:
            self._stack = contextlib.ExitStack()
            self.vm = None

    def _service_list(self) -> list[Any]:
        from lab.dut.ipvs import Service

        out = []
        for vip in self.lab.topology.vips:
            if vip.address.version != self.family:
                continue
            for port, proto in [(p.port, p.proto) for p in vip.ports] + list(self.extra_ports):
                out.append(Service(str(vip.address), port, proto, self.scheduler, self.flags))
        return out

    def _tunnel(self) -> str:
        assert self.encap_id is not None
        return "gue" if encaps.by_id(self.encap_id).gue else "ipip"

    def configure(self, encap_id: str, weights: Mapping[str, int] | None = None,
                  extra_ports: Sequence[tuple[int, str]] = ()) -> None:
        missing = self.missing([encap_capability(encap_id)])
        if missing:
            raise LabError(f"DUT ipvs cannot encapsulate as {encap_id}: it lacks {missing[0]}")
        self.encap_id = encap_id
        self.weights = {n: 1 for n in self.reals()} | dict(weights or {})
        self.extra_ports = tuple(extra_ports)
        self.vm.clear()
        # Short connection timeouts (TCP, TCP after FIN, UDP): tests send the same tuples again.
        self.vm.ipvsadm("--set", "5", "2", "2")
        self._services = self._service_list()
        for svc in self._services:
            self.vm.add_service(svc)
            for node, weight in self.weights.items():
                self.vm.add_real(svc, self.reals()[node], weight=weight, tunnel=self._tunnel())

    def set_weight(self, real: str, weight: int) -> None:
        self.weights[real] = weight
        for svc in self._services:
            self.vm.edit_real(svc, self.reals()[real], weight=weight, tunnel=self._tunnel())

    def remove_real(self, real: str) -> None:
        self.weights.pop(real, None)
        for svc in self._services:
            self.vm.delete_real(svc, self.reals()[real])

    def add_real(self, real: str, weight: int = 1) -> None:
        self.weights[real] = weight
        for svc in self._services:
            self.vm.add_real(svc, self.reals()[real], weight=weight, tunnel=self._tunnel())

    def forwarded(self) -> dict[str, int]:
        by_addr = {a: n for n, a in self.reals().items()}
        out = {n: 0 for n in self.reals()}
        for svc in self.vm.stats().values():
            for addr, st in svc.reals.items():
                if addr in by_addr:
                    out[by_addr[addr]] += st.in_pkts
        return out

    def link(self) -> LbLink:
        return LbLink(self.router, self.tap, self.vm.mac.lower())

    def settle(self, deadline_s: float = 20.0) -> None:
        """Wait until IPVS's UDP connection entries expired (it keeps using them after a change)."""
        udp = poll(deadline_s, lambda: [c for c in self.vm.connections() if c["proto"] == "udp"],
                   "IPVS's UDP connection entries expired", until=operator.not_, check=False, interval_s=0.5)
        if udp:
            raise LabError(f"IPVS kept UDP connection entries for {deadline_s:g} s: {udp[:3]}")

    def evidence(self) -> str:
        try:
            return str(self.vm.ipvsadm("-Ln", "--stats", "--exact")) + "\n" + str(self.vm.ipvsadm("-Lnc"))
        except LabError as exc:
            return f"ipvsadm failed: {exc}"


class KatranDut(Dut):
    """Katran's XDP balancer built from the user's checkout ($L4LAB_KATRAN_SRC, lab/dut/katran.py), in
    native XDP on the lab's LB link like l4lab; its maps programmed by our code, its ring our Maglev
    ring for the same reals (Katran's own control plane is C++ and not part of its BPF program).

    The default build encapsulates IPIP (4in4, 6in6); the GUE build (variant 1) is loaded when a
    GUE encap is configured. Neither build answers too-big (ICMP_TOOBIG_GENERATION is off by default).
    """

    name = "katran"
    capabilities = frozenset({
        encap_capability(encaps.IP4_IPIP), encap_capability(encaps.IP6_IP6IP6), encap_capability(encaps.IP4_GUE1),
        encap_capability(encaps.IP6_GUE1), Capability.IPV6, Capability.WEIGHTS, Capability.CONSISTENT_HASHING,
        Capability.ICMP_STEERING, Capability.COUNTERS,
    })
    node = "lb"

    def __init__(self, lab: LabLike, workdir: Path) -> None:
        from lab.dut import katran

        super().__init__(lab, workdir)
        self.checkout = katran.Checkout.find(None)
        self.objects: dict[str, Path] = {}
        self.katran: Any = None
        self.flavour: str | None = None
        self._vips: list[tuple[str, int, int]] = []
        self._index: dict[str, int] = {}

    def start(self) -> None:
        from lab.dut import katran

        for flavour in katran.FLAVOURS:
            self.objects[flavour] = katran.build(self.checkout, flavour)

    def stop(self) -> None:
        if self.katran is not None:
            self.katran.close()
            self.katran = None
            self.flavour = None

    def _load(self, flavour: str, vips: int) -> None:
        from lab.dut import katran
        from lab.nsexec import entered

        self.stop()
        kt = katran.Katran(self.objects[flavour], lru_size=1 << 16, vips=vips).load()
        try:
            lb_if, router, router_if = lb_link(self.lab.topology, self.node)
            with entered(self.lab.netns(self.node)):
                kt.attach(lb_if, "native")
            kt.set_router_mac(self.lab.mac(router, router_if))
            if flavour == "gue":
                lb_addrs = [a for link in self.lab.topology.links for ep in link.endpoints
                            if ep.node == self.node for a in ep.addresses]
                src4 = next(str(a.ip) for a in lb_addrs if a.version == 4)
                src6 = next((str(a.ip) for a in lb_addrs if a.version == 6), None)
                kt.set_sources(src4, src6)
        except BaseException:
            kt.close()
            raise
        self.katran, self.flavour = kt, flavour

    def configure(self, encap_id: str, weights: Mapping[str, int] | None = None,
                  extra_ports: Sequence[tuple[int, str]] = ()) -> None:
        missing = self.missing([encap_capability(encap_id)])
        if missing:
            raise LabError(f"DUT katran cannot encapsulate as {encap_id}: it lacks {missing[0]}")
        self.encap_id = encap_id
        self.weights = {n: 1 for n in self.reals()} | dict(weights or {})
        self.extra_ports = tuple(extra_ports)
        protos = {"tcp": 6, "udp": 17}
        vips = [(str(v.address), port, protos[proto]) for v in self.lab.topology.vips
                if v.address.version == self.family
                for port, proto in [(p.port, p.proto) for p in v.ports] + list(self.extra_ports)]
        flavour = "gue" if encaps.by_id(encap_id).gue else "ipip"
        # Load afresh for every configuration: sessions and VIP numbers start clean, as after a restart.
        self._load(flavour, len(vips))
        self._index = {n: i + 1 for i, n in enumerate(sorted(self.reals()))}
        for node, index in self._index.items():
            self.katran.add_real(index, self.reals()[node])
        self._vips = vips
        for num, (addr, port, proto) in enumerate(vips):
            self.katran.add_vip(addr, port, proto, num)
        self._write_rings()

    def _write_rings(self) -> None:
        from balancer import maglev
        from lab.dut import katran

        members = {self._index[n]: (self.reals()[n], w) for n, w in self.weights.items()}
        ring = list(maglev.build_ring(members, katran.RING_SIZE))
        for num in range(len(self._vips)):
            self.katran.set_ring(num, ring)

    def set_weight(self, real: str, weight: int) -> None:
        self.weights[real] = weight
        self._write_rings()

    def remove_real(self, real: str) -> None:
        self.weights.pop(real, None)
        self._write_rings()

    def add_real(self, real: str, weight: int = 1) -> None:
        self.weights[real] = weight
        self._write_rings()

    def forwarded(self) -> dict[str, int]:
        return {n: self.katran.real_counter(i)[0] for n, i in self._index.items()}

    def link(self) -> LbLink:
        lb_if, router, router_if = lb_link(self.lab.topology, self.node)
        return LbLink(router, router_if, self.lab.mac(self.node, lb_if).lower())

    def evidence(self) -> str:
        if self.katran is None:
            return "katran is not loaded"
        return json.dumps({"flavour": self.flavour, "counters": self.katran.counters(),
                           "per_real": self.forwarded()}, indent=1)


def _ip(ns: str, *args: str) -> None:
    subprocess.run(["ip", "-n", ns, *args], capture_output=True, text=True, check=True)


def capabilities_of(name: str, ipvs_scheduler: str = "mh:mh-port") -> frozenset[str]:
    """What the DUT called `name` declares, without attaching it (for deciding applicability up front)."""
    if name == "l4lab":
        return L4labDut.capabilities
    if name == "ipvs":
        return IpvsDut.with_scheduler(ipvs_scheduler.partition(":")[0])
    if name == "katran":
        return KatranDut.capabilities
    raise LabError(f"unknown DUT {name!r}: choose one of {', '.join(DUT_NAMES)}")


def make_dut(name: str, lab: LabLike, workdir: Path, ipvs_scheduler: str = "mh:mh-port") -> Dut:
    """The DUT called `name` (one of DUT_NAMES) for `lab`; `ipvs_scheduler` is SCHEDULER[:FLAG,...]."""
    if name == "l4lab":
        return L4labDut(lab, workdir)
    if name == "ipvs":
        scheduler, _, flags = ipvs_scheduler.partition(":")
        return IpvsDut(lab, workdir, scheduler, tuple(f for f in flags.split(",") if f))
    if name == "katran":
        return KatranDut(lab, workdir)
    raise LabError(f"unknown DUT {name!r}: choose one of {', '.join(DUT_NAMES)}")
