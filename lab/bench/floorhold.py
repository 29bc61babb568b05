"""`python -m lab.bench.floorhold`: hold one floor program (build/bpf/floor.o) on an interface for as long as asked.

    python -m lab.bench.floorhold --interface IF --program xdp_tx_swap|xdp_drop [--mode native|generic]

The hardware bench (lab/bench/trex.py) runs this on the LB host over ssh. It attaches the program
through a BPF link that only this process holds, prints `attached`, then answers every line read on
standard input with one line: the packets the program's `fl_count` map has counted (summed over the
CPUs). End of input (the bench closed it, or ssh went away), SIGTERM, SIGINT and SIGHUP close the
link, which detaches the program, and the process exits 0. A failed attach prints one line on
standard error and exits 1; a bad command line exits 2.
"""

from __future__ import annotations

import argparse
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import NoReturn

from balancer.errors import LbError
from balancer.libbpf import BpfObject

FLOOR_OBJECT = Path(__file__).resolve().parents[2] / "build" / "bpf" / "floor.o"
PROGRAMS = ("xdp_drop", "xdp_tx_swap")


class _Stop(Exception):
    """A signal asked the hold to end."""


def _stop(signum: int, frame: FrameType | None) -> NoReturn:
    raise _Stop(signal.Signals(signum).name)


def _count(obj: BpfObject) -> int:
    values = obj.map("fl_count").lookup_percpu(b"\0" * 4) or []
    return sum(int.from_bytes(v[:8], sys.byteorder) for v in values)


def hold(ifname: str, program: str, mode: str) -> int:
    """Attach, answer count requests until end of input or a signal, detach; the exit status."""
    if not FLOOR_OBJECT.is_file():
        print(f"lab.bench.floorhold: BPF object {FLOOR_OBJECT} does not exist; run `make bpf` there", file=sys.stderr)
        return 1
    try:
        ifindex = socket.if_nametoindex(ifname)
    except OSError:
        print(f"lab.bench.floorhold: no interface '{ifname}' on {socket.gethostname()}; check the target file's "
              "interfaces table", file=sys.stderr)
        return 1
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _stop)
    obj = link = None
    try:
        obj = BpfObject(str(FLOOR_OBJECT))
        obj.load()
        link = obj.program(program).attach_xdp(ifindex, mode, ifname)
        print("attached", flush=True)
        for _ in sys.stdin:
            print(_count(obj), flush=True)
    except LbError as exc:
        print(f"lab.bench.floorhold: {exc}", file=sys.stderr)
        return 1
    except (_Stop, BrokenPipeError):
        pass  # a signal or a closed pipe ends the hold; the finally block detaches
    finally:
        if link is not None:
            link.close()  # the only reference to the link: closing it detaches the program
        if obj is not None:
            obj.close()
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"lab.bench.floorhold: {message}", file=sys.stderr)
        raise SystemExit(2)


def main(argv: Sequence[str] | None = None) -> int:
    parser = _Parser(prog="python -m lab.bench.floorhold", description=__doc__.splitlines()[0])
    parser.add_argument("--interface", required=True, metavar="IF")
    parser.add_argument("--program", required=True, choices=PROGRAMS)
    parser.add_argument("--mode", choices=("native", "generic"), default="native")
    args = parser.parse_args(argv)
    return hold(args.interface, args.program, args.mode)


if __name__ == "__main__":
    raise SystemExit(main())
