"""Another balancer object (`--baseline`, e.g. an older build) timed beside this checkout's, checked first.

The bench programs a baseline's maps with this checkout's controller, so a baseline must carry the
same BTF contract (balancer/_abi.py); the Katran side by side and the profile both take one. The
side by side also takes an object of another contract built in another checkout by `make bpf`
(CHECKOUT/build/bpf/balancer.o): that checkout's controller programs it (lab/bench/foreign.py).
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import ExitStack
from pathlib import Path

from balancer import _abi
from balancer.btf import read_contract
from balancer.errors import AbiMismatchError
from lab.bench.foreign import ForeignBaseline, checkout_of
from lab.errors import LabError


def check_baseline(path: Path, foreign: bool = False) -> ForeignBaseline | None:
    """Refuse a baseline object that cannot be programmed: not a file, or a BTF contract (structs,
    enums, maps, load-time constants) other than balancer/_abi.py's, unless `foreign` and the object
    lies in the checkout that built it (then that checkout programs it: returned)."""
    if not path.is_file():
        raise LabError(f"--baseline {path}: no such file (a balancer.o built by `make bpf`, e.g. in a "
                       "worktree of an older commit)")
    try:
        got = read_contract(str(path)).digest()
    except AbiMismatchError as exc:
        raise LabError(f"--baseline {path}: not a BPF object with BTF ({exc})") from None
    want = _abi.DIGESTS["balancer"]
    if got == want:
        return None
    checkout = checkout_of(path) if foreign else None
    if checkout is None:
        where = (" or be the build/bpf/balancer.o of the checkout that built it, whose controller then "
                 "programs it") if foreign else ""
        raise LabError(f"--baseline {path}: its BTF contract ({got}) differs from this checkout's "
                       f"balancer/_abi.py ({want}); the bench programs its maps with this checkout's "
                       f"layout, so a baseline must be built from a commit with the same contract{where}")
    return ForeignBaseline(path, checkout)


def baseline_object(stack: ExitStack, path: Path) -> Path:
    """A copy of the baseline named balancer.o in a private folder, removed with the stack: the loader
    finds an object's contract by its file name, so the object itself may be called anything."""
    check_baseline(path)
    return _private_copy(stack, path)


def any_baseline(stack: ExitStack, path: Path) -> Path | ForeignBaseline:
    """baseline_object()'s copy, or an object of another contract with the checkout that programs it."""
    other = check_baseline(path, foreign=True)
    return other if other is not None else _private_copy(stack, path)


def _private_copy(stack: ExitStack, path: Path) -> Path:
    folder = Path(tempfile.mkdtemp(prefix="l4lab-baseline-"))
    stack.callback(shutil.rmtree, folder, True)
    copy = folder / "balancer.o"
    shutil.copyfile(path, copy)
    return copy
