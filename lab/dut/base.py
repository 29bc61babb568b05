"""base.py: what every device under test (DUT) is: the `Dut` interface, its capabilities and its link.

A DUT balances a lab's VIP traffic to its reals by encapsulation. The conformance checks grade it
from the outside (the wire, the reals, the client's connections) through this interface only; what
a DUT can do is its *spec* (lab/dut/spec.py: every capability but those its data file lists as not
applicable, each with a reference into that LB's own documentation or source).

Capabilities come in two kinds. `FEATURES` are behaviours of a load balancer that a check may need
(weights, PMTU answers, health checks, ...): a DUT without one is "not applicable" in that check,
citing its reference. The others are l4lab's own internals (ring readback, per-reason counters,
BPF test runs): only l4lab's extra checks use them, and those checks are not part of the matrix.
"""

from __future__ import annotations

import abc
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Protocol

from balancer import encaps
from lab.errors import LabError
from lab.lbconf import real_addresses
from lab.topology import Topology

if TYPE_CHECKING:
    from lab.dut.fleet import Fleet
    from lab.dut.spec import DutSpec


# What a finding's report keeps of one device's evidence (a fleet keeps this much of each member's).
EVIDENCE_CHARS = 2500

class Capability(StrEnum):
    """What a DUT may or may not do; checks name the ones they need (`needs` marker)."""

    IPV6 = "ipv6"
    WEIGHTS = "weights"                      # reals receive new flows in proportion to weight; 0 drains
    CONSISTENT_HASHING = "consistent-hashing"  # removing a real moves only its own flows
    PMTU_GENERATION = "pmtu-generation"      # the LB answers too-big itself
    ICMP_STEERING = "icmp-steering"          # ICMP errors follow their flow to its real
    COUNTERS = "counters"                    # per-real forwarded-packet counters
    HITLESS_RESTART = "hitless-restart"      # the control plane restarts without moving a flow
    MULTI_LB = "multi-lb"                    # several instances behind ECMP give a flow the same real
    HEALTH_CHECKS = "health-checks"          # the LB probes its reals, drains a failed one, restores it
    # l4lab's internals: its extra checks (outside the matrix) need them
    COUNTERS_PER_REASON = "counters-per-reason"  # every drop counted under a named reason
    HITLESS_UPGRADE = "hitless-upgrade"      # the datapath program is swapped under traffic on the same state
    CRASH_SAFE_APPLY = "crash-safe-apply"    # a control plane killed mid-update converges on the next apply
    OWNER_QUERY = "owner-query"              # asked which real a given flow hashes to, without sending it
    RING_READBACK = "ring-readback"          # the lookup table can be read back slot by slot
    SESSION_READBACK = "session-readback"    # the connection table can be read entry by entry, per flow
    SESSION_TABLE_OFF = "session-table-off"  # a VIP can do without connection state (hash only)
    OUTER_SOURCE_CHOICE = "outer-source-choice"  # the outer source is configured: fixed, or per flow in a prefix
    PACKET_TEST_RUN = "packet-test-run"      # the datapath runs on a synthetic packet without a wire
    NEXTHOP_FOLLOW = "nexthop-follow"        # finds its next hop's MAC itself and follows the router's changes
    SERVER_ID_ROUTING = "server-id-routing"  # a real's id in a QUIC connection id / TCP option picks the real
    SOURCE_PINNING = "source-pinning"        # client prefixes pinned to a real (longest prefix match)
    INLINE_DECAP = "inline-decap"            # tunnels addressed to the LB itself stripped and balanced
    CIDR_VIPS = "cidr-vips"                  # a VIP that is a prefix: every address in it served by one ring
    UDP_FLOW_MIGRATION = "udp-flow-migration"  # UDP flows leave a real health checks took down; TCP stays
    TWO_ARM = "two-arm"                      # receives on one interface, sends what it encapsulates out of another
    BOND_VLAN = "bond-vlan"                  # balances 802.1Q-tagged traffic on a bond, keeping the tag


