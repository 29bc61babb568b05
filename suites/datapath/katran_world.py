"""katran_world.py: our balancer programmed the way each of Katran's fixture profiles and build flavours expects.

The one place where the corpus's VIPs, reals, flags, server ids, source prefixes, CIDR VIPs, inline
decap addresses and down reals (../shared/conformance/katran/config.json) become our maps. Katran's
build flavours (its `#ifdef`s, listed per case in `required_defines`) become our per-VIP flags and
entries: GUE_ENCAP the GUE1 encap, TCP_SERVER_ID_ROUTING the TCP server-id flag on every TCP VIP,
LPM_SRC_LOOKUP and UDP_STABLE_ROUTING their VIP flags where the profile sets them, INLINE_DECAP_GUE
the LB's own addresses as decap addresses (its host address handing the inner packet to the stack,
the profile's decap_dsts balancing it, or sending it back out with DECAP_EGRESS).

`katran_hash`: every VIP hashes as Katran does (issue 31's `hash = "katran"`: LB_VIP_HASH_KATRAN, with
HASH_KATRAN_NO_DPORT where Katran zeroes the destination port) over Katran's own ring (Maglev V1 over the
profile's reals, built by balancer/katran_hash.py and checked against the ring fingerprint Katran's
control plane left in config.json before it is written), on a balancer loaded with Katran's ring size
and MAX_VIPS (its hash seeds): the corpus test then asserts Katran's own real wherever the hash decides.
Without it, each VIP cycles over its live reals in l4lab's own hash (a small test ring).
"""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass, field
from typing import Any

from balancer import _abi, katran_hash, maglev, routes
from balancer.maplayout import SESSION_SETS

from .rig import RunBalancer

KATRAN_GUE_PORT = 9886
Vip = tuple[str, int, str]  # address (a prefix for a CIDR VIP), port (0: any), protocol

# Katran VIP flag bits -> ours; the build-gated ones only with their define.
FLAG_MAP = {1: _abi.VipFlag.HASH_NO_SPORT, 2: _abi.VipFlag.NO_LRU, 4: _abi.VipFlag.SID_QUIC,
            8: _abi.VipFlag.HASH_DPORT_ONLY, 512: _abi.VipFlag.UDP_MIGRATE}
GATED_FLAGS = {16: ("LPM_SRC_LOOKUP", _abi.VipFlag.SRC_ROUTES), 256: ("UDP_STABLE_ROUTING", _abi.VipFlag.SID_STABLE)}
DECAP_EGRESS = 2  # Katran's decap_dst flag: send the inner packet back out (egress decap)
KATRAN_RING = katran_hash.DEFAULT_RING_SIZE  # Katran's RING_SIZE, which its fixtures ran with (config.json notes)


@dataclass(frozen=True)
class Build:
    """The parts of a case's Katran build flavour that change how we are programmed."""

    gue: bool
    tcp_server_id: bool
    lpm_src: bool
    stable: bool
    inline_decap: bool

    @classmethod
    def of(cls, defines: list[str]) -> Build:
        return cls(gue="GUE_ENCAP" in defines, tcp_server_id="TCP_SERVER_ID_ROUTING" in defines,
                   lpm_src="LPM_SRC_LOOKUP" in defines, stable="UDP_STABLE_ROUTING" in defines,
                   inline_decap="INLINE_DECAP_GUE" in defines)

    def defines(self) -> set[str]:
        return {d for d, on in (("LPM_SRC_LOOKUP", self.lpm_src), ("UDP_STABLE_ROUTING", self.stable)) if on}


