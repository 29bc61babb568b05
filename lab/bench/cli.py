"""`l4lab bench`: its arguments, options and dispatch to the software bench (lab/bench/run.py), the
hardware bench over TRex (lab/bench/trex.py) or Katran side by side (lab/bench/katran.py).

Kept apart from the benches: they share the model (model.py) and never import this dispatcher.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from balancer.errors import LbError
from lab.bench.gen.base import FrameSpec, check_frame_spec
from lab.bench.model import ENCAPS, FULL_SIZES, PARTS, QUICK_SIZES, Options
from lab.bench.run import bench
from lab.bench.testbed import check_environment
from lab.errors import LabError, UsageError
from lab.signals import sigterm_unwinds
from reports.schema import ResultsError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true",
                        help="64-byte frames, short trials, 5 %% width (finishes within 5 minutes)")
    parser.add_argument("--encap", action="append", metavar="ID", choices=list(ENCAPS),
                        help=f"encap id, repeatable (default all: {', '.join(ENCAPS)})")
    parser.add_argument("--sizes", metavar="LIST",
                        help="comma-separated frame sizes 64..1518 and/or imix (default: 64 with --quick, "
                             "else 64,128,256,512,1024,1280,1518,imix)")
    parser.add_argument("--parts", metavar="LIST",
                        help=f"comma-separated parts to run (default {','.join(PARTS)}; ndr with --trex)")
    parser.add_argument("--flows", type=int, default=1024, help="UDP flows per trial (default 1024)")
    parser.add_argument("--max-rate-mpps", type=float, metavar="X",
                        help="the highest rate the search tries, Mpps (default 12; with --trex the LB "
                             "link's line rate at each frame size)")
    parser.add_argument("--trex", metavar="TARGET.toml", type=Path,
                        help="measure on hardware: the TRex server and LB host of this target file "
                             "(its [trex] table; see lab/remote/target.py), reached over SSH")
    parser.add_argument("--katran", metavar="PATH", nargs="?", const="",
                        help="time l4lab and Katran side by side: Katran is built from the checkout at PATH "
                             "(default $L4LAB_KATRAN_SRC); see lab/bench/katran.py")
    parser.add_argument("--baseline", metavar="OBJ", type=Path,
                        help="with --katran: also time this balancer.o (a variant, or an older build in its own "
                             "checkout, whose controller programs it if its contract differs) in the "
                             "same rounds and print l4lab against it; with --profile: profile it instead")
    parser.add_argument("--seed", metavar="N", type=int,
                        help="with --katran: the seed of the shuffled order (printed by every run), to replay it")
    parser.add_argument("--prefill", metavar="FRACTION", type=float, default=0.0,
                        help="with --katran: fill every session table this much (0 to 0.9 of its entries) with "
                             "other flows before each round, so new flows are timed into a used table")
    parser.add_argument("--profile", metavar="ID", choices=list(ENCAPS),
                        help="sample the live loop with perf while the balancer serves this encap and print "
                             "where its time per frame goes, by source line (lab/bench/profile.py); "
                             "--baseline OBJ profiles that object instead")
    parser.add_argument("--results", metavar="DIR", type=Path,
                        help="results directory (default $L4LAB_RESULTS or results/)")


def parse_sizes(text: str) -> tuple[FrameSpec, ...]:
    sizes: list[FrameSpec] = []
    for item in text.split(","):
        item = item.strip()
        value: FrameSpec
        if item == "imix":
            value = "imix"
        else:
            try:
                value = int(item)
            except ValueError:
                raise UsageError(f"--sizes must list frame sizes 64..1518 or imix but got {item!r}") from None
        try:
            check_frame_spec(value)
        except LabError as exc:
            raise UsageError(f"--sizes: {exc}") from None
        sizes.append(value)
    if not sizes:
        raise UsageError("--sizes must list at least one frame size")
    return tuple(sizes)


def options(args: argparse.Namespace) -> Options:
    parts_text = args.parts if args.parts is not None else ",".join(PARTS)
    parts = tuple(p.strip() for p in parts_text.split(",") if p.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown or not parts:
        raise UsageError(f"--parts must list some of {', '.join(PARTS)} but got {parts_text!r}")
    if not 1 <= args.flows <= 1 << 20:
        raise UsageError(f"--flows must be 1..{1 << 20} but got {args.flows}")
    rate = args.max_rate_mpps
    if rate is not None and not (math.isfinite(rate) and 0.01 < rate <= 1000):
        raise UsageError(f"--max-rate-mpps must be a rate above 0.01 and at most 1000 Mpps but got {rate:g}")
    sizes = parse_sizes(args.sizes) if args.sizes else (QUICK_SIZES if args.quick else FULL_SIZES)
    encaps = tuple(dict.fromkeys(args.encap)) if args.encap else tuple(ENCAPS)
    extra: dict[str, Any] = {}
    if rate is not None:
        extra.update(max_rate_pps=rate * 1e6, max_rate_given=True)
    if args.trex is not None:
        if args.parts is not None and parts != ("ndr",):
            raise UsageError(f"--parts {parts_text!r}: with --trex only ndr runs; the micro and controller "
                             "benchmarks measure the machine they run on: run `l4lab bench --parts "
                             "micro,controller` on the LB itself")
        parts = ("ndr",)
        extra.update(trex=args.trex, result_id="bench_trex_ndr_pdr")
    return Options(encaps=encaps, sizes=sizes, parts=parts, results=args.results, flows=args.flows,
                   quick=args.quick, **extra)


def run(args: argparse.Namespace) -> int:
    """The verb's body for lab/cli.py: errors propagate as LabError / UsageError (exit 1 / 2); SIGTERM
    and SIGHUP as KeyboardInterrupt, so every bench removes its testbed as on Ctrl-C."""
    with sigterm_unwinds():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.katran is not None and args.profile is not None:
        raise UsageError("--katran and --profile are separate runs: give one of them")
    if args.katran is not None:
        from lab.bench import katran as katranbench  # Katran's build and driver (lab/dut): only --katran loads them

        check_environment()
        if args.seed is not None and not 0 <= args.seed < 1 << 32:
            raise UsageError(f"--seed must be 0..{(1 << 32) - 1} but got {args.seed}")
        if not 0 <= args.prefill <= 0.9:
            raise UsageError(f"--prefill must be 0 to 0.9 (of each table's entries) but got {args.prefill}")
        katranbench.run(katranbench.options(args.katran or None, args.quick, args.results, args.baseline, args.seed,
                                            args.prefill))
        return 0
    if args.seed is not None:
        raise UsageError("--seed replays the order of a side-by-side run: it needs --katran")
    if args.prefill:
        raise UsageError("--prefill fills the side-by-side run's session tables: it needs --katran")
    if args.profile is not None:
        from lab.bench import profile  # perf's sampling: only --profile loads it

        check_environment()
        profile.run(args.profile, obj=args.baseline)
        return 0
    if args.baseline is not None:
        raise UsageError("--baseline times another balancer object beside l4lab and Katran: it needs --katran "
                         "(or --profile, to profile it)")
    opts = options(args)
    if opts.trex is not None:
        from lab.bench import trex as trexbench  # the remote target and TRex's plumbing: only --trex loads them

        trexbench.bench_trex(opts)
    else:
        bench(opts)
    return 0


class _Parser(argparse.ArgumentParser):
    """Errors are one line and a UsageError (exit 2), not a usage dump."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def main(argv: Sequence[str] | None = None) -> int:
    """`l4lab bench` as a function: 0 on success, 2 for usage errors, 1 for runtime errors."""
    parser = _Parser(prog="l4lab bench", description=__doc__.split("\n\n")[0].replace("\n", " "))
    add_arguments(parser)
    try:
        args = parser.parse_args(argv)
        return run(args)
    except UsageError as exc:
        _say_error(exc)
        return 2
    except LabError as exc:
        _say_error(exc)
        return 1
    except KeyboardInterrupt:
        print("l4lab bench: interrupted (what the bench had set up is removed)", file=sys.stderr)
        return 130
    except Exception as exc:  # balancer errors (LbError) and results errors name their cause

        if isinstance(exc, LbError | ResultsError):
            _say_error(exc)
            return 1
        raise


def _say_error(exc: BaseException) -> None:
    """The error in one line, then one line per note (a clean-up that failed while it unwound)."""
    print(f"l4lab bench: {exc}", file=sys.stderr)
    for note in getattr(exc, "__notes__", []):
        print(f"l4lab bench: also: {note}", file=sys.stderr)


if __name__ == "__main__":
    raise SystemExit(main())