def encap_capability(encap_id: str) -> str:
    """The capability string of one encapsulation id (`encap:ip4-gue1`)."""
    return f"encap:{encap_id}"


ENCAP_CAPABILITIES = frozenset(encap_capability(e) for e in encaps.SAME_FAMILY)
FEATURES = frozenset({Capability.IPV6, Capability.WEIGHTS, Capability.CONSISTENT_HASHING,
                      Capability.PMTU_GENERATION, Capability.ICMP_STEERING, Capability.COUNTERS,
                      Capability.HITLESS_RESTART, Capability.MULTI_LB, Capability.HEALTH_CHECKS})
# What a DUT may be graded on in the matrix: the features and the encapsulations.
GRADED = FEATURES | ENCAP_CAPABILITIES


class LabLike(Protocol):
    """What a DUT needs of a running lab (lab.harness.Lab and lab.state objects have it)."""

    name: str
    topology: Topology

    def python(self, node: str, module: str, *args: str, check: bool = True,
               timeout: float = 120.0) -> subprocess.CompletedProcess[str]: ...

    def run(self, node: str, argv: list[str] | tuple[str, ...], *, check: bool = True, timeout: float = 60.0,
            input: str | None = None) -> subprocess.CompletedProcess[str]: ...

    def python_argv(self, node: str, module: str, *args: str) -> list[str]: ...

    def write(self, node: str, path: str, text: str) -> None: ...

    def mac(self, node: str, ifname: str) -> str: ...

    def netns(self, node: str) -> str: ...


@dataclass(frozen=True)
class LbLink:
    """Where the DUT's traffic can be watched: the router's side of its link, and the DUT's MAC."""

    node: str
    ifname: str
    dut_mac: str


@dataclass(frozen=True)
class HealthCheck:
    """How the DUT's own health checks probe each real: `kind` tcp (connect) or http (GET / answers
    2xx), on the real's own address at `port`; `fall` failures drain a real, `rise` successes restore it."""

    port: int
    kind: str = "http"
    interval_s: float = 0.5
    timeout_s: float = 0.4
    fall: int = 2
    rise: int = 2


