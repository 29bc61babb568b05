"""objects.py: where the compiled BPF objects and the native Maglev library are found.

A bare file name (`balancer.o`, `libl4lab_maglev.so`) is looked up, first hit wins, in:

1. `$L4LAB_BUILD_DIR/bpf/` (objects) or `$L4LAB_BUILD_DIR/lib/` (the library): a build of your own;
2. the installed package's copies, `balancer/_build/{bpf,lib}/`, which `pip install .` compiles in
   (setup.py runs `make bpf`);
3. the source tree's `build/{bpf,lib}/` (`make bpf`), for a checkout or an editable install.

A name with a `/` in it is a path and is used as given.
"""

from __future__ import annotations

import errno
import hashlib
import os
from pathlib import Path

from balancer.errors import DatapathError

ENV = "L4LAB_BUILD_DIR"
_PACKAGE = Path(__file__).resolve().parent / "_build"
_SOURCE_TREE = Path(__file__).resolve().parents[1] / "build"


def search_dirs(kind: str) -> list[Path]:
    """The folders searched for a file of `kind` ("bpf" or "lib"), in order."""
    roots = [Path(os.environ[ENV])] if os.environ.get(ENV) else []
    return [root / kind for root in (*roots, _PACKAGE, _SOURCE_TREE)]


def locate(name: str, kind: str = "bpf") -> Path | None:
    """The first file called `name` in search_dirs(kind), or None."""
    return next((d / name for d in search_dirs(kind) if (d / name).is_file()), None)


def find(name: str) -> str:
    """The path of BPF object `name` (a bare file name is searched, a path is kept); one-line error if absent."""
    if "/" in name:
        return name
    found = locate(name)
    if found is None:
        where = ", ".join(str(d) for d in search_dirs("bpf"))
        raise DatapathError(f"find the BPF object '{name}'", errno.ENOENT,
                            f"looked in {where}; run `make bpf` in the source tree, reinstall with "
                            f"`pip install .` (it needs clang), or set {ENV} to a folder holding bpf/{name}")
    return str(found)


def digest(path: str) -> str:
    """The SHA-256 of the file at path (hex): tells a rebuilt object from the one running under the same name."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
