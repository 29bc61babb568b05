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
from typing import TypeVar

import pytest
from scapy.packet import Packet

from balancer import _abi
from balancer.datapath import Datapath
from balancer.decap import Decap
from balancer.libbpf import MapType

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
Loaded = Datapath | Decap
L = TypeVar("L", Datapath, Decap)
_PoolKey = tuple[str, str, tuple[tuple[str, object], ...]]

# What a fresh load holds in each kind of map: hashes are empty, arrays (per-CPU too) are zeros.
_EMPTY_AT_LOAD = {MapType.HASH, MapType.PERCPU_HASH, MapType.LRU_HASH, MapType.LRU_PERCPU_HASH, MapType.LPM_TRIE}
_ZERO_AT_LOAD = {MapType.ARRAY, MapType.PERCPU_ARRAY}
_FILLED_AT_LOAD = {MapType.PROG_ARRAY, MapType.DEVMAP}  # the loader puts programs and the egress there


def as_loaded(dp: Loaded) -> bool:
    """Put every map of dp back as the load left it (hashes emptied, arrays zeroed) and check that it
    is so; False, touching nothing, if a map is of a kind this does not know how to put back."""
    if any(m.type not in _EMPTY_AT_LOAD | _ZERO_AT_LOAD | _FILLED_AT_LOAD for m in dp.maps.values()):
        return False
    for m in dp.maps.values():
        if m.type in _FILLED_AT_LOAD:
            continue
        if m.type in _EMPTY_AT_LOAD:
            for key in list(m.keys()):
                m.delete(key)
            assert next(m.keys(), None) is None, f"map '{m.name}' still holds entries after emptying"
        else:
            zero = bytes(m.value_size)
            for i in range(m.max_entries):
                key = i.to_bytes(4, "little")
                m.update(key, zero)
                got = m.lookup_percpu(key) if m.percpu else [m.lookup(key)]
                assert got is not None and all(v == zero for v in got), f"map '{m.name}'[{i}] not zeroed"
    return True


def _has_global_data(obj: Path) -> bool:
    """Whether the object has writable globals (.bss/.data sections): state outside the maps that
    as_loaded() cannot see, so its programs are never taken back."""
    elf = obj.read_bytes()
    shoff = int.from_bytes(elf[0x28:0x30], "little")
    shentsize, shnum, shstrndx = (int.from_bytes(elf[o:o + 2], "little") for o in (0x3A, 0x3C, 0x3E))
    strtab_hdr = shoff + shstrndx * shentsize
    strtab = int.from_bytes(elf[strtab_hdr + 0x18:strtab_hdr + 0x20], "little")
    for i in range(shnum):
        at = strtab + int.from_bytes(elf[shoff + i * shentsize:shoff + i * shentsize + 4], "little")
        name = elf[at:elf.index(b"\0", at)]
        if name.startswith((b".bss", b".data")):
            return True
    return False


class ProgramPool:
    """Loaded programs (balancers, decaps) kept for reuse, one list per loader and set of load arguments.

    The verifier takes seconds for each load of the balancer (both programs) and proves nothing new
    when the same object is loaded again with the same .rodata and map sizes; a test run's outcome
    depends on the programs and their maps only. A program given back has its maps put back as the
    load left them (as_loaded) and waits for the next test that asks for the same loader and
    arguments; one that cannot be put back so (attached, or a map of another kind) is closed. Lists,
    not one per key: a test may hold several at once.

        dp = pool.take(Datapath.load, "build/bpf/balancer.o", {"ring_size": 13})
        pool.give_back(dp)          # the next take() with the same arguments gets dp, emptied
    """

    def __init__(self) -> None:
        self._free: dict[_PoolKey, list[Loaded]] = {}
        self._key: dict[int, _PoolKey] = {}
        self._globals: dict[str, bool] = {}

    def take(self, load: Callable[..., L], obj: str, args: dict[str, object], fresh: bool = False) -> L:
        """load(obj, **args): one given back earlier if there is one (unless fresh), else a new load."""
        key = (load.__qualname__, obj, tuple(sorted(args.items())))
        free = self._free.get(key, [])
        if free and not fresh:
            return free.pop()  # type: ignore[return-value]  # the key names the loader, so the type
        loaded = load(obj, **args)
        if obj not in self._globals:
            self._globals[obj] = _has_global_data(Path(obj))
        if not self._globals[obj]:
            self._key[id(loaded)] = key
        return loaded

    def give_back(self, loaded: Loaded) -> None:
        key = self._key.get(id(loaded))
        if key is not None and not loaded.links and as_loaded(loaded):
            self._free.setdefault(key, []).append(loaded)
            return
        self._key.pop(id(loaded), None)
        loaded.close()

    def close(self) -> None:
        for free in self._free.values():
            for loaded in free:
                self._key.pop(id(loaded), None)
                loaded.close()
        self._free.clear()