class Dut(abc.ABC):
    """A load balancer under test, attached to a running lab in place of (or in) its LB node."""

    name: str = ""
    # How long the DUT's counters may lag its packets (IPVS sums them every 2 s).
    counter_lag_s: float = 0.0

    def __init__(self, lab: LabLike, workdir: Path, options: Mapping[str, str] | None = None) -> None:
        self.lab = lab
        self.workdir = workdir
        self.options = dict(options or {})
        self.encap_id: str | None = None
        self.weights: dict[str, int] = {}
        self.extra_ports: tuple[tuple[int, str], ...] = ()
        self.healthcheck: HealthCheck | None = None
        # The reals in the order the DUT is told about them (None: by name); a check may reverse it.
        self.order: list[str] | None = None
        # What the running check needs (set before it configures): a DUT may build for it (Katran).
        self.wanted: frozenset[str] = frozenset()
        self.capabilities = self.capabilities_for(self.options)

    # -- what it is ------------------------------------------------------------------------

    @classmethod
    def spec(cls) -> DutSpec:
        """Its data file (lab/dut/<name>.toml): deviations and what it lacks, with references."""
        from lab.dut.spec import DutSpec  # spec.py imports this module: at the top the two would import each other

        return DutSpec.load(cls.name)

    @classmethod
    def capabilities_for(cls, options: Mapping[str, str]) -> frozenset[str]:
        """What the DUT can do when run with `options` (--ipvs-control and the like)."""
        return cls.spec().capabilities(cls.variant(options))

    @classmethod
    def variant(cls, options: Mapping[str, str]) -> str:
        """The spec variant the DUT runs as with `options` (its data file's n/a entries may hold for
        one variant only: IPVS driven by plain ipvsadm has no health checks); "" by default."""
        return ""

    def missing(self, needs: Iterable[str]) -> list[str]:
        """The capabilities of `needs` that this DUT lacks (empty: the check applies)."""
        return [n for n in needs if n not in self.capabilities]

    def build_info(self) -> str:
        """What exactly runs (version, build flags), for the conformance report."""
        return self.spec().product

    def __enter__(self) -> Dut:
        self.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

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

    def ordered(self, nodes: Iterable[str]) -> list[str]:
        """`nodes` in the order the DUT is told about them (`order`, else by name)."""
        wanted = set(nodes)
        return [n for n in (self.order or sorted(wanted)) if n in wanted]

    def _remember(self, encap_id: str, weights: Mapping[str, int] | None, extra_ports: Sequence[tuple[int, str]],
                  healthcheck: HealthCheck | None) -> None:
        """Record what configure() was asked, refusing an encapsulation the DUT lacks."""
        missing = self.missing([encap_capability(encap_id)])
        if missing:
            raise LabError(f"DUT {self.name} cannot encapsulate as {encap_id}: it lacks {missing[0]}")
        self.encap_id = encap_id
        self.weights = {n: 1 for n in self.reals()} | dict(weights or {})
        self.extra_ports = tuple(extra_ports)
        self.healthcheck = healthcheck

    # -- what it does -----------------------------------------------------------------------

    @abc.abstractmethod
    def start(self) -> None:
        """Attach to the lab (load the program, boot the VM); undo everything on failure."""

    @abc.abstractmethod
    def stop(self) -> None:
        """Detach and remove everything start() made; safe to repeat."""

    @abc.abstractmethod
    def configure(self, encap_id: str, weights: Mapping[str, int] | None = None,
                  extra_ports: Sequence[tuple[int, str]] = (), healthcheck: HealthCheck | None = None) -> None:
        """Serve the topology's VIPs of `encap_id`'s family with every real (weight 1 unless given),
        on their ports and on `extra_ports` ((port, proto) pairs) too; probe the reals when
        `healthcheck` says how (a DUT without health checks refuses it)."""

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
        """Packets the DUT sent to each real node so far, by its own counters."""

    @abc.abstractmethod
    def link(self) -> LbLink:
        """The router's side of the DUT's link, for captures."""

    def restart_control_plane(self, how: str = "crash") -> float:
        """Restart the DUT's control plane, the datapath left alone: `crash` kills it (SIGKILL),
        `graceful` stops it as an operator would; then it starts again. Returns the seconds it was
        down. Only a DUT with HITLESS_RESTART implements it."""
        raise LabError(f"DUT {self.name} has no control plane to restart (it lacks {Capability.HITLESS_RESTART})")

    @classmethod
    def fleet(cls, lab: LabLike, workdir: Path, options: Mapping[str, str], count: int = 2) -> Fleet:
        """`count` instances of this DUT behind the router's ECMP (topology multi-lb), for the
        multi-LB checks: one per LB node by default, announced by that node's bgpd."""
        # fleet.py imports this module: at the top the two would import each other
        from lab.dut.fleet import BgpFleet, lb_nodes

        return BgpFleet(lab, [cls(lab, workdir / node, options, node=node)  # type: ignore[call-arg]
                              for node in lb_nodes(lab, count)])

    def announce(self, present: bool) -> None:
        """A fleet member's VIPs in (or out of) its LB node's BGP announcements."""
        raise LabError(f"DUT {self.name} cannot be a member of a BGP fleet")

    def settle(self, port: int | None = None) -> None:
        """Wait until the DUT has forgotten the closed flows to `port` (every port: None), so that the
        same 5-tuple sent again is a new flow to it (a connection table apart from the hash expires
        its entries); l4lab and Katran send every TCP SYN to the hash, so they have nothing to wait for."""
        return None

    def evidence(self) -> str:
        """What the DUT says about itself, for a finding's report."""
        return ""
