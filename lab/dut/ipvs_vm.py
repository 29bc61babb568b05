"""ipvs_vm.py: the IPVS load balancer VM: a qemu (TCG) VM in tunnel mode, driven over a serial line.

The VM boots Debian's cloud kernel (the one the VM reals boot) with an initramfs that holds
`ipvsadm`, Debian's `keepalived` and the IPVS modules; its link is a tap in a namespace of the lab
(the router's, so the router reaches it directly) and its VIPs sit on its lo. IPVS forwards VIP
traffic to the reals encapsulated as IPIP (`-i`) or GUE variant 0 (`-i --tun-type gue`), and the
reals answer the client directly, as with l4lab. Commands reach the VM on its control channel
(lab/remote/vm.py): ipvsadm directly, or keepalived (its config written, then started, reloaded
with SIGHUP or killed) as an IPVS node is run in production.

Example::

    with IpvsLb("ipvs", netns="lab-router", addr="198.51.100.34", prefix=29,
                gateway="198.51.100.33", vips=["198.51.100.100"]) as lb:
        lb.add_service(Service("198.51.100.100", 80, "tcp", scheduler="mh", flags=("mh-port",)))
        lb.add_real(Service("198.51.100.100", 80, "tcp"), "203.0.113.18", tunnel="gue")
        print(lb.stats())
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from lab.remote.vm import VmError, VmReal
from lab.remote.vm_init import image as vmimage

IPVSADM = Path("/usr/sbin/ipvsadm")
KEEPALIVED = Path("/usr/sbin/keepalived")
KEEPALIVED_CONF = "/etc/keepalived/keepalived.conf"
KEEPALIVED_PIDS = ("/run/keepalived.pid", "/run/keepalived_checkers.pid")
KEEPALIVED_LOG = "/tmp/keepalived.log"
WRITE_CHUNK = 1500  # bytes of base64 per control-channel line when writing a file into the VM
SETUP_HINT = "bash scripts/setup.sh --extra vm"
# Modules the LB VM loads (and their dependencies): the NIC, conntrack and IPVS with its schedulers.
IPVS_MODULES = ("virtio_pci", "virtio_net", "ip_vs", "ip_vs_mh", "ip_vs_sh", "ip_vs_rr", "ip_vs_wrr")
SCHEDULERS = ("mh", "sh", "rr", "wrr")
TUNNELS = ("ipip", "gue")
LAYOUT_VERSION = "2"  # 2: keepalived


class IpvsError(VmError):
    """An ipvsadm command failed in the LB VM: `command` is what ran, `stderr` what it printed."""


@dataclass(frozen=True)
class Service:
    """An IPVS virtual service: VIP, port, protocol and how it schedules new connections."""

    vip: str
    port: int
    proto: str = "tcp"
    scheduler: str = "mh"
    # Scheduler flags (`-b`): mh-port hashes the source port too, mh-fallback skips drained reals.
    flags: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        ipaddress.ip_address(self.vip)
        if not 1 <= self.port <= 65535:
            raise ValueError(f"Service port must be 1..65535 but got {self.port}")
        if self.proto not in ("tcp", "udp"):
            raise ValueError(f"Service proto must be 'tcp' or 'udp' but got {self.proto!r}")
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"Service scheduler must be one of {', '.join(SCHEDULERS)} "
                             f"but got {self.scheduler!r}")

    @property
    def spec(self) -> list[str]:
        """The `-t ADDR:PORT` / `-u ADDR:PORT` words that name the service to ipvsadm."""
        host = f"[{self.vip}]" if ":" in self.vip else self.vip
        return ["-t" if self.proto == "tcp" else "-u", f"{host}:{self.port}"]


@dataclass
class RealStats:
    """One real's counters as IPVS keeps them (`ipvsadm -Ln --stats --exact`)."""

    conns: int
    in_pkts: int
    out_pkts: int
    in_bytes: int
    out_bytes: int


@dataclass
class ServiceStats:
    """A service's counters and its reals'."""

    conns: int
    in_pkts: int
    out_pkts: int
    reals: dict[str, RealStats] = field(default_factory=dict)


