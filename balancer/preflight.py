"""preflight.py: what lbctl needs from the host, checked before it touches an instance, and the instance lock.

Every check raises HostError with one line that names what is missing and how to get it, before
any map, pin, link or state file is read or written:

* bpffs mounted at the pin root, and not hidden (``ip netns exec`` remounts /sys, so a process it
  starts sees sysfs where the host's bpffs is);
* the capabilities the verb needs (CAP_BPF or CAP_SYS_ADMIN for the maps, CAP_SYS_ADMIN to open the
  session tables by id, CAP_NET_ADMIN to attach);
* an instance whose state file survives while its pins are not visible is running somewhere this
  process cannot see: nothing may load over it (``--force-reload`` after checking the interfaces);
* tc programs (the daemon's tunnel health checks) attach through TCX links: Linux 6.6 or newer;
* one owner at a time: the daemon holds an flock on ``<state root>/<instance>.lock`` for its whole
  life, and every command that writes to the instance takes the same lock for its duration.
"""

from __future__ import annotations

import contextlib
import errno as _errno
import fcntl
import os
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from balancer.errors import HostError, InstanceOwnedError

BPFFS = "/sys/fs/bpf"

CAP_NET_ADMIN = 12
CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39
CAP_NAMES = {CAP_NET_ADMIN: "CAP_NET_ADMIN", CAP_SYS_ADMIN: "CAP_SYS_ADMIN", CAP_PERFMON: "CAP_PERFMON",
             CAP_BPF: "CAP_BPF"}

# What each verb needs. Reads: the maps (CAP_BPF). Writes: an apply may flush sessions from the
# per-CPU tables, which it opens by id (CAP_SYS_ADMIN). Loads: attaching XDP (CAP_NET_ADMIN).
READ_CAPS = (CAP_BPF,)
WRITE_CAPS = (CAP_BPF, CAP_SYS_ADMIN)
LOAD_CAPS = (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_NET_ADMIN)


def mount_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> tuple[str, str]:
    """(mount point, file system type) of the mount that holds path in this mount namespace."""
    target = os.path.realpath(path)
    visible: dict[str, str] = {}  # mount point -> fstype, in mount order
    for line in Path(mountinfo).read_text().splitlines():
        fields = line.split()
        point = fields[4].replace("\\040", " ")
        # A later mount at or above a point hides what was mounted there and below before it.
        for older in [p for p in visible if _under(p, point)]:
            del visible[older]
        visible[point] = fields[fields.index("-") + 1]
    holders = [p for p in visible if _under(target, p)]
    best = max(holders, key=len, default="/")
    return best, visible.get(best, "")


def _under(path: str, point: str) -> bool:
    return path == point or path.startswith(point.rstrip("/") + "/")


LBCTL_REMEDY = "run lbctl with `nsenter --net=/run/netns/NS lbctl ...` or `l4lab exec NODE -- lbctl ...` instead"


def require_bpffs(pin_root: str, remedy: str = LBCTL_REMEDY,
                  mountinfo: tuple[str, str] = ("/proc/self/mountinfo", "/proc/1/mountinfo")) -> None:
    """Refuse when pin_root does not lie on a bpffs in this process's mount namespace.

    remedy says how to reach the host's bpffs when it is hidden (lbctl's advice by default);
    mountinfo names this process's mount table and the host's (pid 1's)."""
    point, fstype = mount_of(pin_root, mountinfo[0])
    if fstype == "bpf":
        return
    host_has_it = False
    with contextlib.suppress(OSError):  # no view of pid 1's mounts (not root): say what we know
        host_has_it = mount_of(pin_root, mountinfo[1])[1] == "bpf"
    if host_has_it:
        raise HostError(
            f"bpffs is hidden: {pin_root} lies on {fstype or 'no file system'} ({point}) in this mount "
            f"namespace, not on the host's bpffs (`ip netns exec` remounts /sys); {remedy}")
    raise HostError(
        f"bpffs is not mounted: {pin_root} lies on {fstype or 'no file system'} ({point}); "
        f"mount it with `mount -t bpf bpf {BPFFS}`")


