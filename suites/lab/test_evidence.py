"""The pytest plugin's evidence: a failing lab test reports where its packets died (the tracer)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lab.observe import trace

REPO = Path(__file__).resolve().parents[2]

FAILING = '''
import socket
from lab.nsexec import entered

def test_udp_to_a_closed_port(lab):
    with entered(lab.netns("client")):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with s:
        for _ in range(3):
            s.sendto(b"x", ("203.0.113.18", 9))  # real1 listens on no port 9
    assert False, "fails on purpose: the report must show the tracer's counts"
'''


@pytest.mark.skipif(trace.bcc_missing() is not None, reason=f"{trace.bcc_missing()}")
def test_a_failing_lab_test_shows_the_tracers_drop_reasons(tmp_path: Path) -> None:
    test = tmp_path / "test_failing.py"
    test.write_text(FAILING)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "lab.pytest_plugin", "-q", "--rootdir", str(tmp_path),
                           "-p", "no:cacheprovider", str(test)], capture_output=True, text=True, cwd=REPO,
                          timeout=180, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-3000:]
    assert "tracer: XDP exceptions, bulk-tx errors, drop reasons per node" in out, out[-3000:]
    section = out[out.index("tracer: XDP exceptions"):]
    assert "real1" in section and "NO_SOCKET" in section, section[:2000]
