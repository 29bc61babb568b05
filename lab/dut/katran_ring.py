"""katran_ring.py: Katran's own control-plane ring builder, compiled from the user's checkout.

Katran's BPF program only reads a ring; its C++ control plane (katran::Vip with MaglevHash or
MaglevHashV2) writes it. Those sources need nothing but the C++ standard library, so `build()`
compiles them from the checkout that `L4LAB_KATRAN_SRC` names, with a C entry point of ours
(katran_ring.cc beside this file), into build/katran/libkatran_ring.so; `ring()` calls it. Each
real's hash is folly's IPAddress::hash of its address, which Katran's control plane computes with
folly (not in a Katran checkout): `balancer.katran_hash.real_hash` gives it, checked against
Katran's vectors by suites/datapath/test_katran_compatible.py.

    lib = build(Checkout.find(None))
    ring(lib, [Backend(1, "10.0.0.1", 1), Backend(2, "10.0.0.2", 10)], 65537, "v1")
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from balancer import katran_hash, maglev
from lab.dut.katran import BUILD_DIR, Checkout
from lab.errors import LabError

SHIM = Path(__file__).with_name("katran_ring.cc")
SOURCES = ("Vip.cpp", "CHHelpers.cpp", "MaglevBase.cpp", "MaglevHash.cpp", "MaglevHashV2.cpp", "MurmurHash3.cpp")
LIB_NAME = "libkatran_ring.so"


def build(checkout: Checkout, out_dir: Path = BUILD_DIR) -> ctypes.CDLL:
    """Compile Katran's ring builder with our entry point (clang++, C++17: Debian's clang brings the C++
    library's headers) and load it."""
    if shutil.which("clang++") is None:
        raise LabError("building Katran's ring code needs clang++; run `make deps` (it installs clang)")
    lib_dir = checkout.root / "katran" / "lib"
    missing = [s for s in SOURCES if not (lib_dir / s).is_file()]
    if missing:
        raise LabError(f"{checkout.root} has no katran/lib/{missing[0]}: Katran's ring code is not where "
                       "this checkout's balancer is; use a checkout of github.com/facebookincubator/katran")
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / LIB_NAME
    argv = ["clang++", "-std=c++17", "-O2", "-shared", "-fPIC", "-w", "-I", str(checkout.root), "-o", str(out),
            str(SHIM), *(str(lib_dir / s) for s in SOURCES)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise LabError(f"cannot build Katran's ring code from {checkout.root}: clang++ failed: {tail}",
                       step="build katran ring", command=" ".join(argv), stderr=done.stderr)
    lib = ctypes.CDLL(str(out))
    fn = lib.l4lab_katran_ring
    fn.argtypes = [ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                   ctypes.c_uint32, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return lib


def ring(lib: ctypes.CDLL, reals: Sequence[maglev.Backend], size: int = katran_hash.DEFAULT_RING_SIZE,
         kind: katran_hash.RingKind = "v1") -> maglev.Ring:
    """The ring Katran's control plane writes for `reals` (its real numbers are the Backends' ids);
    slots it leaves unset (no real of weight > 0) read maglev.NO_REAL."""
    nums = np.array([b.real_id for b in reals], dtype=np.uint32)
    weights = np.array([b.weight for b in reals], dtype=np.uint32)
    hashes = np.array([katran_hash.real_hash(b.address) for b in reals], dtype=np.uint64)
    out = np.empty(size, dtype=np.int32)
    if lib.l4lab_katran_ring(int(kind == "v2"), len(reals), nums.ctypes.data, weights.ctypes.data,
                             hashes.ctypes.data, size, out.ctypes.data) != 0:
        raise LabError(f"Katran's ring code answered a slot outside a ring of {size}")
    return np.where(out < 0, maglev.NO_REAL, out).astype(np.uint32)
