"""controller.py: a running balancer instance — load, apply a config transactionally, status, unload.

An instance is named (`--instance`, default "default"); its maps and links are pinned under
`/sys/fs/bpf/lbctl/<instance>/` and its controller state (the applied config, VIP numbers, real ids,
the weights each ring was built from, attach modes) is kept in `/run/lbctl/<instance>.json`. Both
survive the controller process: forwarding and sessions continue while no controller runs, and a
later `lbctl` reopens the same instance.

`apply` reconciles the datapath with a config: it computes everything first, then writes settings,
new reals, the changed ring slots, VIPs, and finally removes what is gone. Every write goes through
one `Datapath.transaction()`, which logs the value it replaced; on any error the log is replayed
backwards, so the datapath keeps the previous consistent state, and the error names the VIP or real.
"""

from __future__ import annotations

import errno as _errno
import ipaddress
import json
import os
import socket
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from balancer import _abi, encaps, katran_hash, maglev, nexthop, objects, route_plan
from balancer import config as cfg
from balancer.datapath import Datapath, program_for
from balancer.egress import Egress, check_mtu, resolve
from balancer.errors import DatapathError, HostError, LbError
from balancer.maplayout import settings_bytes
from balancer.transaction import Transaction

PIN_ROOT = os.environ.get("LBCTL_PIN_ROOT", "/sys/fs/bpf/lbctl")
STATE_ROOT = os.environ.get("LBCTL_STATE_ROOT", "/run/lbctl")
# A test hook, read only here: the controller kills itself (SIGKILL) once an apply has written this
# many ring slots, leaving a ring half-written as a crash would (suites/conformance/test_reliability.py).
CRASH_AFTER_SLOTS_ENV = "LBCTL_TEST_CRASH_AFTER_SLOTS"
# A bare name: searched by balancer/objects.py ($L4LAB_BUILD_DIR, the installed package, build/bpf).
DEFAULT_OBJECT = "balancer.o"


def vip_flags(vip: cfg.Vip) -> int:
    flags = 0
    if vip.katran:
        fields = katran_hash.fields_of(vip.hash, vip.port, prefix=vip.prefix_len is not None)
        flags |= _abi.VipFlag.HASH_KATRAN
        flags |= _abi.VipFlag.HASH_NO_SPORT if fields.no_sport else 0
        flags |= _abi.VipFlag.HASH_DPORT_ONLY if fields.dport_only else 0
        flags |= _abi.VipFlag.HASH_KATRAN_NO_DPORT if fields.zero_dport else 0
    elif vip.hash == "no-sport":
        flags |= _abi.VipFlag.HASH_NO_SPORT
    elif vip.hash == "dport-only":
        flags |= _abi.VipFlag.HASH_DPORT_ONLY
    if not vip.lru:
        flags |= _abi.VipFlag.NO_LRU
    if vip.outer_src == "flow":
        flags |= _abi.VipFlag.OUTER_SRC_FLOW
    if vip.gue_csum == "zero":
        flags |= _abi.VipFlag.GUE_CSUM_ZERO
    flags |= {"none": 0, "quic": _abi.VipFlag.SID_QUIC, "stable-routing": _abi.VipFlag.SID_STABLE,
              "tcp-option": _abi.VipFlag.SID_TCP}[vip.server_id_from]
    if vip.udp_flow_migration:
        flags |= _abi.VipFlag.UDP_MIGRATE
    if vip.src_routes:
        flags |= _abi.VipFlag.SRC_ROUTES
    return int(flags)


def ring_kind(vip: cfg.Vip) -> str:
    """How the VIP's ring is built: "l4lab" (weights in proportion), or Katran's "katran-v1" / "katran-v2"."""
    return f"katran-{vip.katran_ring}" if vip.katran else "l4lab"


