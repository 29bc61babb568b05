"""nsconf.py: settings of one network namespace from outside it: sysctls, and tx checksum offload (ethtool's ioctl).

Each opens its file or socket inside the namespace (lab.nsexec.entered) and uses it from here, so
no process is started per setting.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
from pathlib import Path

from lab.nsexec import entered

_SIOCETHTOOL = 0x8946
_ETHTOOL_GTXCSUM = 0x16
_ETHTOOL_STXCSUM = 0x17


def write_sysctl(ns: str, key: str, value: str) -> None:
    """Set sysctl `key` inside namespace `ns` (the file under /proc/sys, opened in the namespace)."""
    path = Path("/proc/sys") / key.replace(".", "/")
    with entered(ns):
        fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


def read_sysctl(ns: str, key: str) -> str:
    """The value of sysctl `key` inside namespace `ns`."""
    with entered(ns):
        fd = os.open(Path("/proc/sys") / key.replace(".", "/"), os.O_RDONLY)
    try:
        return os.read(fd, 4096).decode().strip()
    finally:
        os.close(fd)


def _ethtool_value(ns: str, ifname: str, cmd: int, data: int = 0) -> int:
    value = ctypes.create_string_buffer(struct.pack("II", cmd, data), 8)
    ifreq = struct.pack("16sP", ifname.encode(), ctypes.addressof(value)).ljust(40, b"\0")
    with entered(ns):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with sock:
        fcntl.ioctl(sock.fileno(), _SIOCETHTOOL, ifreq)
    return int(struct.unpack("II", value.raw)[1])


def set_tx_checksum(ns: str, ifname: str, on: bool) -> None:
    """`ethtool -K IFNAME tx on|off` inside `ns` (the legacy ioctl; it also drops dependent offloads)."""
    _ethtool_value(ns, ifname, _ETHTOOL_STXCSUM, int(on))


def tx_checksum(ns: str, ifname: str) -> bool:
    """Whether tx checksum offload is on for IFNAME inside `ns`."""
    return _ethtool_value(ns, ifname, _ETHTOOL_GTXCSUM) != 0