@dataclass
class KatranWorld:
    """Our balancer, programmed for one (profile, build) at a time."""

    b: RunBalancer
    config: dict[str, Any]
    katran_hash: bool = False
    profile: str = ""
    build: Build | None = None
    entries: list[routes.Entry] = field(default_factory=list)
    keys: list[tuple[str, int, str]] = field(default_factory=list)
    vip_reals: dict[Vip, set[str]] = field(default_factory=dict)
    down: dict[Vip, set[str]] = field(default_factory=dict)

    def use(self, profile: str, build: Build) -> None:
        if (profile, build) == (self.profile, self.build):
            return
        self._clear()
        p = self.config["profiles"][profile]
        if profile.endswith("(fresh)"):  # Katran ran these on a fresh instance: no session carries over
            for table in self.b.dp.session_tables:
                if table.name == SESSION_SETS:  # the IPv4 sets: an array, emptied in place
                    table.mmap_words()[:] = 0
                    continue
                for key in list(table.keys()):
                    table.delete(key)
        reals = {r["real_index"]: r["address"] for r in p.get("reals", [])}
        for idx, addr in reals.items():
            self.b.dp.put_real(idx, addr)
            self.b.real_ids[addr] = idx
        cidrs = {(c["prefix"], c["port"], c["proto"]) for c in p.get("cidr_vips", [])}
        for v in p.get("vips", []):
            self._vip(v, p, build, cidrs)
        for sid, addr in p.get("quic_server_ids", {}).items():
            self._put(routes.server_id(int(sid), self.b.real_ids[addr]))
        decaps = self._decaps(profile, build)
        self.b.settings(**self._settings(), cidr_vips=2 * len(cidrs), decaps=decaps)
        self.profile, self.build = profile, build

    def _settings(self) -> dict[str, object]:
        return {"nexthop_mac": self.config["macs"]["router_default_mac"],
                "src4": self.config["katran_src"]["v4"] + "/32", "src6": self.config["katran_src"]["v6"] + "/128",
                "gue_port": KATRAN_GUE_PORT, "mtu": 1500}

    def _clear(self) -> None:
        for address, port, proto in self.keys:
            self.b.dp.del_vip(address, port, proto)
        for e in self.entries:
            self.b.dp.delete_entry(e.map, e.key)
        self.keys.clear()
        self.entries.clear()
        self.vip_reals.clear()
        self.down.clear()

    def _put(self, entry: routes.Entry) -> None:
        self.b.dp.put_entry(entry)
        self.entries.append(entry)

    def _flags(self, v: dict[str, Any], build: Build) -> int:
        flags = 0
        for bit, ours in FLAG_MAP.items():
            if v["flags"] & bit:
                flags |= ours
        for bit, (define, ours) in GATED_FLAGS.items():
            if v["flags"] & bit and define in build.defines():
                flags |= ours
        if build.tcp_server_id and v["proto"] == "tcp":
            flags |= _abi.VipFlag.SID_TCP
        return int(flags)

    def _hash_flags(self, v: dict[str, Any], cidr: bool) -> int:
        """With katran_hash, Katran's flow hash for the VIP: HASH_KATRAN, and HASH_KATRAN_NO_DPORT where
        Katran zeroes the destination port (balancer/katran_hash.py fields_of); else 0."""
        if not self.katran_hash:
            return 0
        name = next((n for n, bit in katran_hash.KATRAN_FLAGS.items() if bit and v["flags"] & bit), "katran")
        fields = katran_hash.fields_of(name, v["port"], prefix=cidr)
        return int(_abi.VipFlag.HASH_KATRAN | (_abi.VipFlag.HASH_KATRAN_NO_DPORT if fields.zero_dport else 0))

    def _ring(self, v: dict[str, Any], live: list[str]) -> None:
        """With katran_hash, Katran's ring of the VIP's reals as its fixtures had it (a real down for UDP
        flow migration stays in it, as in Katran's tester), checked against the fingerprint Katran's
        control plane left; else a ring cycling over the live reals."""
        if not (self.katran_hash and v["ring_initialized"]):
            self.b.ring(v["vip_num"], live)
            return
        assert self.b.dp.ring_size == KATRAN_RING, f"Katran's ring needs {KATRAN_RING} slots per VIP"
        ring = katran_hash.build_ring([maglev.Backend(r["real_index"], r["address"], r["weight"])
                                       for r in v["reals"]], KATRAN_RING, "v1")
        digest = hashlib.sha256(ring.astype("<u4").tobytes()).hexdigest()
        assert digest == v["ring_sha256_u32le"], f"{v['address']}:{v['port']}: the model's ring is not Katran's"
        self.b.dp.write_ring_slots(v["vip_num"], range(KATRAN_RING), ring)

    def _vip(self, v: dict[str, Any], p: dict[str, Any], build: Build, cidrs: set[tuple[str, int, str]]) -> None:
        mode = _abi.Encap.GUE1 if build.gue else _abi.Encap.IPIP
        vip_id = f"{v['address']}:{v['port']}/{ {'tcp': 6, 'udp': 17}[v['proto']] }"
        down = set(p.get("down_reals", {}).get(vip_id, []))
        live = [r["address"] for r in v["reals"] if r["real_index"] not in down] if v["ring_initialized"] else []
        prefix = next((c[0] for c in cidrs if (ipaddress.ip_network(c[0]).network_address,
                                               c[1], c[2]) == (ipaddress.ip_address(v["address"]),
                                                               v["port"], v["proto"])), None)
        flags = self._flags(v, build) | self._hash_flags(v, prefix is not None)
        if prefix is None:
            self.b.vip(v["address"], v["port"], v["proto"], v["vip_num"], [], mode.name, flags=flags)
            self.keys.append((v["address"], v["port"], v["proto"]))
            key: Vip = (v["address"], v["port"], v["proto"])
        else:
            self._put(routes.vip_cidr(prefix, v["port"], v["proto"], vip_num=v["vip_num"], flags=flags, encap=mode))
            self._put(routes.vip_cidr(prefix, 0, 0, vip_num=v["vip_num"], encap=mode))
            key = (prefix, v["port"], v["proto"])
        self._ring(v, live)
        self.vip_reals[key] = set(live)
        by_index = {r["real_index"]: r["address"] for r in p.get("reals", [])}
        self.down[key] = {by_index[i] for i in down}
        if flags & _abi.VipFlag.UDP_MIGRATE:
            for idx in down:
                self._put(routes.down_real(v["vip_num"], idx))
        if flags & _abi.VipFlag.SRC_ROUTES:
            family = ipaddress.ip_address(v["address"]).version
            for prefix_text, real in self.config["src_routing_rules"].items():
                if ipaddress.ip_network(prefix_text).version == family:
                    self._put(routes.src_route(v["vip_num"], prefix_text, self.b.real_ids[real]))

    def _decaps(self, profile: str, build: Build) -> int:
        """Katran's inline decap as our decap addresses: its host address hands the inner packet to the
        stack; the profile's decap_dsts balance it, or send it back out (DECAP_EGRESS)."""
        if not build.inline_decap:
            return 0
        out = {self.config["katran_src"]["v4"]: routes.DecapAction.LOCAL,
               self.config["katran_src"]["v6"]: routes.DecapAction.LOCAL}
        if "xpop" in profile:
            for addr, flags in self.config["decap_dsts"].items():
                if ("egress" in profile) == bool(flags & DECAP_EGRESS):
                    out[addr] = routes.DecapAction.EGRESS if flags & DECAP_EGRESS else routes.DecapAction.BALANCE
        for addr, action in out.items():
            self._put(routes.decap(addr, action))
        return len(out)
