"""`l4lab up` loads the balancer on the LB node: HTTP through the VIP works at once; `down` removes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from balancer.controller import Instance
from suites.lab.probes import bpf_available, leftovers

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(bpf_available() is not None, reason=f"{bpf_available()}")


def _l4lab(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "lab.cli", *args], capture_output=True, text=True, cwd=REPO,
                          timeout=120, check=False)


def test_up_serves_the_vip_through_the_balancer_and_down_removes_it(lab_name: str) -> None:
    up = _l4lab("up", "default", "--name", lab_name)
    assert up.returncode == 0, up.stderr
    pages = set()
    for vip in ("198.51.100.100", "[2001:db8:100::100]"):
        for _ in range(6):
            done = _l4lab("exec", "client", "--name", lab_name, "--", "curl", "-s", "-m", "3", f"http://{vip}/")
            assert done.returncode == 0, done.stderr
            pages.add(done.stdout.strip())
    assert pages <= {"real1", "real2", "real3"} and pages, pages
    assert Path(Instance.pin_dir(f"{lab_name}-lb")).exists()
    down = _l4lab("down", "--name", lab_name)
    assert down.returncode == 0, down.stderr
    assert not Path(Instance.pin_dir(f"{lab_name}-lb")).exists()
    assert not Instance.state_path(f"{lab_name}-lb").exists()
    assert leftovers(lab_name) == []


def test_up_without_balancer_leaves_the_vip_unserved(lab_name: str) -> None:
    assert _l4lab("up", "default", "--name", lab_name, "--no-balancer").returncode == 0
    done = _l4lab("exec", "client", "--name", lab_name, "--", "curl", "-s", "-m", "1", "http://198.51.100.100/")
    assert done.returncode != 0  # the LB node's kernel has no VIP: nothing answers
    assert not Path(Instance.pin_dir(f"{lab_name}-lb")).exists()
