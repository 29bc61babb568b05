"""cli_routes.py: `lbctl src-route` and `lbctl decap`, the verbs of routing beyond the hash.

    lbctl src-route add VIP PORT PROTO PREFIX REAL | del VIP PORT PROTO PREFIX | list VIP PORT PROTO
    lbctl decap add ADDRESS [--action balance|local|egress] | del ADDRESS | list

They edit the instance's config and apply it, as `lbctl vip` and `lbctl real` do (balancer/cli.py);
`--server-id` (real add) and `--server-id-from`, `--udp-flow-migration` (vip add) live with those verbs.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
from collections.abc import Callable
from typing import Any

from balancer import config as cfg
from balancer.config_routes import DECAP_ACTIONS

Edit = Callable[[argparse.Namespace, Callable[[cfg.Config], cfg.Config]], int]
Listing = Callable[[argparse.Namespace, Callable[[cfg.Config], list[dict[str, Any]]], Callable[[dict[str, Any]], str]],
                   int]


def src_route(args: argparse.Namespace, find_vip: Callable[[cfg.Config, str, int, str], int], edit: Edit,
              listing: Listing, usage: Callable[[str], Exception]) -> int:
    def rows(c: cfg.Config) -> list[dict[str, Any]]:
        vip = c.vips[find_vip(c, args.vip, args.port, args.proto)]
        return [{"prefix": str(r.prefix), "real": str(r.real)} for r in vip.src_routes]

    if args.action == "list":
        return listing(args, rows, lambda r: f"{r['prefix']} -> {r['real']}")

    def change(c: cfg.Config) -> cfg.Config:
        i = find_vip(c, args.vip, args.port, args.proto)
        vip = c.vips[i]
        prefix = ipaddress.ip_network(args.prefix, strict=True)
        others = tuple(r for r in vip.src_routes if r.prefix != prefix)
        if args.action == "del":
            if len(others) == len(vip.src_routes):
                raise usage(f"{prefix} is not pinned on {vip.name}; `lbctl src-route list` shows the pins")
            pins = others
        else:
            if not args.real:
                raise usage("lbctl src-route add needs PREFIX and REAL")
            pins = (*others, cfg.SrcRoute(prefix=prefix, real=ipaddress.ip_address(args.real)))
        vips = list(c.vips)
        vips[i] = dataclasses.replace(vip, src_routes=pins)
        return dataclasses.replace(c, vips=tuple(vips))

    return edit(args, change)


def decap(args: argparse.Namespace, edit: Edit, listing: Listing, usage: Callable[[str], Exception]) -> int:
    if args.action == "list":
        return listing(args, lambda c: [{"address": str(d.address), "action": d.action} for d in c.decap],
                       lambda r: f"{r['address']}  {r['action']}")
    if not args.address:
        raise usage(f"lbctl decap {args.action} needs ADDRESS")

    def change(c: cfg.Config) -> cfg.Config:
        address = ipaddress.ip_address(args.address)
        others = tuple(d for d in c.decap if d.address != address)
        if args.action == "del":
            if len(others) == len(c.decap):
                raise usage(f"{address} is no decap address; `lbctl decap list` shows them")
            return dataclasses.replace(c, decap=others)
        return dataclasses.replace(c, decap=(*others, cfg.DecapAddress(address=address, action=args.action_name)))

    return edit(args, change)


Verb = Callable[[argparse.Namespace], int]


def add_parsers(sub: Any, verb: Callable[..., argparse.ArgumentParser], port: Callable[[str], int],
                fn_src_route: Verb, fn_decap: Verb) -> None:
    s = verb(sub, "src-route", "pin client prefixes of a VIP to a real (new flows; the longest prefix wins)",
             "lbctl src-route add 198.51.100.10 443 udp 192.0.2.0/24 203.0.113.18",
             "lbctl src-route del 198.51.100.10 443 udp 192.0.2.0/24", "lbctl src-route list 198.51.100.10 443 udp")
    s.add_argument("action", choices=("add", "del", "list"), help="what to do: add, del or list")
    s.add_argument("vip", help="VIP address (or prefix)")
    s.add_argument("port", type=port, help="VIP port")
    s.add_argument("proto", choices=("tcp", "udp"), help="VIP protocol")
    s.add_argument("prefix", nargs="?", help="the client prefix (add and del)")
    s.add_argument("real", nargs="?", help="the real its new flows go to (add)")
    s.add_argument("--json", action="store_true", help="with list: print the pins as JSON")
    s.set_defaults(fn=fn_src_route)

    s = verb(sub, "decap", "addresses of this LB whose IPIP / GUE packets it decapsulates",
             "lbctl decap add 198.51.100.7 --action balance", "lbctl decap del 198.51.100.7", "lbctl decap list")
    s.add_argument("action", choices=("add", "del", "list"), help="what to do: add, del or list")
    s.add_argument("address", nargs="?", help="an address of this LB (add and del)")
    s.add_argument("--action", dest="action_name", choices=DECAP_ACTIONS, default="balance",
                   help="the inner packet is balanced, handed to this host, or sent back out (default %(default)s)")
    s.add_argument("--json", action="store_true", help="with list: print the addresses as JSON")
    s.set_defaults(fn=fn_decap)
