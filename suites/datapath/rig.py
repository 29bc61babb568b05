"""rig.py: the balancer and decap programs driven by BPF_PROG_TEST_RUN, as the packet tables use them.

Every test run goes through `RunBalancer.run`, which returns the verdict, the output frame and the one
reason counter (lb_counts) that the packet moved (asserting that exactly one moved), so tables can share a
loaded program: counters are compared as deltas. (A balancer loaded by lbctl in a lab is another thing:
lab.harness.LabBalancer.)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from scapy.packet import Packet

from balancer import _abi
from balancer.datapath import Datapath

from . import packets as P

ROOT = Path(__file__).resolve().parents[2]
# L4LAB_DATAPATH_OBJECTS: another directory of balancer.o / decap.o to test (e.g. an older build,
# to see a new table row fail before its change).
OBJ_DIR = Path(os.environ.get("L4LAB_DATAPATH_OBJECTS") or ROOT / "build" / "bpf")
BALANCER_OBJ = OBJ_DIR / "balancer.o"
DECAP_OBJ = OBJ_DIR / "decap.o"
RING_SIZE = 13  # a small prime keeps ring writes instant; Maglev's size does not matter here
XDP_VERDICTS = {0: "XDP_ABORTED", 1: "XDP_DROP", 2: "XDP_PASS", 3: "XDP_TX", 4: "XDP_REDIRECT"}
TC_VERDICTS = {-1: "TC_ACT_UNSPEC", 0: "TC_ACT_OK", 2: "TC_ACT_SHOT", 7: "TC_ACT_REDIRECT"}


def require_datapath() -> None:
    if os.geteuid() != 0:
        pytest.skip("BPF_PROG_TEST_RUN needs root (CAP_BPF and CAP_NET_ADMIN)")
    missing = [str(p) for p in (BALANCER_OBJ, DECAP_OBJ) if not p.exists()]
    if missing:
        pytest.fail(f"datapath objects {missing} are missing: run `make bpf` first")


def frame_bytes(frame: Packet | bytes) -> bytes:
    return frame if isinstance(frame, bytes) else bytes(frame)


@dataclass(frozen=True)
class Outcome:
    """What one test run did: verdict name, output frame, the reason counted, event deltas."""

    verdict: str
    out: bytes
    reason: str
    events: dict[str, int] = field(default_factory=dict)


class RunBalancer:
    """A loaded balancer with helpers that program VIPs the way the controller does."""

    def __init__(self, dp: Datapath) -> None:
        self.dp = dp
        self.next_real_id = 1
        self.real_ids: dict[str, int] = {}

    def settings(self, **overrides: object) -> None:
        args: dict[str, object] = {"nexthop_mac": P.ROUTER_MAC, "src4": P.SRC4 + "/32",
                                   "src6": P.SRC6 + "/128", "gue_port": P.GUE_PORT, "mtu": P.MTU}
        args.update(overrides)
        self.dp.set_settings(**args)

    def real_id(self, address: str) -> int:
        if address not in self.real_ids:
            self.real_ids[address] = self.next_real_id
            self.dp.put_real(self.next_real_id, address)
            self.next_real_id += 1
        return self.real_ids[address]

    def vip(self, address: str, port: int, proto: str, vip_num: int, reals: tuple[str, ...] | list[str],
            mode: str = "IPIP", flags: int = 0) -> None:
        """Put a VIP, its address-only entry and a ring cycling over `reals` (empty: no ring)."""
        self.dp.put_vip(address, port, proto, vip_num=vip_num, flags=flags, encap=_abi.Encap[mode])
        self.dp.put_vip(address, 0, _abi.VipMatch.ADDR_ONLY, vip_num=vip_num, encap=_abi.Encap[mode])
        self.ring(vip_num, reals)

    def ring(self, vip_num: int, reals: tuple[str, ...] | list[str]) -> None:
        ids = [self.real_id(r) for r in reals]
        size = self.dp.ring_size
        self.dp.write_ring(vip_num, [ids[i % len(ids)] for i in range(size)] if ids else [0] * size)

    def run(self, frame: Packet | bytes, frags: bool = False) -> Outcome:
        before, ev_before = self.dp.reasons(), self.dp.events()
        action, out = self.dp.run(frame_bytes(frame), frags=frags)
        after, ev_after = self.dp.reasons(), self.dp.events()
        moved = {k: after[k] - before[k] for k in after if after[k] != before[k]}
        assert sum(moved.values()) == 1 and len(moved) == 1, f"one reason per packet, got {moved}"
        events = {k: ev_after[k] - ev_before[k] for k in ev_after if ev_after[k] != ev_before[k]}
        return Outcome(XDP_VERDICTS.get(action, str(action)), out, next(iter(moved)), events)


def standard_world(b: RunBalancer) -> None:
    """The VIPs every table assumes: one per encap mode (TCP 80), plus UDP 443 on VIP4."""
    for num, case in enumerate(P.ENCAPS):
        b.vip(case.vip, P.VIP_PORT, "tcp", num, case.reals, case.mode)
    b.vip(P.VIP4, P.VIP_UDP_PORT, "udp", len(P.ENCAPS), P.REALS4)


BalancerFactory = Callable[..., RunBalancer]
