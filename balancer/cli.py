"""cli.py: `lbctl`, the operator's command line over a balancer instance.

    lbctl load --interface IF [--mode native|generic|auto] [--config FILE]
    lbctl apply FILE | lbctl status [--json] | lbctl stats [--json] [--watch S] | lbctl unload
    lbctl vip add|del|list ...   lbctl real add|del|set-weight|list ...
    lbctl run --config FILE      (daemon: health checks, metrics, reload on SIGHUP)

Usage and config errors print one line and exit 2; runtime errors exit 1. Before a verb touches
the instance, the host is checked (balancer/preflight.py: bpffs visible, capabilities, pins behind
a state file) and commands that write take the instance's lock. A running daemon holds it: then
the write is handed to it or refused naming the command that works (balancer/handover.py). A
refusal is one line, exit 1, and nothing has changed. Any other failure prints one line naming
the log file that holds its traceback.

Add a verb as `l4lab`'s are added (lab/cli.py): `add_<verb>(parser)` in balancer/cli_args.py,
`cmd_<verb>(args) -> int` here, one row in VERBS.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import json
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from balancer import cli_args, cli_routes, completion, controller, preflight
from balancer import config as cfg
from balancer.controller import Instance, ring_kind
from balancer.datapath import Datapath, xdp_link_ifindex
from balancer.errors import AbiMismatchError, ConfigError, InstanceOwnedError, LbError, crash_report
from balancer.handover import hand_over
from balancer.version import version


class UsageError(Exception):
    """A command line that cannot be carried out as written (exit 2)."""


def _instance(args: argparse.Namespace) -> Instance:
    _check_pins(args.instance, [])
    try:
        return Instance.open(args.instance)
    except (ValueError, TypeError, KeyError) as exc:  # JSONDecodeError is a ValueError
        path = Instance.state_path(args.instance)
        raise LbError(f"the state file {path} of instance '{args.instance}' is damaged ({exc}): lbctl cannot "
                      f"tell what the datapath runs; restore it, or move it away and `lbctl load --force-reload` "
                      f"once no program is attached") from exc


def _reads(args: argparse.Namespace) -> bool:
    """Whether the verb only reads the instance (no lock, fewer capabilities)."""
    return args.cmd in ("status", "stats") or getattr(args, "action", "") == "list"


def _check_host(args: argparse.Namespace) -> None:
    """Refuse, in one line and before any change, what the host cannot do for this verb."""
    caps = preflight.READ_CAPS if _reads(args) else \
        preflight.LOAD_CAPS if args.cmd in ("load", "run", "upgrade") else preflight.WRITE_CAPS
    preflight.require_caps(args.cmd, caps)
    preflight.require_bpffs(controller.PIN_ROOT)


def _check_pins(name: str, interfaces: list[str], force_reload: bool = False) -> None:
    """An instance's state without its pins is refused, or forgotten with --force-reload (load, run)."""
    state = Instance.state_path(name)
    try:
        preflight.check_pins_visible(name, state, Instance.pin_dir(name), interfaces or _state_ifaces(state))
    except LbError:
        if not force_reload:
            raise
        preflight.forget_unseen_state(name, state, interfaces or _state_ifaces(state))


def _state_ifaces(state: Path) -> list[str]:
    try:
        return list(json.loads(state.read_text()).get("interfaces", {}))
    except (OSError, ValueError):
        return []


@contextmanager
def _owned(args: argparse.Namespace) -> Iterator[None]:
    """Hold the instance's lock for a command that writes to it (a running daemon holds it too)."""
    with preflight.instance_lock(controller.STATE_ROOT, args.instance, f"lbctl {args.cmd}") as lock:
        try:
            yield
        finally:
            if not Instance.state_path(args.instance).exists():
                lock.unlink(missing_ok=True)  # no instance (unloaded, or a load that failed): no lock file


