"""cli_args.py: the arguments of each `lbctl` verb, one `add_<verb>(parser)` per verb.

balancer/cli.py's VERBS table joins each of these to its help, its examples and the function that
runs it; the argument types here refuse out-of-range numbers as usage errors (exit 2).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from balancer import config as cfg
from balancer.config_routes import DECAP_ACTIONS, SERVER_ID_FROMS, SERVER_ID_MAX
from balancer.controller import DEFAULT_OBJECT

_FORCE_HELP = ("load although a state file names a datapath whose pins are not visible (check first that "
               "no XDP program is attached to the interfaces; refused if one is)")
_OBJECT_HELP = ("the balancer's BPF object: a path, or a file name searched in $L4LAB_BUILD_DIR/bpf, the "
                "installed package and the source tree's build/bpf (default %(default)s)")
_RUN_OBJECT_HELP = _OBJECT_HELP.replace("(default %(default)s)",
                                        f"(default the config's datapath.object, else {DEFAULT_OBJECT})")
_MODE_HELP = "XDP attach mode: native (driver), generic (skb, slow) or auto (native, else generic)"
_INTERFACE_HELP = "attach to IF (repeat for more); default the config's datapath.interfaces"


def _bounded(what: str, low: int, high: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        n = int(text)
        if not low <= n <= high:
            raise argparse.ArgumentTypeError(f"{what} must be {low}..{high} but got {n}")
        return n
    parse.__name__ = what.replace(" ", "_")  # argparse names the type in its "invalid ..." message
    return parse


port = _bounded("port", 0, 65535)
weight = _bounded("weight", 0, 65535)
server_id = _bounded("server id", 1, SERVER_ID_MAX)


def _vip_key(s: argparse.ArgumentParser, address_help: str = "VIP address") -> None:
    s.add_argument("vip", help=address_help)
    s.add_argument("port", type=port, help="VIP port")
    s.add_argument("proto", choices=("tcp", "udp"), help="VIP protocol")


def _json(s: argparse.ArgumentParser, help: str) -> None:
    s.add_argument("--json", action="store_true", help=help)


def add_load(s: argparse.ArgumentParser) -> None:
    s.add_argument("--interface", "-i", action="append", default=[], metavar="IF", help=_INTERFACE_HELP)
    s.add_argument("--mode", choices=("native", "generic", "auto"), help=_MODE_HELP + "; default native")
    s.add_argument("--config", "-c", metavar="FILE", help="apply this TOML config once loaded")
    s.add_argument("--object", default=DEFAULT_OBJECT, metavar="OBJECT", help=_OBJECT_HELP)
    s.add_argument("--force-reload", action="store_true", help=_FORCE_HELP)


def add_apply(s: argparse.ArgumentParser) -> None:
    s.add_argument("file", metavar="FILE", help="the TOML config to apply (VIPs, reals, encap, limits)")
    _json(s, "print what changed as JSON")


def add_upgrade(s: argparse.ArgumentParser) -> None:
    s.add_argument("--object", default=DEFAULT_OBJECT, metavar="OBJECT", help=_OBJECT_HELP)


def add_nothing(s: argparse.ArgumentParser) -> None:
    """A verb without arguments (`lbctl unload`)."""


def add_status(s: argparse.ArgumentParser) -> None:
    _json(s, "print the status as JSON")


def add_stats(s: argparse.ArgumentParser) -> None:
    _json(s, "print the counters as JSON")
    s.add_argument("--watch", type=float, metavar="SECONDS", help="print the table every SECONDS, with rates")
    s.add_argument("--count", type=int, default=0, help="with --watch: stop after N intervals")


def add_vip(s: argparse.ArgumentParser) -> None:
    s.add_argument("action", choices=("add", "del", "list"), help="what to do: add, del or list")
    s.add_argument("address", nargs="?", help="the VIP's address (IPv4 or IPv6); add and del only")
    s.add_argument("port", nargs="?", type=port, help="the VIP's port, 0 for every port; add and del only")
    s.add_argument("proto", nargs="?", choices=("tcp", "udp"), help="tcp or udp; add and del only")
    s.add_argument("--encap", choices=cfg.ENCAPS, default="ipip",
                   help="how packets reach the reals (default %(default)s)")
    s.add_argument("--hash", choices=cfg.HASHES, default="5tuple",
                   help="the fields that pick a real (default %(default)s); katran...: as Katran nodes do")
    s.add_argument("--katran-ring", choices=cfg.KATRAN_RINGS,
                   help="with a katran hash: Katran's Maglev v1 (its default: weights are a head start) or v2")
    s.add_argument("--no-lru", action="store_true", help="no session table: every packet follows the ring")
    s.add_argument("--outer-src", choices=cfg.OUTER_SRCS,
                   help="the outer source address: per flow, or fixed (default flow for ipip, else fixed)")
    s.add_argument("--server-id-from", choices=SERVER_ID_FROMS, default="none",
                   help="where packets carry their real's server id: QUIC connection ids, Katran's UDP "
                        "stable-routing header or TCP option 183 (default %(default)s)")
    s.add_argument("--udp-flow-migration", action="store_true",
                   help="UDP sessions to a real that health checks take down are moved to another")
    _json(s, "with list: print the VIPs as JSON")


def add_real(s: argparse.ArgumentParser) -> None:
    s.add_argument("action", choices=("add", "del", "set-weight", "list"),
                   help="what to do: add, del, set-weight or list")
    _vip_key(s)
    s.add_argument("real", nargs="?", help="real address (all actions but list)")
    s.add_argument("--weight", type=weight, default=1, help="the real's weight, 0..65535 (default %(default)s)")
    s.add_argument("--server-id", type=server_id, metavar="N",
                   help="with add: the real's server id (what QUIC connection ids or TCP option 183 carry)")
    _json(s, "with list: print the reals as JSON")


def add_src_route(s: argparse.ArgumentParser) -> None:
    s.add_argument("action", choices=("add", "del", "list"), help="what to do: add, del or list")
    _vip_key(s, "VIP address (or prefix)")
    s.add_argument("prefix", nargs="?", help="the client prefix (add and del)")
    s.add_argument("real", nargs="?", help="the real its new flows go to (add)")
    _json(s, "with list: print the pins as JSON")


def add_decap(s: argparse.ArgumentParser) -> None:
    s.add_argument("action", choices=("add", "del", "list"), help="what to do: add, del or list")
    s.add_argument("address", nargs="?", help="an address of this LB (add and del)")
    s.add_argument("--action", dest="action_name", choices=DECAP_ACTIONS, default="balance",
                   help="the inner packet is balanced, handed to this host, or sent back out (default %(default)s)")
    _json(s, "with list: print the addresses as JSON")


def add_run(s: argparse.ArgumentParser) -> None:
    s.add_argument("--config", "-c", required=True, metavar="FILE", help="the TOML config (reread on SIGHUP)")
    s.add_argument("--interface", "-i", action="append", default=[], metavar="IF", help=_INTERFACE_HELP)
    s.add_argument("--mode", choices=("native", "generic", "auto"), help=_MODE_HELP)
    s.add_argument("--object", default="", metavar="OBJECT", help=_RUN_OBJECT_HELP)
    s.add_argument("--force-reload", action="store_true", help=_FORCE_HELP)


def add_completion(s: argparse.ArgumentParser) -> None:
    s.add_argument("shell", choices=("bash",), help="the shell (bash)")