def _cache_key(kernel: vmimage.KernelInfo) -> str:
    digest = hashlib.sha256()
    for part in (LAYOUT_VERSION, kernel.version, str(kernel.vmlinuz.stat().st_mtime_ns),
                 vmimage._package_version("busybox-static"), vmimage._package_version("iproute2"),
                 vmimage._package_version("ipvsadm"), vmimage._package_version("keepalived"), ",".join(IPVS_MODULES),
                 (vmimage.HERE / "ipvs_init.sh").read_text(), (vmimage.HERE / "control.sh").read_text()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def build_ipvs_image(cache_dir: Path = vmimage.DEFAULT_CACHE_DIR) -> vmimage.BootImage:
    """The LB VM's boot image (busybox, iproute2's ip, ipvsadm, keepalived, IPVS modules), cached in `cache_dir`."""
    missing = vmimage.missing_tools() + [str(p) for p in (IPVSADM, KEEPALIVED) if not p.is_file()]
    if missing:
        raise vmimage.ImageError(f"the IPVS VM needs {', '.join(missing)} on this machine; run `{SETUP_HINT}`")
    kernel = vmimage.find_kernel()
    initrd = cache_dir / f"ipvs-initramfs-{kernel.version}-{_cache_key(kernel)}.cpio"
    if not initrd.is_file():
        cache_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="stage-ipvs-", dir=cache_dir) as stage:
            root = Path(stage) / "root"
            _assemble(root, kernel)
            partial = Path(stage) / "initramfs.cpio"
            vmimage._pack(root, partial)
            os.replace(partial, initrd)
        for old in cache_dir.glob("ipvs-initramfs-*.cpio"):
            if old != initrd:
                old.unlink(missing_ok=True)
    return vmimage.BootImage(kernel=kernel.vmlinuz, initrd=initrd, kernel_version=kernel.version)


def _assemble(root: Path, kernel: vmimage.KernelInfo) -> None:
    for d in ("bin", "dev", "proc", "sys", "etc/l4lab", "etc/keepalived", "lib/modules", "tmp", "run"):
        (root / d).mkdir(parents=True, exist_ok=True)
    vmimage._copy(vmimage.BUSYBOX, root, Path("/bin/busybox"))
    applets = subprocess.run([str(vmimage.BUSYBOX), "--list"], capture_output=True, text=True,
                             check=True).stdout.split()
    for applet in applets:
        if applet != "busybox":
            (root / "bin" / applet).symlink_to("busybox")
    for binary, dest in ((vmimage.IPROUTE2_IP, Path("/usr/sbin/ip")), (IPVSADM, Path("/usr/sbin/ipvsadm")),
                         (KEEPALIVED, Path("/usr/sbin/keepalived"))):
        vmimage._copy(binary, root, dest)
        for lib in vmimage.shared_libraries(binary):
            vmimage._copy(lib, root)
    order = vmimage.module_load_order(kernel.modules, IPVS_MODULES)
    for rel in order:
        vmimage._copy(kernel.modules / rel, root, Path("/lib/modules") / rel)
    (root / "etc/l4lab/modules").write_text("".join(f"{rel}\n" for rel in order))
    init = root / "init"
    shutil.copy2(vmimage.HERE / "ipvs_init.sh", init)
    shutil.copy2(vmimage.HERE / "control.sh", root / "etc/l4lab/control.sh")
    init.chmod(0o755)


_STATS_SERVICE = re.compile(r"^(TCP|UDP)\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)")
_STATS_REAL = re.compile(r"^\s+->\s+(\S+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)")


def parse_stats(text: str) -> dict[str, ServiceStats]:
    """`ipvsadm -Ln --stats --exact` as {"tcp 198.51.100.100:80": ServiceStats(...)}; reals by address."""
    services: dict[str, ServiceStats] = {}
    current: ServiceStats | None = None
    for line in text.splitlines():
        if (m := _STATS_SERVICE.match(line)) is not None:
            conns, in_pkts, out_pkts = int(m[3]), int(m[4]), int(m[5])
            current = services[f"{m[1].lower()} {m[2]}"] = ServiceStats(conns, in_pkts, out_pkts)
        elif (m := _STATS_REAL.match(line)) is not None and current is not None:
            host = m[1].rsplit(":", 1)[0].strip("[]")
            current.reals[host] = RealStats(int(m[2]), int(m[3]), int(m[4]), int(m[5]), int(m[6]))
    return services


