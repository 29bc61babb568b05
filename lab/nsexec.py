"""Entering a lab node's network namespace: in-process (setns on this thread) or for a command (nsenter).

Never `ip netns exec`: it remounts /sys and hides /sys/fs/bpf from the command.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from lab.errors import LabError

NETNS_DIR = Path("/run/netns")
CLONE_NEWNET = 0x40000000

_libc = ctypes.CDLL(None, use_errno=True)


def netns_path(netns: str) -> Path:
    return NETNS_DIR / netns


def _setns(fd: int, what: str) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns into {what} failed: {os.strerror(err)}")


@contextmanager
def entered(netns: str) -> Iterator[None]:
    """Run the body with this thread in network namespace `netns`, then switch back.

    Sockets created inside (pyroute2 IPRoute, scapy, plain sockets) stay bound to `netns` after
    the body ends; /proc/sys/net opened inside shows the namespace's sysctls.
    """
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            target = os.open(netns_path(netns), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise OSError(errno.ENOENT, f"network namespace '{netns}' does not exist") from exc
        try:
            _setns(target, f"network namespace '{netns}'")
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own, "the caller's own network namespace")
    finally:
        os.close(own)


def nsenter_argv(netns: str, argv: Sequence[str]) -> list[str]:
    """The command line that runs `argv` inside `netns` (bpffs stays visible)."""
    nsenter = shutil.which("nsenter")
    if nsenter is None:
        raise LabError("cannot enter a network namespace: nsenter not found; install util-linux")
    return [nsenter, f"--net={netns_path(netns)}", "--", *argv]


def run(
    netns: str, argv: Sequence[str], *, check: bool = True, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run `argv` inside `netns`, capture its output; raise LabError naming the command if it fails."""
    full = nsenter_argv(netns, argv)
    command = " ".join(argv)
    try:
        done = subprocess.run(full, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise LabError(
            f"'{command}' in {netns} did not finish within {timeout:g} s", command=command
        ) from exc
    if check and done.returncode != 0:
        raise LabError(
            f"'{command}' in {netns} failed with exit code {done.returncode}: {done.stderr.strip()}",
            command=command,
            stderr=done.stderr,
        )
    return done