def effective_caps(status: str = "/proc/self/status") -> int:
    for line in Path(status).read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def require_caps(verb: str, needed: Iterable[int]) -> None:
    """Refuse when this process lacks a capability the verb needs (CAP_SYS_ADMIN stands in for BPF/PERFMON)."""
    have = effective_caps()
    missing = []
    for cap in needed:
        ok = have >> cap & 1
        if cap in (CAP_BPF, CAP_PERFMON) and have >> CAP_SYS_ADMIN & 1:
            ok = True
        if not ok:
            missing.append(CAP_NAMES[cap])
    if missing:
        names = ", ".join(CAP_NAMES[c] for c in needed)
        raise HostError(f"`lbctl {verb}` needs {names}; this process lacks {', '.join(missing)}: "
                        "run it as root (sudo) or grant them (e.g. systemd AmbientCapabilities=)")


TCX_SINCE = (6, 6)


def require_tcx(what: str, release: str | None = None) -> None:
    """Refuse what (a tc program lbctl would attach) on a kernel without TCX links (before 6.6).

    lbctl attaches tc programs only through TCX links, which go with their owner; a tc clsact
    fallback would leave filters behind a crashed daemon, so it is refused here instead."""
    release = release or os.uname().release
    found = re.match(r"(\d+)\.(\d+)", release)
    if found and (int(found.group(1)), int(found.group(2))) < TCX_SINCE:
        raise HostError(f"{what} attaches through TCX, which needs Linux 6.6 or newer, but this kernel is "
                        f'{release}; use via = "direct" health checks on this host')


def check_pins_visible(name: str, state_path: Path, pin_dir: str, interfaces: Iterable[str] = ()) -> None:
    """Refuse an instance whose state file exists while its pins are not visible here.

    Such a state file is not stale: the datapath it names may be forwarding behind a bpffs this
    process cannot see (another mount namespace, a fresh bpffs mounted over the host's one).
    """
    if state_path.exists() and not Path(pin_dir, "lb_vips").exists():
        on = ", ".join(interfaces) or "its interfaces"
        raise HostError(
            f"instance '{name}' has a state file ({state_path}) but no pins under {pin_dir}: its datapath "
            f"may be running behind a bpffs this process cannot see, so nothing loads over it; "
            f"if no XDP program is attached to {on} (`ip link show`), pass --force-reload to "
            f"`lbctl load` or `lbctl run`")


def attached_xdp(interfaces: Iterable[str]) -> dict[str, int]:
    """{interface: XDP program id} for every interface of this netns that has an XDP program attached."""
    from pyroute2 import IPRoute  # netlink only for this check

    out: dict[str, int] = {}
    with IPRoute() as ipr:
        for ifname in interfaces:
            idx = ipr.link_lookup(ifname=ifname)
            if not idx:
                continue
            xdp = ipr.get_links(idx[0])[0].get_attr("IFLA_XDP")
            prog = xdp.get_attr("IFLA_XDP_PROG_ID") if xdp is not None else None
            if prog:
                out[ifname] = int(prog)
    return out


def forget_unseen_state(name: str, state_path: Path, interfaces: Iterable[str]) -> None:
    """--force-reload: drop a state file whose pins are gone, once no interface has an XDP program."""
    ifaces = list(interfaces)
    busy = attached_xdp(ifaces)
    if busy:
        progs = ", ".join(f"{i} (prog id {p})" for i, p in busy.items())
        raise HostError(f"--force-reload refused for instance '{name}': an XDP program is attached to "
                        f"{progs}; it may be this instance's datapath, so nothing loads over it")
    state_path.unlink(missing_ok=True)


def lock_path(state_root: str, name: str) -> Path:
    return Path(state_root) / f"{name}.lock"


@contextmanager
def instance_lock(state_root: str, name: str, holder: str) -> Iterator[Path]:
    """Own instance `name` while the block runs: an exclusive flock, refused (not waited for) if held.

    The lock file holds the owner's pid and what it is (``lbctl run``, ``lbctl apply``), for the
    refusal message; the lock itself dies with the process, so a crash never leaves it held.
    """
    path = lock_path(state_root, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise HostError(f"cannot open the lock of instance '{name}' ({path}): {exc.strerror}; "
                        "run as root") from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (_errno.EWOULDBLOCK, _errno.EAGAIN):
                raise
            owner = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            raise InstanceOwnedError(f"instance '{name}' is owned by {owner}, which holds {path}; "
                                     "change the daemon's config and send it SIGHUP, or stop it first",
                                     name, owner) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{holder} (pid {os.getpid()})\n".encode(), 0)
        yield path
    finally:
        os.close(fd)
