"""variant.py: a balancer object that really differs from build/bpf/balancer.o, for the upgrade tests.

A copy of bpf/ sets one constant that the contract does not hold, the IPv6 outer flow label mask
(IPv4 traffic never reaches it), to another value and is compiled by the Makefile's own rule: the
program's instructions differ (the kernel's tag of the loaded program does), its maps and its ABI
digest do not, so `lbctl upgrade` must accept it on the running maps.

    obj = build_variant(tmp_path)      # tmp_path/variant/build/bpf/balancer.o
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from balancer.datapath import verify_abi

REPO = Path(__file__).resolve().parents[1]
CONSTANT = "ENCAP_FLOW_LABEL_MASK = 0xfffff,"
VARIANT = "ENCAP_FLOW_LABEL_MASK = 0x7ffff,"


def build_variant(tmp: Path) -> Path:
    """Compile the variant under tmp; AssertionError if the constant moved or the build failed."""
    work = tmp / "variant"
    shutil.copytree(REPO / "bpf", work / "bpf")
    shutil.copy(REPO / "Makefile", work / "Makefile")
    header = work / "bpf" / "include" / "encap.h"
    text = header.read_text()
    assert text.count(CONSTANT) == 1, f"{header}: expected one '{CONSTANT}' to change (did it move?)"
    header.write_text(text.replace(CONSTANT, VARIANT))
    done = subprocess.run(["make", "-s", "-C", str(work), "build/bpf/balancer.o"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 0, f"building the variant failed: {done.stderr[-2000:]}"
    obj = work / "build" / "bpf" / "balancer.o"
    verify_abi(str(obj))  # the same contract: an upgrade may load it on the running maps
    assert obj.read_bytes() != (REPO / "build" / "bpf" / "balancer.o").read_bytes()
    return obj
