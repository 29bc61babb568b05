"""route_plan.py: the entries a config wants in the maps of routing beyond the hash, and the writes of an apply.

Those maps (server ids, pinned source prefixes, VIPs that are prefixes, decap addresses, reals down
for UDP flow migration: balancer/routes.py) are the controller's alone, so an apply makes each one
exactly what the config says: new and changed entries written, entries no longer wanted removed,
nothing written when they already match. Health enters here: a real that health checks took down
for a VIP keeps its server id (established QUIC connections and TCP flows that carry the id go on,
as a drained real's sessions do), loses its pinned prefixes for that VIP (new flows from them go to
the ring), and is listed as down for that VIP when it migrates UDP flows.
"""

from __future__ import annotations

from collections.abc import Mapping

from balancer import config as cfg
from balancer import encaps, routes
from balancer.datapath import Datapath, Transaction

DECAP_ACTIONS = {"balance": routes.DecapAction.BALANCE, "local": routes.DecapAction.LOCAL,
                 "egress": routes.DecapAction.EGRESS}
ROUTE_MAPS = ("lb_server_ids", "lb_src_routes", "lb_vip_cidrs", "lb_decaps", "lb_down_reals")
Wanted = dict[str, dict[bytes, bytes]]


def wanted(config: cfg.Config, vip_nums: Mapping[str, int], real_ids: Mapping[str, int],
           down: Mapping[str, set[str]], flags_of: Mapping[str, int]) -> Wanted:
    """map -> {key: value} of every entry the config wants, given the numbers the apply handed out."""
    out: Wanted = {m: {} for m in ROUTE_MAPS}

    def add(e: routes.Entry) -> None:
        out[e.map][e.key] = e.value

    for vip in config.vips:
        num, gone = vip_nums[vip.name], down.get(vip.name, set())
        for real in vip.reals:
            if real.server_id is not None:
                add(routes.server_id(real.server_id, real_ids[str(real.address)]))
            if vip.udp_flow_migration and str(real.address) in gone:
                add(routes.down_real(num, real_ids[str(real.address)]))
        for pin in vip.src_routes:
            if str(pin.real) not in gone:
                add(routes.src_route(num, str(pin.prefix), real_ids[str(pin.real)]))
        if vip.prefix_len is not None:
            mode = encaps.mode_of(vip.encap)
            add(routes.vip_cidr(vip.address_text, vip.port, vip.proto, vip_num=num, flags=flags_of[vip.name],
                                encap=mode))
            add(routes.vip_cidr(vip.address_text, 0, 0, vip_num=min(vip_nums[v.name] for v in config.vips
                                                                       if v.address_text == vip.address_text),
                                encap=mode))
    for d in config.decap:
        add(routes.decap(str(d.address), DECAP_ACTIONS[d.action]))
    return out


def counts(want: Wanted) -> dict[str, int]:
    """The settings' counts of VIP prefixes and decap addresses (0 spares other packets the lookups)."""
    return {"cidr_vips": len(want["lb_vip_cidrs"]), "decaps": len(want["lb_decaps"])}


def write(tx: Transaction, dp: Datapath, want: Wanted) -> int:
    """Write new and changed entries; returns how many."""
    n = 0
    for name, entries in want.items():
        for key, value in entries.items():
            n += tx.put_entry((name, key, value))
    return n


def remove_unwanted(tx: Transaction, dp: Datapath, want: Wanted) -> int:
    """Remove the entries no longer wanted; returns how many."""
    n = 0
    for name in ROUTE_MAPS:
        for key in list(dp.maps[name].keys()):
            if key not in want[name]:
                n += tx.delete_entry(name, key)
    return n
