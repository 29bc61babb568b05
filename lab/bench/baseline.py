"""Another balancer object (`--baseline`, e.g. an older build) timed beside this checkout's, checked first.

The bench programs a baseline's maps with this checkout's controller, so a baseline must carry the
same BTF contract (balancer/_abi.py); the Katran side by side and the profile both take one.
"""

from __future__ import annotations

import shutil
import tempfile
from contextlib import ExitStack
from pathlib import Path

from balancer import _abi
from balancer.btf import read_contract
from balancer.errors import AbiMismatchError
from lab.errors import LabError


def check_baseline(path: Path) -> None:
    """Refuse a baseline object that this checkout's controller cannot program: not a file, or a BTF
    contract (structs, enums, maps, load-time constants) other than balancer/_abi.py's."""
    if not path.is_file():
        raise LabError(f"--baseline {path}: no such file (a balancer.o built by `make bpf`, e.g. in a "
                       "worktree of an older commit)")
    try:
        got = read_contract(str(path)).digest()
    except AbiMismatchError as exc:
        raise LabError(f"--baseline {path}: not a BPF object with BTF ({exc})") from None
    want = _abi.DIGESTS["balancer"]
    if got != want:
        raise LabError(f"--baseline {path}: its BTF contract ({got}) differs from this checkout's "
                       f"balancer/_abi.py ({want}); the bench programs its maps with this checkout's "
                       "layout, so a baseline must be built from a commit with the same contract")


def baseline_object(stack: ExitStack, path: Path) -> Path:
    """A copy of the baseline named balancer.o in a private folder, removed with the stack: the loader
    finds an object's contract by its file name, so the object itself may be called anything."""
    check_baseline(path)
    folder = Path(tempfile.mkdtemp(prefix="l4lab-baseline-"))
    stack.callback(shutil.rmtree, folder, True)
    copy = folder / "balancer.o"
    shutil.copyfile(path, copy)
    return copy
