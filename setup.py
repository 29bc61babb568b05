"""setup.py: pyproject.toml holds the metadata; this adds one build step, the compiled parts.

A wheel (`pip install .`) carries the BPF objects and the native Maglev library as package data
under balancer/_build/{bpf,lib}/, compiled by the Makefile (`make bpf`: clang, the same flags as a
checkout). An editable install skips it: balancer/objects.py finds the source tree's build/ instead.
"""

import shutil
import subprocess
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildWithObjects(build_py):
    """build_py, then `make bpf` and a copy of build/bpf/*.o and build/lib/*.so into the package."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        try:
            subprocess.run(["make", "-C", str(ROOT), "bpf"], check=True)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise SystemExit(f"l4lab: cannot build the BPF objects ({exc}); install clang, llvm, libbpf-dev "
                             "and make (scripts/setup.sh does), then run pip install again") from exc
        for kind, pattern in (("bpf", "*.o"), ("lib", "*.so")):
            dest = Path(self.build_lib, "balancer", "_build", kind)
            dest.mkdir(parents=True, exist_ok=True)
            for f in sorted((ROOT / "build" / kind).glob(pattern)):
                shutil.copy2(f, dest / f.name)


class PlatformDistribution(Distribution):
    """The wheel holds a native library (and objects built against this machine's headers): tag it
    for this platform, not py3-none-any."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildWithObjects}, distclass=PlatformDistribution)