class IpvsLb(VmReal):
    """The IPVS load-balancer VM: start() boots it, then `ipvsadm()` and the helpers configure it.

    Parameters as `VmReal` (`netns` holds the tap, `gateway` goes on it, `vips` on the VM's lo);
    commands travel on the VM's control channel (`VmReal.run`).
    """

    def __init__(self, name: str, netns: str, addr: str, prefix: int, gateway: str | None,
                 vips: Sequence[str], **kwargs: object) -> None:
        kwargs.setdefault("memory_mb", 256)  # the initramfs (keepalived and its libraries: 32 MB) unpacks in RAM
        super().__init__(name, netns, addr, prefix, gateway, vips, **kwargs)  # type: ignore[arg-type]

    def start(self) -> None:
        if self.image is None:
            self.image = build_ipvs_image(self.cache_dir)
        super().start()

    def kernel_cmdline(self) -> str:
        return " ".join([*self.network_words(), f"l4lab.vips={','.join(self.vips)}"])

    # -- commands ------------------------------------------------------------------------------

    def sh(self, command: str, timeout: float = 30.0) -> tuple[int, str]:
        """Run one shell command line in the VM: (exit status, output)."""
        done = self.run(["sh", "-c", command], timeout=timeout)
        return done.returncode, done.stdout.rstrip("\n")

    def ipvsadm(self, *args: str) -> str:
        """Run ipvsadm with `args` in the VM; raise IpvsError naming the command on failure."""
        command = " ".join(["ipvsadm", *args])
        status, output = self.sh(command)
        if status != 0:
            raise IpvsError(f"ipvsadm failed in VM '{self.name}': {command}: {output.strip()}",
                            step="ipvsadm", command=command, stderr=output)
        return output

    def add_service(self, service: Service) -> None:
        args = ["-A", *service.spec, "-s", service.scheduler]
        if service.flags:
            args += ["-b", ",".join(service.flags)]
        self.ipvsadm(*args)

    def add_real(self, service: Service, real: str, *, weight: int = 1, tunnel: str = "ipip",
                 gue_port: int = 6080, csum: bool = False) -> None:
        """Add `real` to `service` in tunnel mode (`tunnel` = ipip or gue variant 0 to `gue_port`)."""
        self.ipvsadm("-a", *service.spec, *self._real_args(service, real, weight, tunnel, gue_port, csum))

    def edit_real(self, service: Service, real: str, *, weight: int, tunnel: str = "ipip",
                  gue_port: int = 6080, csum: bool = False) -> None:
        """Change a real's weight (0 drains it: no new connections, existing ones go on)."""
        self.ipvsadm("-e", *service.spec, *self._real_args(service, real, weight, tunnel, gue_port, csum))

    def delete_real(self, service: Service, real: str) -> None:
        host = f"[{real}]" if ":" in real else real
        self.ipvsadm("-d", *service.spec, "-r", f"{host}:{service.port}")

    @staticmethod
    def _real_args(service: Service, real: str, weight: int, tunnel: str, gue_port: int,
                   csum: bool) -> list[str]:
        if tunnel not in TUNNELS:
            raise ValueError(f"tunnel must be one of {', '.join(TUNNELS)} but got {tunnel!r}")
        if weight < 0:
            raise ValueError(f"weight must be >= 0 but got {weight}")
        host = f"[{real}]" if ":" in real else real
        # In tunnel mode the real's port is the virtual port: IPVS does not rewrite it.
        args = ["-r", f"{host}:{service.port}", "-w", str(weight), "-i"]
        if tunnel == "gue":
            args += ["--tun-type", "gue", "--tun-port", str(gue_port), "--tun-csum" if csum else "--tun-nocsum"]
        return args

    def clear(self) -> None:
        """Remove every service and zero the counters; connection entries expire on their own."""
        self.ipvsadm("-C")
        self.ipvsadm("-Z")

    def stats(self) -> dict[str, ServiceStats]:
        return parse_stats(self.ipvsadm("-Ln", "--stats", "--exact"))

    def connections(self) -> list[dict[str, str]]:
        """IPVS's connection table (`ipvsadm -Lnc`): protocol, state, source, virtual, destination."""
        rows = []
        for line in self.ipvsadm("-Lnc").splitlines()[2:]:
            words = line.split()
            if len(words) >= 6:
                rows.append({"proto": words[0].lower(), "state": words[2], "source": words[3],
                             "virtual": words[4], "destination": words[5]})
        return rows

    def table(self) -> dict[str, dict[str, int]]:
        """The kernel's IPVS table (`ipvsadm -Ln`): {"tcp 198.51.100.100:80": {real address: weight}}."""
        out: dict[str, dict[str, int]] = {}
        current: dict[str, int] | None = None
        for line in self.ipvsadm("-Ln").splitlines():
            if (m := _TABLE_SERVICE.match(line)) is not None:
                current = out[f"{m[1].lower()} {m[2]}"] = {}
            elif (m := _TABLE_REAL.match(line)) is not None and current is not None:
                current[m[1].rsplit(":", 1)[0].strip("[]")] = int(m[2])
        return out

    # -- keepalived -----------------------------------------------------------------------------

    def write_file(self, path: str, text: str) -> None:
        """Write `text` to `path` in the VM (base64 over the control channel, a line at a time)."""
        data = base64.b64encode(text.encode()).decode()
        self._checked(f": > {path}.b64", "write")
        for start in range(0, len(data), WRITE_CHUNK):
            self._checked(f"echo {data[start:start + WRITE_CHUNK]} >> {path}.b64", "write")
        self._checked(f"base64 -d {path}.b64 > {path} && rm {path}.b64", "write")

    def _checked(self, command: str, step: str) -> str:
        status, output = self.sh(command)
        if status != 0:
            raise IpvsError(f"{step} failed in VM '{self.name}': {command[:200]}: {output.strip()}",
                            step=step, command=command, stderr=output)
        return output

    def keepalived_pids(self) -> list[int]:
        """The pids of keepalived's processes (the parent and its health-checker child) running now."""
        status, output = self.sh("pidof keepalived")
        return [int(p) for p in output.split()] if status == 0 else []

    def keepalived_start(self, config: str) -> None:
        """Write keepalived.conf and start keepalived: health checkers only, IPVS kept on stop (-I)."""
        self.write_file(KEEPALIVED_CONF, config)
        pid, checkers = KEEPALIVED_PIDS
        # -C health checkers only, -n in the foreground of its shell (which returns), -l -G log to the console
        self._checked(f"keepalived -C -B -I -n -l -D -G -f {KEEPALIVED_CONF} -p {pid} -c {checkers} "
                      f">>{KEEPALIVED_LOG} 2>&1 &", "keepalived start")

    def keepalived_reload(self, config: str) -> None:
        """Write keepalived.conf and make the running keepalived read it again (SIGHUP)."""
        self.write_file(KEEPALIVED_CONF, config)
        self._checked(f"kill -HUP $(cat {KEEPALIVED_PIDS[0]})", "keepalived reload")

    def keepalived_stop(self, signal: str = "TERM") -> None:
        """Signal keepalived's parent, then every keepalived process left (TERM: it stops, leaving IPVS
        as it is with -I; KILL: a crash)."""
        # The parent first: a checker killed before it is forked anew, and that one outlives the parent
        # (busybox pidof lists the newest first). A process may be gone between the listing and the kill.
        self.sh(f"kill -{signal} $(cat {KEEPALIVED_PIDS[0]}) 2>/dev/null")
        self.keepalived_signal(signal)

    def keepalived_signal(self, signal: str) -> list[int]:
        """Send a signal to every keepalived process running now; returns their pids."""
        pids = self.keepalived_pids()
        if pids:
            self.sh(f"kill -{signal} {' '.join(map(str, pids))} 2>/dev/null")
        return pids

    def keepalived_log(self) -> str:
        return self.sh(f"tail -n 40 {KEEPALIVED_LOG}")[1]


_TABLE_SERVICE = re.compile(r"^(TCP|UDP)\s+(\S+)\s+\S+")
_TABLE_REAL = re.compile(r"^\s+->\s+(\S+)\s+\S+\s+(\d+)\s+\d+\s+\d+")