def cmd_load(args: argparse.Namespace) -> int:
    conf = cfg.load(args.config) if args.config else None
    ifaces = args.interface or (list(conf.datapath.interfaces) if conf else [])
    if not ifaces:
        raise UsageError("lbctl load needs --interface IF (or a config naming datapath.interfaces)")
    mode = args.mode or (conf.datapath.mode if conf else "native")
    _check_pins(args.instance, ifaces, args.force_reload)
    inst = Instance.load(args.instance, ifaces, mode, conf, args.object)
    modes = inst.attach_modes()
    inst.close()
    print(f"loaded instance '{args.instance}' on {', '.join(f'{i} ({m})' for i, m in modes.items())}")
    _warn_generic(modes)
    return 0


def _warn_generic(modes: dict[str, str]) -> None:
    for ifname, mode in modes.items():
        if mode == "generic":
            print(f"WARNING: XDP runs in generic (skb) mode on '{ifname}': throughput collapses; "
                  "check the driver supports native XDP and the MTU fits", file=sys.stderr)


def cmd_apply(args: argparse.Namespace) -> int:
    conf = cfg.load(args.file)
    inst = _instance(args)
    try:
        report = inst.apply(conf)
    finally:
        inst.close()
    if args.json:
        print(json.dumps({"file": args.file, **dataclasses.asdict(report)}, indent=1))
        return 0
    fields = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in dataclasses.asdict(report).items() if v)
    print(f"applied {args.file}: {fields or 'nothing to change'}")
    return 0


def cmd_upgrade(args: argparse.Namespace) -> int:
    inst = _instance(args)
    try:
        done = inst.upgrade(args.object)
    finally:
        inst.close()
    print(f"replaced the program behind {done['links']} link(s) with {args.object}; maps and sessions kept")
    return 0


def cmd_unload(args: argparse.Namespace) -> int:
    pins = Instance.pin_dir(args.instance)
    if not Instance.state_path(args.instance).exists() and Path(pins).exists():
        # Pins without a state file (a crash between the two, or a state file removed): nothing to
        # adopt, and unload is the operator's own word to remove what runs under the name.
        Datapath.unpin(pins)
        print(f"unloaded instance '{args.instance}' (it had pins under {pins} but no state file)")
        return 0
    try:
        inst = _instance(args)
    except AbiMismatchError as exc:
        # Pinned by another version of the datapath: this lbctl cannot open it, and unload is the
        # operator's way out (the error's own hint), so its pins and state go as they are.
        Datapath.unpin(pins)
        Instance.state_path(args.instance).unlink(missing_ok=True)
        print(f"unloaded instance '{args.instance}' (loaded by another version of the datapath: {exc.what})")
        return 0
    inst.unload()
    print(f"unloaded instance '{args.instance}'")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    inst = _instance(args)
    try:
        st = inst.status()
        st["missing_interfaces"] = _missing_interfaces(inst, st["interfaces"])
    finally:
        inst.close()
    if args.json:
        print(json.dumps(st, indent=1))
        return 0
    print(f"instance {st['instance']}  object {st['object']}")
    for ifname, mode in st["interfaces"].items():
        note = st["missing_interfaces"].get(ifname, "")
        print(f"  interface {ifname}: XDP {mode} (requested {st['requested_modes'].get(ifname)})"
              + (f": {note}" if note else ""))
    _warn_generic(st["interfaces"])
    if st["nexthop"]:
        print(f"  next hop {st['nexthop']['describe']}")
    eg = st["egress"]
    if eg:
        note = "" if eg["now"] == eg["ifname"] else (
            f": renamed to '{eg['now']}', frames still leave there" if eg["now"] else
            ": deleted; encapsulated frames drop as DROP_NO_EGRESS: `lbctl unload`, then load with one that exists")
        print(f"  egress {eg['ifname']}: encapsulated frames leave by XDP_REDIRECT (ifindex {eg['ifindex']}, "
              f"from {eg['mac']}, MTU {eg['mtu'] or '-'}){note}")
    for v in st["vips"]:
        extra = (f"  server ids from {v['server_id_from']}" if v.get("server_id_from", "none") != "none" else "") + \
            ("  udp flow migration" if v.get("udp_flow_migration") else "")
        print(f"  vip {v['vip']}  #{v['vip_num']}  encap {v['encap']}  hash {v['hash']}  ring {v['ring']}  "
              f"lru {'on' if v['lru'] else 'off'}  outer source {v['outer_src']}{extra}")
        for r in v["reals"]:
            health = "up" if r["healthy"] else "DOWN"
            sid = f"  server id {r['server_id']}" if r.get("server_id") is not None else ""
            print(f"    real {r['address']:<28} id {r['id']:<5} weight {r['weight']:<6} {health}{sid}")
        for pin in v.get("src_routes", []):
            print(f"    src-route {pin['prefix']} -> {pin['real']}")
    for d in st.get("decap", []):
        print(f"  decap {d['address']}  {d['action']}")
    return 0


