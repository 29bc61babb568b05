"""The `l4lab` command: a table of verbs (up, down, status, exec, shell), each a parser and a function.

Add a verb by writing `_add_<verb>(parser)` and `_run_<verb>(args) -> int` and one row in VERBS.
Usage and configuration errors print one line on stderr and exit 2; runtime errors exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from balancer import completion
from balancer.errors import LbError, crash_report
from balancer.version import version
from lab import frr, netns, topology
from lab import status as lab_status
from lab.errors import LabError, UsageError
from lab.nsexec import nsenter_argv
from lab.observe.trace import Tracer
from lab.progress import StepProgress
from lab.remote import target, vagrantbox
from lab.signals import sigterm_unwinds
from lab.state import DEFAULT_LAB, LabState, check_name, netns_name


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line and a UsageError (exit 2), not a usage dump."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


@dataclass(frozen=True)
class Verb:
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    examples: tuple[str, ...] = ()
    root: bool = True  # refused up front, in one line, when not run as root


def _add_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=DEFAULT_LAB, help=f"lab name (default {DEFAULT_LAB})")


def _add_up(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topology", nargs="?", default="default", help="a name from lab/topologies or a path")
    _add_name(parser)
    parser.add_argument("--no-bpf", action="store_true", help="do not attach the lab's BPF programs")
    parser.add_argument("--no-balancer", action="store_true",
                        help="do not load the balancer on the LB nodes (lbctl load, IPIP, the topology's VIPs)")


def _run_up(args: argparse.Namespace) -> int:
    topo = topology.load(args.topology)
    started = time.monotonic()
    progress = StepProgress()  # each step named as it runs, on a terminal only
    try:
        netns.build(topo, check_name(args.name), programs=not args.no_bpf,
                    balancers=not (args.no_bpf or args.no_balancer), on_step=progress.step)
    finally:
        progress.done()
    took = time.monotonic() - started
    size = f"{len(topo.nodes)} nodes, {len(topo.links)} links"
    print(f"lab '{args.name}' up ({topo.name}: {size}) in {took:.2f} s")
    return 0


def _add_down(parser: argparse.ArgumentParser) -> None:
    _add_name(parser)


def _run_down(args: argparse.Namespace) -> int:
    started = time.monotonic()
    removed = netns.teardown(check_name(args.name))
    counts: dict[str, int] = {}
    for kind, _what in removed:
        counts[kind] = counts.get(kind, 0) + 1
    names = {"balancer": "balancer instance", "process": "process", "pin": "pin", "pin-dir": "pin directory",
             "veth": "veth", "netns": "namespace", "state-dir": "state directory"}
    plural = {"process": "processes", "pin directory": "pin directories", "state directory": "state directories"}
    words = [(n, names.get(kind, kind)) for kind, n in counts.items()]
    summary = ", ".join(f"{n} {w if n == 1 else plural.get(w, w + 's')}" for n, w in words) or "nothing was left"
    print(f"lab '{args.name}' down in {time.monotonic() - started:.2f} s; removed {summary}")
    for kind, what in removed:
        if kind == "balancer":  # named: a daemon or a failed lbctl may have changed them
            print(f"  {what}")
    return 0


def _add_status(parser: argparse.ArgumentParser) -> None:
    _add_name(parser)
    parser.add_argument("--json", action="store_true", help="print the status as JSON")


def _run_status(args: argparse.Namespace) -> int:
    report = lab_status.collect(check_name(args.name))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(lab_status.render(report))
    return 0


def _add_exec(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", help="the node to run in (a name from the topology: client, lb, real1...)")
    _add_name(parser)


def _node_netns(args: argparse.Namespace) -> str:
    state = LabState.load(check_name(args.name))
    topo = topology.load(Path(state.topology_path))
    return netns_name(args.name, topo.node(args.node).name)


def _is_vm(args: argparse.Namespace) -> bool:
    state = LabState.load(check_name(args.name))
    return topology.load(Path(state.topology_path)).node(args.node).kind == "vm"


def _run_exec(args: argparse.Namespace) -> int:
    command: list[str] = args.command
    if not command:
        raise UsageError(
            "l4lab exec: give a command after --, e.g. l4lab exec client -- ping -c1 203.0.113.18"
        )
    ns = _node_netns(args)
    if _is_vm(args):  # over its control channel: output and exit status, no terminal
        from lab.remote import vmnodes  # qemu plans and the VM control channel: only VM nodes need them

        done = vmnodes.run(args.name, args.node, command, timeout=600.0)
        sys.stdout.write(done.stdout)
        return done.returncode

    command = frr.exec_argv(args.name, args.node, command)  # vtysh finds the node's own FRR daemons
    try:
        return subprocess.run(nsenter_argv(ns, command), check=False).returncode
    except OSError as exc:
        raise LabError(f"cannot run {command[0]} in {ns}: {exc.strerror}", command=" ".join(command)) from exc


def _add_shell(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("node", help="the node to open a shell in (a name from the topology)")
    _add_name(parser)


def _run_shell(args: argparse.Namespace) -> int:
    ns = _node_netns(args)
    shell = os.environ.get("SHELL", "/bin/bash")
    argv = nsenter_argv(ns, [shell])
    os.execv(argv[0], argv)


def _add_trace(parser: argparse.ArgumentParser) -> None:
    _add_name(parser)
    parser.add_argument("--node", action="append", default=[], metavar="NODE",
                        help="trace only this node (repeatable; default every node of the lab)")
    parser.add_argument("--seconds", type=float, default=None, metavar="S",
                        help="trace for S seconds (default until Ctrl-C)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def _run_trace(args: argparse.Namespace) -> int:
    import threading

    if args.seconds is not None and args.seconds <= 0:
        raise UsageError(f"l4lab trace: --seconds must be positive but got {args.seconds:g}")
    with Tracer(check_name(args.name), args.node or None) as tracer:
        if not args.json:
            until = f"for {args.seconds:g} s" if args.seconds is not None else "until Ctrl-C"
            print(f"tracing lab '{args.name}' ({', '.join(tracer.nodes)}) {until}", file=sys.stderr)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait(args.seconds)  # the measurement window, not synchronisation
        report = tracer.report()
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.render())
    return 0


def _add_vagrant_plan(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("topology", nargs="?", default="default", help="a name from lab/topologies or a path")
    parser.add_argument("--lb-config", metavar="NODE", help="print LB node NODE's balancer config (TOML) instead")
    parser.add_argument("--box", default=os.environ.get("L4LAB_BOX") or "public",
                        help="public (debian/bookworm64, the default), local (built by `l4lab vagrant-box`) "
                             "or a box name; default $L4LAB_BOX")
    parser.add_argument("--box-init", default=os.environ.get("L4LAB_BOX_INIT") or "systemd",
                        choices=("systemd", "light"),
                        help="the local box's init: systemd (the default) or light (file systems, DHCP and sshd "
                             "only: quicker under TCG, what the smoke boots); default $L4LAB_BOX_INIT")
    parser.add_argument("--name", default=os.environ.get("L4LAB_VAGRANT_NAME") or None,
                        help="the lab's name in libvirt (domains l4lab-vg-NAME-NODE); default $L4LAB_VAGRANT_NAME "
                             "or the topology's name")


def _run_vagrant_plan(args: argparse.Namespace) -> int:
    from lab.remote import vagrant  # the Vagrant planner reads balancer configs (numpy): only this verb loads it

    topo = topology.load(args.topology)
    if args.lb_config is not None:
        if topo.node(args.lb_config).role != "lb":
            raise UsageError(f"l4lab vagrant-plan: node '{args.lb_config}' of topology '{topo.name}' is no LB")
        print(vagrant.lb_config(topo, args.lb_config), end="")
    else:
        print(json.dumps(vagrant.plan(topo, args.box, lab=args.name, init=args.box_init), indent=1))
    return 0


def _add_target(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--netns", metavar="NAME", help="a running netns lab (its nodes reached through sshd -i)")
    which.add_argument("--vagrant", metavar="TOPOLOGY", help="the Vagrant lab of TOPOLOGY (after `vagrant up`)")
    parser.add_argument("--out", metavar="DIR", type=Path, required=True,
                        help="folder for target.toml and its ssh config (and keys, for --netns)")


def _run_target(args: argparse.Namespace) -> int:
    if args.netns is not None:
        lab = check_name(args.netns)
        path = target.for_netns_lab(lab, LabState.load(lab).topology_path, args.out.resolve())
    else:
        path = target.for_vagrant(args.vagrant, args.out.resolve())
    print(f"wrote {path}; run the hardware-marked suites with: pytest suites/ --target {path}")
    return 0


def _add_passthrough(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("args", nargs=argparse.REMAINDER, help="options of the verb (see VERB --help)")


PASSTHROUGH = ("demo", "report", "bench", "nic-queues", "conform", "vagrant-box")


def _run_demo(args: argparse.Namespace) -> int:
    from lab import demo  # the demo (numpy, the balancer config): only this verb loads it

    return demo.main(args.args)


def _run_bench(args: argparse.Namespace) -> int:
    from lab.bench import cli as bench  # the benches (numpy, libbpf): only this verb loads them

    return bench.main(args.args)


def _run_nic_queues(args: argparse.Namespace) -> int:
    from lab.rss import nic  # numpy for the spread statistics: only this verb loads it

    return nic.main(args.args)


def _run_conform(args: argparse.Namespace) -> int:
    from lab.dut import conform  # every DUT adapter (numpy): only this verb loads them

    return conform.main(args.args)


def _run_vagrant_box(args: argparse.Namespace) -> int:
    return vagrantbox.main(args.args)


def _run_report(args: argparse.Namespace) -> int:
    from reports import render  # jinja2 and pandas (the report extra): only this verb loads them

    return render.main(args.args)


def _add_completion(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=("bash",), help="the shell (bash)")


def _run_completion(args: argparse.Namespace) -> int:
    print(completion.bash(parser()), end="")
    return 0


VERBS: dict[str, Verb] = {
    "up": Verb("build a lab from a topology", _add_up, _run_up,
               ("l4lab up", "l4lab up scaleout --name mylab", "l4lab up ./my.toml --no-balancer")),
    "down": Verb("remove a lab", _add_down, _run_down, ("l4lab down", "l4lab down --name mylab")),
    "status": Verb("show a lab's nodes, links, addresses, programs and VIPs", _add_status, _run_status,
                   ("l4lab status", "l4lab status --name mylab --json")),
    "exec": Verb("run a command in a node: l4lab exec NODE -- CMD...", _add_exec, _run_exec,
                 ("l4lab exec client -- ping -c1 203.0.113.18", "l4lab exec lb -- lbctl stats")),
    "shell": Verb("open a shell in a node", _add_shell, _run_shell, ("l4lab shell real1",)),
    "demo": Verb("balance real traffic through the default lab in every encap mode", _add_passthrough,
                 _run_demo, ("l4lab demo", "l4lab demo --encap ip4-gue1 --requests 200")),
    "bench": Verb("NDR/PDR per encap and frame size beside the XDP_TX/XDP_DROP floors; micro and "
                  "controller benchmarks", _add_passthrough, _run_bench,
                  ("l4lab bench", "l4lab bench --quick --encap ip4-ipip")),
    "nic-queues": Verb("per-queue RX packets of a NIC over an interval and their spread (RSS on hardware)",
                       _add_passthrough, _run_nic_queues,
                       ("l4lab nic-queues eth0 --seconds 10", "l4lab nic-queues r1-rt --name l4lab --node real1"),
                       root=False),
    "report": Verb("render results JSON into one HTML report", _add_passthrough, _run_report,
                   ("l4lab report", "l4lab report --compare HEAD~1 HEAD"), root=False),
    "conform": Verb("run the conformance checks against each device under test (l4lab, ipvs) and print "
                    "the matrix", _add_passthrough, _run_conform, ("l4lab conform --dut ipvs --no-report",)),
    "trace": Verb("count XDP exceptions, XDP bulk-TX errors and drop reasons per node", _add_trace,
                  _run_trace, ("l4lab trace --seconds 10", "l4lab trace --node lb --json")),
    "target": Verb("write a target file (hardware mode: suites over SSH) for a Vagrant or a running netns lab",
                   _add_target, _run_target, ("l4lab target --netns l4lab --out build/target",
                                              "l4lab target --vagrant default --out build/vg")),
    "vagrant-plan": Verb("print the Vagrant machines a topology implies, as JSON (read by the Vagrantfile)",
                         _add_vagrant_plan, _run_vagrant_plan,
                         ("l4lab vagrant-plan default", "l4lab vagrant-plan default --lb-config lb"), root=False),
    "vagrant-box": Verb("build the local Debian 12 libvirt box (no Vagrant Cloud needed) and add it to Vagrant",
                        _add_passthrough, _run_vagrant_box, ("l4lab vagrant-box",)),
    "completion": Verb("print a shell completion script", _add_completion, _run_completion,
                       ("l4lab completion bash >/etc/bash_completion.d/l4lab", "source <(l4lab completion bash)"),
                       root=False),
}


def parser() -> argparse.ArgumentParser:
    examples = "examples:\n" + "\n".join(f"  {v.examples[0]}" for v in VERBS.values())
    top = _Parser(prog="l4lab", description="the l4lab lab: netns topologies for the XDP load balancer",
                  epilog=examples, formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"l4lab {version()}",
                     help="print the version of l4lab and exit")
    sub = top.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    sub.required = True
    for name, verb in VERBS.items():
        verb.add_arguments(sub.add_parser(name, help=verb.help, description=verb.help, epilog=_examples(verb),
                                          formatter_class=argparse.RawDescriptionHelpFormatter))
    return top


def _examples(verb: Verb) -> str:
    return "examples:\n" + "\n".join(f"  {e}" for e in verb.examples)


def _require_root(verb: str) -> None:
    """Refuse a verb that builds or reads labs when not root, before it changes anything."""
    if VERBS[verb].root and os.geteuid() != 0:
        raise LabError(f"`l4lab {verb}` must run as root (it works with network namespaces, links and BPF "
                       f"programs): run it with sudo")


def _dispatch(args_list: list[str], head: list[str], tail: list[str]) -> int:
    """Parse and run one verb (main() turns its errors and interrupts into messages and exit codes)."""
    if args_list and args_list[0] in PASSTHROUGH:
        # Verbs with options of their own: everything after the verb is theirs.
        verb = VERBS[args_list[0]]
        if {"-h", "--help"} & set(args_list[1:]):  # the verb's own help, then l4lab's examples of it
            with contextlib.suppress(SystemExit):
                verb.run(argparse.Namespace(args=args_list[1:]))
            print("\n" + _examples(verb))
            return 0
        _require_root(args_list[0])
        return verb.run(argparse.Namespace(args=args_list[1:]))
    args = parser().parse_args(head)
    args.command = tail
    _require_root(args.verb)
    return VERBS[args.verb].run(args)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `l4lab ARGV`; return the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    # Everything after the first `--` is a command for `exec`, never options of l4lab.
    head, tail = (
        (args_list[: args_list.index("--")], args_list[args_list.index("--") + 1 :])
        if "--" in args_list
        else (args_list, [])
    )
    try:
        with sigterm_unwinds():  # `timeout`, systemd or a closed terminal: a half-built lab unwinds as on Ctrl-C
            return _dispatch(args_list, head, tail)
    except LabError as exc:
        print(f"l4lab: {exc}", file=sys.stderr)
        return exc.exit_code
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    except KeyboardInterrupt:
        print("l4lab: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a failure of the controller's own errors, shown in one line

        if isinstance(exc, LbError):
            print(f"l4lab: {exc}", file=sys.stderr)
            return 1
        if isinstance(exc, PermissionError):  # run without root: say so rather than log a traceback
            print(f"l4lab: {exc.strerror or exc}; run l4lab as root (it needs CAP_SYS_ADMIN and CAP_NET_ADMIN)",
                  file=sys.stderr)
            return 1
        print(crash_report("l4lab", exc, ("/run/l4lab",)), file=sys.stderr)  # a bug: the traceback goes to a log
        return 1


if __name__ == "__main__":
    sys.exit(main())