@dataclass
class State:
    """What the controller remembers about an instance besides the maps themselves."""

    instance: str
    object: str
    interfaces: dict[str, str] = field(default_factory=dict)      # ifname -> requested mode
    config: str = ""                                               # TOML of the applied config
    vip_nums: dict[str, int] = field(default_factory=dict)         # vip name -> vip_num
    real_ids: dict[str, int] = field(default_factory=dict)         # address -> real id
    ring_inputs: dict[str, list[list[Any]]] = field(default_factory=dict)  # vip -> [[addr, weight]]
    down: dict[str, list[str]] = field(default_factory=dict)       # vip -> reals failed by health checks
    object_sha256: str = ""                                        # of `object` when it was loaded
    nexthop: dict[str, str] = field(default_factory=dict)          # the NextHop the settings hold
    egress: dict[str, Any] = field(default_factory=dict)           # two-arm: Egress.to_json(); {} one-arm

    def to_json(self) -> str:
        return json.dumps(self.__dict__, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> State:
        return cls(**json.loads(text))


@dataclass
class ApplyReport:
    """What one apply wrote: zero everywhere means the datapath already matched."""

    settings: int = 0
    vips_added: int = 0
    vips_changed: int = 0
    vips_removed: int = 0
    reals_added: int = 0
    reals_removed: int = 0
    ring_slots: int = 0
    routes: int = 0  # entries written or removed in the maps of routing beyond the hash (route_plan.py)
    sessions_flushed: int = 0

    @property
    def writes(self) -> int:
        return sum(v for k, v in self.__dict__.items() if k != "sessions_flushed")


@dataclass
class _Plan:
    """What one apply works from: both configs, the numbers it hands out and the reals down."""

    new: cfg.Config
    old: cfg.Config
    new_vips: dict[str, cfg.Vip]
    old_vips: dict[str, cfg.Vip]
    vip_nums: dict[str, int]
    real_ids: dict[str, int]
    down: dict[str, set[str]]          # vip -> reals marked down for this apply
    new_down: dict[str, list[str]]     # the same, as saved in State.down
    ring_inputs: dict[str, list[list[Any]]] = field(default_factory=dict)  # filled by the ring writes
    routes: route_plan.Wanted = field(default_factory=dict)  # server ids, pins, prefix VIPs, decaps, downs


class Instance:
    """A loaded balancer instance: its datapath (maps, links) and controller state."""

    def __init__(self, name: str, dp: Datapath, state: State) -> None:
        self.name = name
        self.dp = dp
        self.state = state

    # -- paths ---------------------------------------------------------------------------------

    @staticmethod
    def pin_dir(name: str) -> str:
        return f"{PIN_ROOT}/{name}"

    @staticmethod
    def state_path(name: str) -> Path:
        return Path(STATE_ROOT) / f"{name}.json"

    # -- lifecycle -----------------------------------------------------------------------------

    @classmethod
    def load(cls, name: str, interfaces: Iterable[str], mode: str = "native",
             config: cfg.Config | None = None, obj: str = DEFAULT_OBJECT) -> Instance:
        """Load the balancer, attach it to every interface, pin it, then apply config if given."""
        if cls.state_path(name).exists() or Path(cls.pin_dir(name)).exists():
            raise DatapathError(f"load instance '{name}'", _errno.EEXIST,
                                "it is already loaded: use `lbctl apply`, or `lbctl unload` first")
        c = config or cfg.Config()
        d = c.datapath
        ifaces = list(interfaces)  # none: loaded and pinned but not attached (tests, staging)
        for ifname in ifaces:
            try:
                socket.if_nametoindex(ifname)
            except OSError as exc:
                raise DatapathError(f"find interface '{ifname}'", _errno.ENODEV,
                                    "check the name with `ip link`") from exc
        egress = resolve(d.egress) if d.egress else None
        if egress:
            check_mtu(egress, d.mtu)
        obj = objects.find(obj)  # the state file records the path, so `lbctl status` names the file
        dp = Datapath.load(obj, max_vips=d.max_vips, max_reals=d.max_reals, ring_size=d.ring_size,
                           lru_size=d.lru_size, fallback_size=d.fallback_size, udp_timeout_s=d.udp_timeout_s,
                           katran_max_vips=d.katran_max_vips, egress=egress, programs=(program_for(d.frags),))
        pin_dir = cls.pin_dir(name)
        try:
            dp.pin(pin_dir, exclusive=True)  # refuses a directory it did not make; undoes its own part
        except BaseException:
            dp.close()
            raise
        try:
            for ifname in ifaces:
                link = dp.attach(ifname, mode, frags=d.frags)
                link.pin(f"{pin_dir}/link_{ifname}")
            state = State(instance=name, object=obj, interfaces=dict.fromkeys(ifaces, mode),
                          object_sha256=objects.digest(obj), egress=egress.to_json() if egress else {})
            inst = cls(name, dp, state)
            inst.save()
            inst.apply(c)
            return inst
        except BaseException:
            dp.close()
            Datapath.unpin(pin_dir)
            cls.state_path(name).unlink(missing_ok=True)
            raise

    @classmethod
    def open(cls, name: str) -> Instance:
        path = cls.state_path(name)
        if not path.exists():
            raise DatapathError(f"find a loaded balancer instance '{name}'", _errno.ENOENT,
                                "run `lbctl load --interface IF` first")
        state = State.from_json(path.read_text())
        return cls(name, Datapath.open_pinned(cls.pin_dir(name)), state)

    def upgrade(self, obj: str = DEFAULT_OBJECT) -> dict[str, int]:
        """Hitless replacement: load obj on the pinned maps and swap it in behind every link.

        The links are updated atomically (BPF_LINK_UPDATE): packets see either program, never none,
        and the session tables, rings and counters are the same maps before and after.
        """
        obj = objects.find(obj)
        frags = self.config.datapath.frags
        new = Datapath.load_reusing(obj, self.dp, self.config.datapath.udp_timeout_s,
                                    self.config.datapath.katran_max_vips, self.egress, programs=(program_for(frags),))
        prog = new.programs[program_for(frags)]
        try:
            for link in self.dp.links:
                link.update(prog)
        finally:
            new.close()  # the links hold the new program; the maps stay pinned
        self.state.object = obj
        self.state.object_sha256 = objects.digest(obj)
        self.save()
        return {"links": len(self.dp.links)}

    def runs(self, obj: str) -> bool:
        """Whether the program running is object obj as it is now (same path, same content when known)."""
        path = objects.find(obj)
        if os.path.abspath(path) != os.path.abspath(self.state.object):
            return False
        return not self.state.object_sha256 or objects.digest(path) == self.state.object_sha256

    def save(self) -> None:
        path = self.state_path(self.name)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(self.state.to_json())
        tmp.replace(path)

    def unload(self) -> None:
        self.dp.close()
        Datapath.unpin(self.pin_dir(self.name))
        self.state_path(self.name).unlink(missing_ok=True)

    def close(self) -> None:
        self.dp.close()

    @property
    def egress(self) -> Egress | None:
        """The egress interface the instance was loaded with (two-arm), None for one-arm."""
        return Egress.from_json(self.state.egress) if self.state.egress else None

    @property
    def config(self) -> cfg.Config:
        return cfg.loads(self.state.config, f"state of instance '{self.name}'") if self.state.config \
            else cfg.Config()

    # -- apply ---------------------------------------------------------------------------------

    def apply(self, new: cfg.Config, down: Mapping[str, Iterable[str]] | None = None) -> ApplyReport:
        """Make the datapath match new (minus reals marked down); all or nothing.

        The writes, in one Datapath transaction, come in an order that keeps what the datapath
        serves consistent: settings, new reals, each VIP's changed ring slots then its entry, the
        address-only entries, then the removals. A ring is marked unsure on disk before its
        slots are written (see _ring_unsure), so a controller killed mid-ring is repaired by the
        next apply.
        """
        _check_fits(new, self.dp, self.config if self.state.config else None)
        self._check_egress(new)
        hop = self.next_hop(new.encap)
        plan = self._plan(new, down if down is not None else self.state.down)
        plan.routes = route_plan.wanted(new, plan.vip_nums, plan.real_ids, plan.down,
                                        {v.name: vip_flags(v) for v in new.vips})
        report = ApplyReport()
        with self.dp.transaction(crash_after_slots=_crash_after_slots()) as tx:
            self._write_settings(tx, plan, report, hop)
            self._write_new_reals(tx, plan, report)
            self._write_vips(tx, plan, report)
            self._write_address_entries(tx, plan)
            report.routes += route_plan.write(tx, self.dp, plan.routes)
            self._remove_vips(tx, plan, report)
            report.routes += route_plan.remove_unwanted(tx, self.dp, plan.routes)
            self._clear_old_reals(tx, plan, report)
        report.sessions_flushed = self._flush_left_reals(plan)
        st = self.state
        st.config = cfg.dump(new)
        st.vip_nums = plan.vip_nums
        st.real_ids = plan.real_ids
        st.ring_inputs = plan.ring_inputs
        st.down = plan.new_down
        st.nexthop = hop.to_dict()
        self.save()
        return report

    def _check_egress(self, new: cfg.Config) -> None:
        """The egress interface is fixed at load (.rodata and the devmap): a config may not change it."""
        loaded = self.egress.ifname if self.egress else ""
        if new.datapath.egress != loaded:
            said = f"'{new.datapath.egress}'" if new.datapath.egress else "absent (one-arm)"
            was = f"'{loaded}'" if loaded else "none (one-arm)"
            raise LbError(f"datapath.egress is {said} but instance '{self.name}' was loaded with egress {was}; "
                          "the egress is fixed at load: `lbctl unload`, then `lbctl load` with the new config")
        if self.egress:
            check_mtu(self.egress, new.datapath.mtu)

    def next_hop(self, encap: cfg.EncapConfig) -> nexthop.NextHop:
        """Where encap sends frames now (balancer/nexthop.py), found on the link the encapsulated frames
        leave by (a two-arm LB's egress, else its interfaces). When the kernel has lost the neighbour
        that this same encap config found before, its last MAC is kept: a router that is down or
        being replaced gets it back, and health applies are not refused meanwhile."""
        links = [self.egress.ifname] if self.egress else list(self.state.interfaces)
        try:
            return nexthop.resolve(encap.nexthop_mac, str(encap.nexthop) if encap.nexthop else None, links)
        except HostError:
            last = self.state.nexthop
            if last and self.state.config and self.config.encap == encap and last.get("mac") != nexthop.NONE:
                return nexthop.NextHop(**last)
            raise

    def _plan(self, new: cfg.Config, down: Mapping[str, Iterable[str]]) -> _Plan:
        """Number the VIPs and reals of new: keep existing numbers, hand out the smallest free ones.

        A number freed by this apply is not handed out again in the same apply: its ring slots
        are being cleared, and sessions may still name a freed real id until the next apply.
        """
        st = self.state
        old = self.config
        new_vips = {v.name: v for v in new.vips}
        vip_nums = {name: num for name, num in st.vip_nums.items() if name in new_vips}
        free_vip_nums = _free_numbers([*vip_nums.values(), *st.vip_nums.values()], 0)
        for vname in new_vips:
            if vname not in vip_nums:
                vip_nums[vname] = next(free_vip_nums)
        wanted_reals = {str(r.address) for v in new.vips for r in v.reals} | \
            {str(p.real) for v in new.vips for p in v.src_routes}
        real_ids = {addr: rid for addr, rid in st.real_ids.items() if addr in wanted_reals}
        free_real_ids = _free_numbers([*real_ids.values(), *st.real_ids.values()], 1)
        for addr in sorted(wanted_reals, key=_addr_sort):
            if addr not in real_ids:
                real_ids[addr] = next(free_real_ids)
        if vip_nums and max(vip_nums.values()) >= self.dp.vip_capacity:
            raise LbError(f"cannot number {len(vip_nums)} VIPs: the datapath holds "
                          f"{self.dp.vip_capacity}; raise datapath.max_vips and reload")
        if real_ids and max(real_ids.values()) >= self.dp.real_capacity:
            raise LbError(f"cannot number {len(real_ids)} reals: the datapath holds "
                          f"{self.dp.real_capacity}; raise datapath.max_reals and reload")
        down_sets = {k: set(v) for k, v in down.items()}
        return _Plan(new=new, old=old, new_vips=new_vips,
                     old_vips={v.name: v for v in old.vips} if st.config else {},
                     vip_nums=vip_nums, real_ids=real_ids, down=down_sets,
                     new_down={k: sorted(v) for k, v in down_sets.items() if v and k in new_vips})

    def _write_settings(self, tx: Transaction, plan: _Plan, report: ApplyReport, hop: nexthop.NextHop) -> None:
        """Settings first, with the next hop's MAC as found now: counts of prefix VIPs and decap addresses
        raised early only cost lookups that miss, and dropped early only skip entries about to go."""
        new = plan.new
        want = settings_bytes(nexthop_mac=hop.mac, src4=str(new.encap.src4), src6=str(new.encap.src6),
                              gue_port=new.encap.gue_port, mtu=new.datapath.mtu, **route_plan.counts(plan.routes))
        report.settings = int(tx.put_entry(("lb_settings", b"\0" * 4, want)))

    def _write_new_reals(self, tx: Transaction, plan: _Plan, report: ApplyReport) -> None:
        for addr, rid in plan.real_ids.items():
            if self.state.real_ids.get(addr) != rid:
                tx.put_real(rid, addr)
                report.reals_added += 1

    def _write_vips(self, tx: Transaction, plan: _Plan, report: ApplyReport) -> None:
        """Each VIP's changed ring slots, then its entry (so a new VIP is served a whole ring)."""
        st = self.state
        for vname, vip in plan.new_vips.items():
            num = plan.vip_nums[vname]
            down = plan.down.get(vname, set())
            inputs = [[str(r.address), 0 if str(r.address) in down else r.weight] for r in vip.reals]
            plan.ring_inputs[vname] = inputs
            old_vip = plan.old_vips.get(vname)
            same_kind = old_vip is not None and ring_kind(old_vip) == ring_kind(vip)
            if not (same_kind and _same_ring(vname, num, inputs, plan.real_ids, st)):
                new_ring = _ring(inputs, plan.real_ids, self.dp.ring_size, ring_kind(vip))
                if old_vip is not None and vname in st.ring_inputs and st.vip_nums.get(vname) == num:
                    old_ring = _ring(st.ring_inputs[vname], st.real_ids, self.dp.ring_size, ring_kind(old_vip))
                else:  # a new or renumbered VIP: diff against what the slots hold now
                    old_ring = self.dp.ring_array(num)
                slots, _vals = maglev.ring_diff(old_ring, new_ring)
                self._write_ring(tx, vname, num, slots, new_ring, plan, report)
            if vip.prefix_len is None and tx.put_vip(str(vip.address), vip.port, vip.proto, vip_num=num,
                                                     flags=vip_flags(vip), encap=int(encaps.mode_of(vip.encap))):
                if vname in plan.old_vips:
                    report.vips_changed += 1
                else:
                    report.vips_added += 1

    def _write_ring(self, tx: Transaction, vname: str, num: int, slots: npt.NDArray[np.uint32],
                    new_ring: maglev.Ring, plan: _Plan, report: ApplyReport) -> None:
        if len(slots):
            self._ring_unsure(vname, plan.new_down)
            tx.write_ring_slots(num, slots, new_ring)
            report.ring_slots += len(slots)

    def _write_address_entries(self, tx: Transaction, plan: _Plan) -> None:
        """One address-only entry (port 0, proto 0) per VIP address: it makes the address a VIP
        for ICMP echo and for the fragment / options / malformed drops."""
        addr_nums: dict[str, int] = {}
        for vname, vip in plan.new_vips.items():
            if vip.prefix_len is None:  # a prefix VIP's address-only entry is a prefix too (route_plan.py)
                addr_nums.setdefault(str(vip.address), plan.vip_nums[vname])
        for address, num in addr_nums.items():
            tx.put_vip(address, 0, 0, vip_num=num)
        for address in {str(v.address) for v in plan.old_vips.values() if v.prefix_len is None} - set(addr_nums):
            tx.del_vip(address, 0, 0)

    def _remove_vips(self, tx: Transaction, plan: _Plan, report: ApplyReport) -> None:
        """The entries of VIPs gone from the config, then their rings cleared."""
        st = self.state
        for vname, vip in plan.old_vips.items():
            if vname in plan.new_vips:
                continue
            if vip.prefix_len is None:
                tx.del_vip(str(vip.address), vip.port, vip.proto)
            num = st.vip_nums[vname]
            old_ring = _ring(st.ring_inputs[vname], st.real_ids, self.dp.ring_size, ring_kind(vip)) \
                if vname in st.ring_inputs else self.dp.ring_array(num)  # a crash's leftovers
            slots = np.flatnonzero(old_ring).astype(np.uint32)
            self._write_ring(tx, vname, num, slots, np.zeros(self.dp.ring_size, dtype=np.uint32),
                             plan, report)
            report.vips_removed += 1

    def _clear_old_reals(self, tx: Transaction, plan: _Plan, report: ApplyReport) -> None:
        for addr, rid in self.state.real_ids.items():
            if plan.real_ids.get(addr) != rid and rid not in plan.real_ids.values():
                tx.del_real(rid)
                report.reals_removed += 1

    def _flush_left_reals(self, plan: _Plan) -> int:
        """A real that left a VIP (not drained: removed) loses that VIP's sessions, so its flows
        re-hash now and fail fast, whether or not the real still serves other VIPs."""
        flushed = 0
        for vname, vip in plan.new_vips.items():
            if vname in plan.old_vips:
                left = {str(r.address) for r in plan.old_vips[vname].reals} - {str(r.address) for r in vip.reals}
                for addr in sorted(left):
                    flushed += self.dp.flush_sessions(
                        vip.address_text, vip.port, vip.proto, self.state.real_ids[addr])
        return flushed

    def _ring_unsure(self, vname: str, down: dict[str, list[str]]) -> None:
        """Before a VIP's ring slots are written: forget (on disk) what its ring was built from.

        Should the controller die mid-write, the next apply then diffs that ring against the map
        itself, not against the old inputs: otherwise applying the old config again would find
        "nothing changed" and leave the ring half-written for good. The reals down now are saved
        with it: a restarted daemon keeps them drained instead of writing them back for a while."""
        if vname in self.state.ring_inputs or self.state.down != down:
            self.state.ring_inputs.pop(vname, None)
            self.state.down = down
            self.save()

    # -- views ---------------------------------------------------------------------------------

    def attach_modes(self) -> dict[str, str]:
        """The XDP mode each interface really runs in: driver, generic, offload or none."""
        out = {}
        try:
            from pyroute2 import IPRoute  # imported here: only status needs netlink
        except ImportError:
            return dict.fromkeys(self.state.interfaces, "unknown")
        # pyroute2 decodes IFLA_XDP_ATTACHED as the kernel's number or as iproute2's word.
        names: dict[object, str] = {1: "native", 2: "generic", 3: "offload", 4: "multi",
                                    "xdp": "native", "xdpgeneric": "generic", "xdpoffload": "offload",
                                    "xdpmulti": "multi"}
        with IPRoute() as ipr:
            for ifname in self.state.interfaces:
                idx = ipr.link_lookup(ifname=ifname)
                if not idx:
                    out[ifname] = "missing"
                    continue
                link = ipr.get_links(idx[0])[0]
                xdp = link.get_attr("IFLA_XDP")
                attached = xdp.get_attr("IFLA_XDP_ATTACHED") if xdp is not None else 0
                out[ifname] = names.get(attached or 0, "none")
        return out

    def status(self) -> dict[str, Any]:
        c = self.config
        vips = []
        for v in c.vips:
            num = self.state.vip_nums.get(v.name)
            down = set(self.state.down.get(v.name, []))
            reals = [{"address": str(r.address), "weight": r.weight,
                      "id": self.state.real_ids.get(str(r.address)), "server_id": r.server_id,
                      "healthy": str(r.address) not in down} for r in v.reals]
            vips.append({"vip": v.name, "vip_num": num, "encap": v.encap, "hash": v.hash, "ring": ring_kind(v),
                         "lru": v.lru, "outer_src": v.outer_src, "server_id_from": v.server_id_from,
                         "udp_flow_migration": v.udp_flow_migration,
                         "src_routes": [{"prefix": str(p.prefix), "real": str(p.real)} for p in v.src_routes],
                         "reals": reals})
        hop = nexthop.NextHop(**self.state.nexthop) if self.state.nexthop else None
        egress = self.egress
        return {"instance": self.name, "object": self.state.object, "interfaces": self.attach_modes(),
                "requested_modes": self.state.interfaces,
                "nexthop": {**hop.to_dict(), "describe": hop.describe()} if hop else {}, "vips": vips,
                "decap": [{"address": str(d.address), "action": d.action} for d in c.decap],
                "egress": egress.status() if egress else None}

    def stats(self) -> dict[str, Any]:
        c = self.config
        vips = {}
        for v in c.vips:
            num = self.state.vip_nums.get(v.name)
            if num is not None:
                p, b = self.dp.vip_stats(num)
                vips[v.name] = {"packets": p, "bytes": b}
        reals = {}
        for addr, rid in sorted(self.state.real_ids.items(), key=lambda kv: kv[1]):
            p, b = self.dp.real_stats(rid)
            reals[addr] = {"id": rid, "packets": p, "bytes": b}
        reasons = {k: {"packets": p, "bytes": b} for k, (p, b) in self.dp.reason_counters().items()}
        return {"vips": vips, "reals": reals, "reasons": reasons, "events": self.dp.events()}


def _crash_after_slots() -> int | None:
    crash = os.environ.get(CRASH_AFTER_SLOTS_ENV)
    return int(crash) if crash else None


def _check_fits(c: cfg.Config, dp: Datapath, applied: cfg.Config | None) -> None:
    """The load-time settings of `c` are those the datapath was loaded with (`applied`: the config
    applied last, None before the first apply)."""
    if c.datapath.ring_size != dp.ring_size:
        raise LbError(f"cannot change ring_size from {dp.ring_size} to {c.datapath.ring_size} "
                      "while loaded; run `lbctl unload` and `lbctl load` again")
    was = applied.datapath.katran_max_vips if applied else c.datapath.katran_max_vips
    if c.datapath.katran_max_vips != was:
        raise LbError(f"cannot change katran_max_vips from {was} to {c.datapath.katran_max_vips} "
                      "while loaded; run `lbctl unload` and `lbctl load` again")


def _free_numbers(used: Iterable[int], start: int) -> Iterator[int]:
    """The numbers from start up that are not in used, smallest first (one set, not one per number)."""
    taken = set(used)
    n = start
    while True:
        if n not in taken:
            yield n
        n += 1


def _addr_sort(addr: str) -> tuple[int, bytes]:
    ip = ipaddress.ip_address(addr)
    return ip.version, ip.packed


def _same_ring(vname: str, num: int, inputs: list[list[Any]], real_ids: Mapping[str, int], st: State) -> bool:
    """Whether the VIP's ring is unchanged since the last apply: same number, inputs and real ids (skips two builds)."""
    return (st.vip_nums.get(vname) == num and st.ring_inputs.get(vname) == inputs
            and all(real_ids.get(str(a)) == st.real_ids.get(str(a)) for a, _w in inputs))


def _ring(inputs: list[list[Any]], real_ids: Mapping[str, int], size: int, kind: str) -> maglev.Ring:
    """The ring of a VIP's [[address, weight]] inputs, built as ring_kind() says."""
    reals = {real_ids[a]: (a, int(w)) for a, w in inputs if a in real_ids}
    if kind == "l4lab":
        return maglev.build_ring(reals, size)
    backends = [maglev.Backend(rid, a, w) for rid, (a, w) in reals.items()]
    return katran_hash.build_ring(backends, size, cast(katran_hash.RingKind, kind.removeprefix("katran-")))