def _missing_interfaces(inst: Instance, modes: dict[str, str]) -> dict[str, str]:
    """{interface: what became of it} for each interface of the instance that has gone by its name."""
    out = {}
    for ifname, mode in modes.items():
        if mode != "missing":
            continue
        pin = Path(Instance.pin_dir(inst.name)) / f"link_{ifname}"
        link = next((lk for lk in inst.dp.links if lk.what.endswith(str(pin))), None)
        ifindex = xdp_link_ifindex(link) if link is not None else 0
        try:
            now = socket.if_indextoname(ifindex) if ifindex else ""
        except OSError:
            now = ""
        out[ifname] = (f"renamed to '{now}' (ifindex {ifindex}); the program still runs there" if now else
                       "deleted; its XDP link is detached: `lbctl unload`, then load on an interface that exists")
    return out


def _stats_table(st: dict[str, Any], rates: dict[str, float] | None = None) -> str:
    lines = [f"{'VIP':<34}{'packets':>14}{'bytes':>16}"]
    lines += [f"{k:<34}{v['packets']:>14}{v['bytes']:>16}" for k, v in st["vips"].items()]
    lines += ["", f"{'real':<34}{'packets':>14}{'bytes':>16}"]
    lines += [f"{k:<34}{v['packets']:>14}{v['bytes']:>16}" for k, v in st["reals"].items()]
    lines += ["", f"{'reason':<34}{'packets':>14}{'bytes':>16}" + ("   pkt/s" if rates else "")]
    for k, v in st["reasons"].items():
        if v["packets"]:
            rate = f"{rates.get(k, 0.0):>10.0f}" if rates else ""
            lines.append(f"{k.lower():<34}{v['packets']:>14}{v['bytes']:>16}{rate}")
    lines += ["", "events: " + ", ".join(f"{k.lower()} {v}" for k, v in st["events"].items())]
    return "\n".join(lines)


def cmd_stats(args: argparse.Namespace) -> int:
    inst = _instance(args)
    try:
        if args.watch:
            prev, t0 = inst.stats(), time.monotonic()
            deadline = t0 + args.count * args.watch if args.count else float("inf")
            while time.monotonic() < deadline:
                time.sleep(args.watch)  # a display interval, not synchronisation
                cur, t1 = inst.stats(), time.monotonic()
                rates = {k: (v["packets"] - prev["reasons"][k]["packets"]) / (t1 - t0)
                         for k, v in cur["reasons"].items()}
                print(_stats_table(cur, rates), end="\n\n", flush=True)
                prev, t0 = cur, t1
            return 0
        st = inst.stats()
    finally:
        inst.close()
    print(json.dumps(st, indent=1) if args.json else _stats_table(st))
    return 0


