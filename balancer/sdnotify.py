"""sdnotify.py: tell systemd how `lbctl run` is doing, over the datagram socket in $NOTIFY_SOCKET.

The protocol (sd_notify(3)) is one datagram of newline-separated ``KEY=VALUE`` lines sent to the
AF_UNIX socket whose path is in NOTIFY_SOCKET (a leading ``@`` names an abstract socket). Without
NOTIFY_SOCKET (not started by systemd, or ``Type=exec``) every call does nothing.

    notifier = Notifier.from_environment()
    notifier.send(READY=1, STATUS="forwarding")
    if notifier.watchdog_s:
        notifier.send(WATCHDOG=1)          # at least every watchdog_s / 2
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

from balancer.errors import LbError

__all__ = ["Notifier"]


class Notifier:
    """Sends state changes to the service manager; `enabled` is False outside systemd."""

    def __init__(self, address: str | None, watchdog_s: float | None = None) -> None:
        self.address = address
        self.watchdog_s = watchdog_s

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Notifier:
        """The notifier systemd asked for: NOTIFY_SOCKET, and WATCHDOG_USEC when WATCHDOG_PID is
        unset or ours (as sd_watchdog_enabled(3) reads them)."""
        env = os.environ if env is None else env
        address = env.get("NOTIFY_SOCKET") or None
        watchdog_s = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            watchdog_s = int(usec) / 1e6
        return cls(address, watchdog_s)

    @property
    def enabled(self) -> bool:
        return self.address is not None

    def send(self, **fields: object) -> None:
        """One datagram with a line per field (``READY=1``); raises LbError naming the socket if
        the service manager cannot be reached."""
        if self.address is None:
            return
        text = "".join(f"{key}={value}\n" for key, value in fields.items())
        if any("\n" in str(v) for v in fields.values()):
            raise ValueError(f"sd_notify values must be single lines: {fields!r}")
        target = "\0" + self.address[1:] if self.address.startswith("@") else self.address
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
                s.sendto(text.encode(), target)
        except OSError as exc:
            raise LbError(f"cannot notify the service manager at NOTIFY_SOCKET={self.address}: "
                          f"{exc.strerror or exc}; is the unit Type=notify?") from exc
