"""suites/streams.py, `make test`'s runner: exit status of every stream, the kept logs printed, and an
interrupt passed on to each stream's process group."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from lab.harness import poll

REPO = Path(__file__).resolve().parents[2]


def _runner(logs: Path, *streams: str) -> list[str]:
    return [sys.executable, "-m", "suites.streams", "--logs", str(logs), *streams]


def test_every_stream_runs_and_one_failure_fails_the_run(tmp_path: Path) -> None:
    done = subprocess.run(_runner(tmp_path / "logs", "echo live-one", "echo kept-two; exit 3", "echo kept-three"),
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout
    assert "\nlive-one\n" in out  # live, between the runner's own lines
    # The kept streams' output comes whole, under its header, and stays in its log.
    for n, word in ((2, "kept-two"), (3, "kept-three")):
        log = tmp_path / "logs" / f"stream-{n}.log"
        assert log.read_text() == f"{word}\n"
        assert f"===== stream {n} (log {log}) =====\n{word}\n" in out
    assert "streams: 1 exit 0 after" in out
    assert "streams: 2 exit 3 after" in out
    assert "streams: 3 exit 0 after" in out


def test_all_streams_passing_pass_the_run(tmp_path: Path) -> None:
    done = subprocess.run(_runner(tmp_path / "logs", "true", "true"), cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_sigterm_reaches_every_stream_as_sigint(tmp_path: Path) -> None:
    """As a CI runner's timeout would: each stream's shell gets one SIGINT (pytest's Ctrl-C teardown), also
    when a second signal follows, the runner waits for them, prints the kept log and exits 143."""

    def stream(n: int) -> str:
        # Each SIGINT prints a line; the first ends the wait, then a 2 s "teardown" a second one would cut.
        # A background job ignores SIGINT in a non-interactive shell, so the shell ends each sleep itself.
        return (f"trap 'echo got-int-{n}' INT; sleep 30 & echo $$ > {tmp_path}/ready-{n}; wait || true; "
                "kill $! || true; sleep 2 & wait || true; kill $! 2>/dev/null || true; exit 7")

    runner = subprocess.Popen(_runner(tmp_path / "logs", stream(1), stream(2)), cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        poll(30, lambda: (tmp_path / "ready-1").exists() and (tmp_path / "ready-2").exists(),
             "both streams started")
        runner.send_signal(signal.SIGTERM)
        log2 = tmp_path / "logs" / "stream-2.log"
        poll(30, lambda: "got-int-2" in log2.read_text(), "stream 2's teardown begun")
        runner.send_signal(signal.SIGINT)  # a second one is not passed on: it would cut the teardown short
        out, err = runner.communicate(timeout=60)
        assert runner.returncode == 128 + signal.SIGTERM, out + err
        lines = out.splitlines()
        assert lines.count("got-int-1") == 1 and lines.count("got-int-2") == 1, out
        assert "got-int-2" in out.split("===== stream 2")[1]
        assert "interrupting every stream" in err and "still waiting for the streams' teardown" in err
        # Nothing of either stream is left: each shell leads its group, whose sleep ended with it.
        for n in (1, 2):
            group = (tmp_path / f"ready-{n}").read_text().strip()
            # Not zombies (state Z): PID 1 reaps orphans when it gets to them.
            left = subprocess.run(["pgrep", "-g", group, "-r", "D,R,S,T,t"], capture_output=True, text=True)
            assert left.stdout == "", f"stream {n}'s group {group} still runs {left.stdout.split()}"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
        for ready in tmp_path.glob("ready-*"):
            subprocess.run(["pkill", "-KILL", "-g", ready.read_text().strip()], check=False)