def _edit(args: argparse.Namespace, change: Callable[[cfg.Config], cfg.Config]) -> int:
    inst = _instance(args)
    try:
        new = change(inst.config)
        # Round-trip through the validator so edits obey the same rules as files.
        new = cfg.loads(cfg.dump(new), "command line")
        report = inst.apply(new)
    finally:
        inst.close()
    print(f"applied: {report.writes} change(s)")
    return 0


def _vip_net(address: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    """A VIP's address, or a prefix VIP's prefix, from the command line (ValueError names what is wrong)."""
    if "/" in address:
        return ipaddress.ip_network(address, strict=True)
    return ipaddress.ip_network(ipaddress.ip_address(address))


def _find_vip(c: cfg.Config, address: str, port: int, proto: str) -> int:
    net = _vip_net(address)
    for i, v in enumerate(c.vips):
        if (v.address_text, v.port, v.proto) == (str(net) if net.num_addresses > 1 else str(net.network_address),
                                                 port, proto):
            return i
    raise UsageError(f"unknown VIP {address}:{port}/{proto}; `lbctl vip list` shows the VIPs")


def _print_rows(args: argparse.Namespace, rows: list[dict[str, Any]], line: Callable[[dict[str, Any]], str]) -> None:
    """A listing: the rows as one JSON array with --json, else one line each."""
    if args.json:
        print(json.dumps(rows, indent=1))
    for row in [] if args.json else rows:
        print(line(row))


def cmd_vip(args: argparse.Namespace) -> int:
    if args.action == "list":
        inst = _instance(args)
        try:
            vips = [{"vip": v.name, "encap": v.encap, "hash": v.hash, "ring": ring_kind(v), "lru": v.lru,
                     "outer_src": v.outer_src, "reals": len(v.reals)} for v in inst.config.vips]
            _print_rows(args, vips, lambda v: f"{v['vip']}  encap {v['encap']}  reals {v['reals']}")
        finally:
            inst.close()
        return 0

    if args.katran_ring and not args.hash.startswith("katran"):
        raise UsageError(f"--katran-ring applies only to a katran hash (--hash katran...), not --hash {args.hash}")

    def change(c: cfg.Config) -> cfg.Config:
        if args.action == "add":
            try:
                _find_vip(c, args.address, args.port, args.proto)
            except UsageError:
                net = _vip_net(args.address)
                vip = cfg.Vip(address=net.network_address, port=args.port, proto=args.proto,
                              encap=args.encap, hash=args.hash, lru=not args.no_lru,
                              outer_src=args.outer_src or ("flow" if args.encap == "ipip" else "fixed"),
                              prefix_len=net.prefixlen if net.num_addresses > 1 else None,
                              server_id_from=args.server_id_from, udp_flow_migration=args.udp_flow_migration,
                              katran_ring=args.katran_ring or "v1")
                return dataclasses.replace(c, vips=c.vips + (vip,))
            raise UsageError(f"VIP {args.address}:{args.port}/{args.proto} exists already") from None
        i = _find_vip(c, args.address, args.port, args.proto)
        return dataclasses.replace(c, vips=c.vips[:i] + c.vips[i + 1:])

    return _edit(args, change)


def cmd_real(args: argparse.Namespace) -> int:
    def change(c: cfg.Config) -> cfg.Config:
        i = _find_vip(c, args.vip, args.port, args.proto)
        vip = c.vips[i]
        addr = ipaddress.ip_address(args.real) if args.real else None
        idx = next((j for j, r in enumerate(vip.reals) if r.address == addr), None)
        if args.action == "add":
            if idx is not None:
                raise UsageError(f"real {addr} is already behind {vip.name}; use `lbctl real set-weight`")
            reals = vip.reals + (cfg.Real(address=addr, weight=args.weight,  # type: ignore[arg-type]
                                          server_id=args.server_id),)
        elif idx is None:
            raise UsageError(f"real {addr} is not behind {vip.name}; `lbctl real list` shows them")
        elif args.action == "del":
            reals = vip.reals[:idx] + vip.reals[idx + 1:]
        else:
            reals = vip.reals[:idx] + (dataclasses.replace(vip.reals[idx], weight=args.weight),) \
                + vip.reals[idx + 1:]
        vips = list(c.vips)
        vips[i] = dataclasses.replace(vip, reals=reals)
        return dataclasses.replace(c, vips=tuple(vips))

    if args.action == "list":
        inst = _instance(args)
        try:
            c = inst.config
            vip = c.vips[_find_vip(c, args.vip, args.port, args.proto)]
            reals = [{"address": str(r.address), "weight": r.weight, "id": inst.state.real_ids.get(str(r.address)),
                      "server_id": r.server_id} for r in vip.reals]
            _print_rows(args, reals, lambda r: f"{r['address']}  weight {r['weight']}  id {r['id']}")
        finally:
            inst.close()
        return 0
    return _edit(args, change)


def _listing(args: argparse.Namespace, rows: Callable[[cfg.Config], list[dict[str, Any]]],
             line: Callable[[dict[str, Any]], str]) -> int:
    inst = _instance(args)
    try:
        _print_rows(args, rows(inst.config), line)
    finally:
        inst.close()
    return 0


def cmd_src_route(args: argparse.Namespace) -> int:
    return cli_routes.src_route(args, _find_vip, _edit, _listing, UsageError)


def cmd_decap(args: argparse.Namespace) -> int:
    return cli_routes.decap(args, _edit, _listing, UsageError)


def cmd_run(args: argparse.Namespace) -> int:
    from balancer.daemon import run  # the daemon pulls in sockets and threads; only `run` needs it
    return run(args.config, args.instance, interfaces=args.interface, mode=args.mode, obj=args.object,
               force_reload=args.force_reload)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # one line, exit 2
        raise UsageError(f"{self.prog}: {message}")


@dataclass(frozen=True)
class Verb:
    """One `lbctl` verb: its one-line help, its arguments (balancer/cli_args.py), what runs it and
    example command lines (the epilog of its --help; suites/controller/test_cli.py parses each)."""

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    examples: tuple[str, ...]


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="lbctl", description="Control an l4lab XDP load balancer instance.")
    p.add_argument("--version", action="version", version=f"lbctl {version()}",
                   help="print the version of l4lab and exit")
    p.add_argument("--instance", default=os.environ.get("LBCTL_INSTANCE", "default"),
                   help="instance name (pins under /sys/fs/bpf/lbctl/NAME); env LBCTL_INSTANCE")
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=_Parser, metavar="VERB")
    for name, verb in VERBS.items():
        epilog = "examples:\n" + "\n".join(f"  {e}" for e in verb.examples)
        s = sub.add_parser(name, help=verb.help, description=verb.help, epilog=epilog,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        verb.add_arguments(s)
        s.set_defaults(fn=verb.run)
    return p


def cmd_completion(args: argparse.Namespace) -> int:
    print(completion.bash(build_parser()), end="")
    return 0


VERBS: dict[str, Verb] = {
    "load": Verb("load and attach the balancer", cli_args.add_load, cmd_load,
                 ("lbctl load --interface eth0 --config /etc/l4lab/lb.toml",
                  "lbctl --instance edge load -i eth0 -i eth1 --mode generic")),
    "apply": Verb("reconcile the datapath with a config file", cli_args.add_apply, cmd_apply,
                  ("lbctl apply /etc/l4lab/lb.toml", "lbctl apply lb.toml --json")),
    "upgrade": Verb("replace the running program without dropping a flow (through `lbctl run` when it owns "
                    "the instance)", cli_args.add_upgrade, cmd_upgrade,
                    ("lbctl upgrade", "lbctl upgrade --object /opt/l4lab/balancer.o")),
    "unload": Verb("detach and remove the instance", cli_args.add_nothing, cmd_unload,
                   ("lbctl unload", "lbctl --instance edge unload")),
    "status": Verb("interfaces, attach modes, VIPs and reals", cli_args.add_status, cmd_status,
                   ("lbctl status", "lbctl status --json")),
    "stats": Verb("counters per VIP, real and reason", cli_args.add_stats, cmd_stats,
                  ("lbctl stats --json", "lbctl stats --watch 1 --count 10")),
    "vip": Verb("add, delete or list VIPs", cli_args.add_vip, cmd_vip,
                ("lbctl vip add 198.51.100.10 80 tcp --encap gue1", "lbctl vip del 198.51.100.10 80 tcp",
                 "lbctl vip list --json")),
    "real": Verb("add, delete, reweight or list the reals of a VIP", cli_args.add_real, cmd_real,
                 ("lbctl real add 198.51.100.10 80 tcp 203.0.113.18 --weight 2",
                  "lbctl real set-weight 198.51.100.10 80 tcp 203.0.113.18 --weight 0",
                  "lbctl real list 198.51.100.10 80 tcp --json")),
    "src-route": Verb("pin client prefixes of a VIP to a real (new flows; the longest prefix wins)",
                      cli_args.add_src_route, cmd_src_route,
                      ("lbctl src-route add 198.51.100.10 443 udp 192.0.2.0/24 203.0.113.18",
                       "lbctl src-route del 198.51.100.10 443 udp 192.0.2.0/24",
                       "lbctl src-route list 198.51.100.10 443 udp")),
    "decap": Verb("addresses of this LB whose IPIP / GUE packets it decapsulates", cli_args.add_decap, cmd_decap,
                  ("lbctl decap add 198.51.100.7 --action balance", "lbctl decap del 198.51.100.7",
                   "lbctl decap list")),
    "run": Verb("daemon: health checks, metrics, reload on SIGHUP", cli_args.add_run, cmd_run,
                ("lbctl run --config /etc/l4lab/lb.toml", "lbctl run -c lb.toml -i eth0 --mode auto")),
    "completion": Verb("print a shell completion script", cli_args.add_completion, cmd_completion,
                       ("source <(lbctl completion bash)", "lbctl completion bash >/etc/bash_completion.d/lbctl")),
}


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if getattr(args, "cmd", "") == "vip" and args.action in ("add", "del") and \
                (args.address is None or args.port is None or args.proto is None):
            raise UsageError(f"lbctl vip {args.action} needs ADDRESS PORT PROTO")
        if getattr(args, "cmd", "") == "real" and args.action != "list" and not args.real:
            raise UsageError(f"lbctl real {args.action} needs the real's address")
        if args.cmd == "completion":  # prints text only: no host, no instance
            return int(args.fn(args))
        if args.cmd != "run":  # the daemon checks the host itself and logs refusals as JSON
            _check_host(args)
        if args.cmd in ("run", "status", "stats") or _reads(args):
            result: int = args.fn(args)
        else:
            try:
                with _owned(args):
                    result = args.fn(args)
            except InstanceOwnedError as owned:  # `lbctl run` holds it: hand the write over, or say what works

                result = hand_over(args, owned)
        return result
    except (UsageError, ConfigError) as exc:
        print(f"lbctl: {exc}" if not str(exc).startswith("lbctl") else str(exc), file=sys.stderr)
        return 2
    except ValueError as exc:  # bad addresses from the command line
        print(f"lbctl: {exc}", file=sys.stderr)
        return 2
    except LbError as exc:
        print(f"lbctl: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except PermissionError as exc:  # no HostError check caught it (file modes, a non-root owner): say so
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"lbctl: {exc.strerror or exc}{where}; run lbctl as root", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - a bug or an unforeseen host failure: one line, traceback in a log
        print(crash_report("lbctl", exc, (controller.STATE_ROOT,)), file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
