"""A real server in a qemu (TCG) VM whose Linux kernel decapsulates IPIP, FOU and GUE for VIPs on lo.

The VM boots Debian's cloud kernel with the initramfs of `lab.remote.vm_init.image` and its link is a tap
device that this module creates inside a given network namespace: by default the tap carries the
gateway address, so the namespace is the VM's router. Settings reach the VM's /init on the kernel
command line; the VM writes one readiness line to its serial console, which is a file here, and
`start()` polls that file with a deadline.

A second serial port is the VM's control channel: a shell loop in the guest runs one command line
per request and answers with its output and exit status (`run()`), so the guest's ethtool can be
asked without a packet on the VM's NIC. With `queues` > 1 the NIC is a multiqueue virtio-net (one
vCPU per queue); with `rss` qemu spreads received packets over the queues by Toeplitz RSS, which
the guest switches on at boot with the key given here (lab.rss.toeplitz.MICROSOFT_KEY by default).

Example::

    with VmReal("r1", netns="lab-r1", addr="192.0.2.10", prefix=24, gateway="192.0.2.1",
                vips=["203.0.113.10"]) as vm:
        print(vm.boot_seconds, vm.mac, vm.tap)
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import ipaddress
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from pyroute2 import IPRoute

from lab.errors import LabError
from lab.nsexec import entered, netns_path, nsenter_argv
from lab.remote.vm_init.image import DEFAULT_CACHE_DIR, BootImage, build_image
from lab.rss.nic import RssSettings, flow_hash_fields, observe_queues, parse_rss, queue_counters
from lab.rss.toeplitz import MICROSOFT_KEY, Flow, Toeplitz, flow_input, queues_of

READY_MARK = "L4LAB-READY"
FAILED_MARK = "L4LAB-FAILED"
BEGIN_MARK = "L4LAB-BEGIN"  # the control loop took a request: "L4LAB-BEGIN <request id>"
DONE_MARK = "L4LAB-DONE"  # and ran it: "L4LAB-DONE <request id> <exit status>"
MAX_QUEUES = 8
PROOF_PORT = 9  # the boot-time RSS proof's destination port: nothing listens, nothing comes back
PROOF_REPEAT = 8  # packets of the proof's fixed flow
DEFAULT_GUE_PORTS = (6080,)
DEFAULT_FOU_PORTS = (6081,)
DEFAULT_UDP_ECHO_PORT = 9000
DEFAULT_HTTP_PORT = 80
_POLL_S = 0.05


class VmError(LabError):
    """A VM step failed: `step` names it, `command` is what ran, `stderr` what qemu or the VM said."""


def _mac_for(name: str) -> str:
    """A locally administered unicast MAC derived from the VM name (stable across runs)."""
    digest = hashlib.sha256(name.encode()).digest()
    return "52:54:" + ":".join(f"{b:02x}" for b in digest[:4])


def _check_address(value: str, key: str, version: int | None, interface: bool = False) -> None:
    """Raise ValueError naming `key` unless `value` is an address (or interface) of `version`."""
    try:
        parsed = ipaddress.ip_interface(value) if interface else ipaddress.ip_address(value)
    except ValueError:
        parsed = None
    if parsed is None or (version is not None and parsed.version != version):
        kind = f"an IPv{version}" if version else "an IPv4 or IPv6"
        raise ValueError(f"VmReal {key} must be {kind} {'address/prefix' if interface else 'address'} "
                         f"but got {value!r}")


def _ports(ports: Sequence[int], what: str) -> str:
    for port in ports:
        if not 1 <= port <= 65535:
            raise ValueError(f"VmReal {what} must be UDP ports 1..65535 but got {port}")
    return ",".join(str(p) for p in ports)


class VmReal:
    """A real server VM: start() boots it until its readiness line, stop() kills qemu and removes the tap.

    Parameters: `name` (in the console line and the MAC), `netns` (name or path of an existing
    namespace that will hold the tap), `addr`/`prefix` (eth0 in the VM), `gateway` (default
    route; also put on the tap unless `tap_address=False`), `vips` (IPv4 or IPv6, on the VM's
    lo), `gue_ports` (each `ip fou add port P gue`: GUE variant 0 and variant 1 both decap there),
    `fou_ports` (each `ip fou add port P ipproto 4`: plain IPIP-in-UDP), `addr6`/`prefix6`/
    `gateway6` (optional IPv6 on eth0 for 6in6 and 4in6 via ip6tnl0).
    """

    def __init__(
        self,
        name: str,
        netns: str,
        addr: str,
        prefix: int,
        gateway: str | None,
        vips: Sequence[str],
        gue_ports: Sequence[int] = DEFAULT_GUE_PORTS,
        fou_ports: Sequence[int] = DEFAULT_FOU_PORTS,
        *,
        addr6: str | None = None,
        prefix6: int = 64,
        gateway6: str | None = None,
        tap: str | None = None,
        tap_address: bool = True,
        memory_mb: int = 256,
        boot_timeout: float = 90.0,
        http_port: int = DEFAULT_HTTP_PORT,
        udp_echo_port: int = DEFAULT_UDP_ECHO_PORT,
        image: BootImage | None = None,
        cache_dir: Path = DEFAULT_CACHE_DIR,
        keep_logs: bool = False,
        queues: int = 1,
        rss: bool = False,
        rss_key: bytes = MICROSOFT_KEY,
    ) -> None:
        if not name or any(c.isspace() or c in ",=" for c in name):
            raise ValueError(f"VmReal name must be non-empty without spaces, ',' or '=' but got {name!r}")
        _check_address(f"{addr}/{prefix}", "addr/prefix", 4, interface=True)
        for key, value, version in (("gateway", gateway, 4), ("gateway6", gateway6, 6)):
            if value is not None:
                _check_address(value, key, version)
        if addr6 is not None:
            _check_address(f"{addr6}/{prefix6}", "addr6/prefix6", 6, interface=True)
        for vip in vips:
            _check_address(vip, "vips[]", None)
        if not 1 <= queues <= MAX_QUEUES:
            raise ValueError(f"VmReal queues must be 1..{MAX_QUEUES} but got {queues}")
        if rss and queues < 2:
            raise ValueError(f"VmReal rss needs at least 2 queues to spread over but got queues={queues}")
        if len(rss_key) != len(MICROSOFT_KEY):
            raise ValueError(f"VmReal rss_key must be {len(MICROSOFT_KEY)} bytes (virtio-net's key size) "
                             f"but got {len(rss_key)}")
        self.name = name
        self.netns = netns
        self.addr = addr
        self.prefix = prefix
        self.gateway = gateway
        self.vips = list(vips)
        self.gue_ports = list(gue_ports)
        self.fou_ports = list(fou_ports)
        self.addr6 = addr6
        self.prefix6 = prefix6
        self.gateway6 = gateway6
        self.tap = tap or f"vm-{name}"[:15]
        self.tap_address = tap_address
        self.memory_mb = memory_mb
        self.boot_timeout = boot_timeout
        self.http_port = http_port
        self.udp_echo_port = udp_echo_port
        self.mac = _mac_for(name)
        self.image = image
        self.cache_dir = cache_dir
        self.keep_logs = keep_logs
        self.queues = queues
        self.rss = rss
        self.rss_key = bytes(rss_key)
        self.boot_seconds: float | None = None
        self.guest_uptime: float | None = None
        self.run_dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._stack = contextlib.ExitStack()
        _ports(self.gue_ports, "gue_ports")
        _ports(self.fou_ports, "fou_ports")

    # -- life cycle ------------------------------------------------------------------------

    def __enter__(self) -> VmReal:
        self.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        """Create the tap, boot qemu and wait for the readiness line; on any failure undo it all."""
        if self._process is not None:
            raise VmError(f"VM '{self.name}' is already running; stop() it first", step="start")
        if not netns_path(self.netns).exists():
            raise VmError(
                f"cannot start VM '{self.name}': network namespace '{self.netns}' does not exist "
                f"({netns_path(self.netns)}); create it first (`ip netns add {self.netns}`)",
                step="netns",
            )
        try:
            image = self.image or build_image(self.cache_dir)
            self.image = image
            self._make_run_dir()
            self._make_tap()
            self._boot(image)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Kill qemu, delete the tap and the run directory (logs kept if keep_logs); safe to repeat."""
        try:
            self._stack.close()
        finally:
            self._process = None
            self._stack = contextlib.ExitStack()

    def kill(self) -> None:
        """The VM dies without a word (qemu SIGKILLed); its tap stays, without carrier, until stop()."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()

    @property
    def alive(self) -> bool:
        """Whether qemu still runs."""
        return self._process is not None and self._process.poll() is None

    @property
    def serial_log(self) -> Path:
        """The file that receives the VM's serial console."""
        if self.run_dir is None:
            raise VmError(f"VM '{self.name}' has no run directory: start() it first", step="serial")
        return self.run_dir / "serial.log"

    @property
    def control_socket(self) -> Path:
        """The Unix socket of the VM's control serial port (see `run`)."""
        if self.run_dir is None:
            raise VmError(f"VM '{self.name}' has no run directory: start() it first", step="control")
        return self.run_dir / "control.sock"

    def run(self, argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run argv in the guest over the control channel; stdout holds its output and stderr."""
        return guest_run(self.control_socket, argv, timeout=timeout)

    def rss_settings(self) -> tuple[RssSettings, str]:
        """The guest NIC's RSS key and table (`ethtool -x`) and its udp4 hashed fields (`ethtool -n`)."""
        shown = self.run(["ethtool", "-x", "eth0"])
        fields = self.run(["ethtool", "-n", "eth0", "rx-flow-hash", "udp4"])
        for done in (shown, fields):
            if done.returncode != 0:
                raise VmError(f"{shlex.join(done.args)} in VM '{self.name}' failed: {done.stdout.strip()}",
                              step="rss", command=shlex.join(done.args), stderr=done.stdout)
        return parse_rss(shown.stdout), flow_hash_fields(fields.stdout)

    def queue_counters(self) -> dict[int, int]:
        """{queue: packets received} of the guest's eth0 (`ethtool -S`)."""
        done = self.run(["ethtool", "-S", "eth0"])
        counters = queue_counters(done.stdout)
        if done.returncode != 0 or not counters:
            raise VmError(f"ethtool -S eth0 in VM '{self.name}' shows no per-queue counters: {done.stdout[-300:]}",
                          step="rss", command="ethtool -S eth0", stderr=done.stdout)
        return counters

    def prove_rss(self) -> dict[str, object]:
        """Show that qemu spreads by Toeplitz RSS before any figure is trusted; raise VmError if not.

        From the tap's namespace, one fixed UDP flow sent PROOF_REPEAT times must move exactly the
        one queue counter Toeplitz predicts (key and table read back from the guest), and one flow
        predicted on each queue must land there. Without RSS a queue is the tap's own flow hash
        (no Toeplitz), which matches that by chance with probability 1 / queues ** (queues + 1).
        """
        if not self.rss:
            raise VmError(f"VM '{self.name}' was started without rss: nothing to prove", step="rss")
        settings, fields = self.rss_settings()
        if settings.key != self.rss_key or settings.function != "toeplitz" or settings.queues != self.queues:
            raise VmError(f"VM '{self.name}' NIC shows key {settings.key.hex()}, function {settings.function!r} "
                          f"and {settings.queues} queues; its boot set {self.rss_key.hex()}, toeplitz, {self.queues}",
                          step="rss")
        assert self.gateway is not None
        hasher = Toeplitz(settings.key)

        def queue_of(sport: int) -> int:
            data = Flow(self.gateway or "", self.addr, sport, PROOF_PORT)
            return int(queues_of([hasher.hash_bytes(flow_input(data, fields))], settings.table)[0])  # type: ignore[arg-type]

        fixed = 40000
        by_queue: dict[int, int] = {}
        for sport in range(fixed + 1, fixed + 1 + 64 * self.queues):
            by_queue.setdefault(queue_of(sport), sport)
        spread = [by_queue[q] for q in sorted(by_queue)]
        if len(spread) != self.queues:
            raise VmError(f"no source port of 64 per queue is predicted on every queue: {by_queue}", step="rss")
        sockets: dict[int, socket.socket] = {}

        def send(batch: Sequence[tuple[int, int]]) -> None:
            for sport, count in batch:
                if sport not in sockets:
                    with entered(self.netns):
                        sockets[sport] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                    sockets[sport].bind((self.gateway or "", sport))
                for _ in range(count):
                    sockets[sport].sendto(b"l4lab-rss-proof", (self.addr, PROOF_PORT))

        try:
            # A first batch that also carries the neighbour resolution does not add up and is resent.
            (fixed_queue,) = observe_queues([fixed], send, self.queue_counters, repeat=PROOF_REPEAT)
            landed = observe_queues(spread, send, self.queue_counters, batch=len(spread))
        except (LabError, ValueError) as exc:
            raise VmError(f"RSS proof in VM '{self.name}' failed: {exc}", step="rss") from exc
        finally:
            for s in sockets.values():
                s.close()
        predicted = [queue_of(p) for p in spread]
        proof: dict[str, object] = {
            "fields": fields,
            "fixed_flow": {"sport": fixed, "packets": PROOF_REPEAT, "queue": fixed_queue, "predicted": queue_of(fixed)},
            "flows": [{"sport": p, "queue": q, "predicted": e}
                      for p, q, e in zip(spread, landed, predicted, strict=True)],
        }
        if fixed_queue != queue_of(fixed) or landed != predicted:
            raise VmError(f"RSS is not on in VM '{self.name}' (qemu did not take the guest's settings?): "
                          f"a fixed flow's {PROOF_REPEAT} packets all landed on queue {fixed_queue}, Toeplitz "
                          f"predicts {queue_of(fixed)}; one flow per queue landed on {landed}, predicted "
                          f"{predicted}", step="rss")
        return proof

    def console(self) -> str:
        """Everything the VM wrote to its serial console so far."""
        return self.serial_log.read_text(errors="replace") if self.serial_log.exists() else ""

    def network_words(self) -> list[str]:
        """The kernel command line's common part: console, name, addresses and gateways (every /init reads them)."""
        words = ["console=ttyS0", "quiet", "panic=-1", "mitigations=off", f"l4lab.name={self.name}",
                 f"l4lab.addr={self.addr}/{self.prefix}"]
        if self.gateway:
            words.append(f"l4lab.gw={self.gateway}")
        if self.addr6:
            words.append(f"l4lab.addr6={self.addr6}/{self.prefix6}")
        if self.gateway6:
            words.append(f"l4lab.gw6={self.gateway6}")
        return words

    def kernel_cmdline(self) -> str:
        """The kernel command line carrying this VM's settings to its /init."""
        words = [
            *self.network_words(),
            f"l4lab.vips={','.join(self.vips)}",
            f"l4lab.gue={_ports(self.gue_ports, 'gue_ports')}",
            f"l4lab.fou={_ports(self.fou_ports, 'fou_ports') or 0}",
            f"l4lab.http={self.http_port}",
            f"l4lab.echo={self.udp_echo_port}",
        ]
        if self.queues > 1:
            words.append(f"l4lab.queues={self.queues}")
        if self.rss:
            words.append("l4lab.rsskey=" + ":".join(f"{b:02x}" for b in self.rss_key))
        return " ".join(words)

    def qemu_command(self, image: BootImage) -> list[str]:
        """The qemu command line (run inside the netns, where the tap lives)."""
        netdev = f"tap,id=net0,ifname={self.tap},script=no,downscript=no"
        # romfile= skips the iPXE option ROM: the VM boots from -kernel, never from the network.
        nic = f"virtio-net-pci,netdev=net0,mac={self.mac},romfile="
        if self.queues > 1:
            # One RX/TX virtqueue pair per queue, their interrupts and one for config and control.
            netdev += f",queues={self.queues}"
            nic += f",mq=on,vectors={2 * self.queues + 2}"
        if self.rss:
            # qemu computes Toeplitz itself when its eBPF steering object cannot load (as here).
            nic += ",rss=on,hash=on"
        return [
            "qemu-system-x86_64",
            "-machine", "pc", "-accel", "tcg", "-cpu", "max", "-smp", str(self.queues),
            "-m", str(self.memory_mb),
            "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
            "-serial", f"file:{self.serial_log}",
            # ttyS1: the control channel, a Unix socket here that one client at a time connects to.
            "-chardev", f"socket,id=control,path={self.control_socket},server=on,wait=off",
            "-device", "isa-serial,chardev=control",
            "-kernel", str(image.kernel), "-initrd", str(image.initrd),
            "-append", self.kernel_cmdline(),
            "-netdev", netdev,
            "-device", nic,
        ]  # fmt: skip

    # -- steps -------------------------------------------------------------------------------

    def _make_run_dir(self) -> None:
        base = self.cache_dir / "run"
        base.mkdir(parents=True, exist_ok=True)
        self.run_dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=base))
        if not self.keep_logs:
            self._stack.callback(shutil.rmtree, self.run_dir, True)

    def _make_tap(self) -> None:
        with entered(self.netns), IPRoute() as ipr:
            try:
                ipr.link("add", ifname=self.tap, kind="tuntap", mode="tap",
                         ifr={"no_pi": 0, "one_queue": 0, "vnet_hdr": 0, "multi_queue": int(self.queues > 1)})
            except OSError as exc:
                raise VmError(
                    f"cannot create tap '{self.tap}' in netns '{self.netns}': {exc}; "
                    "is the name taken there? pass tap=... to choose another",
                    step="tap",
                ) from exc
            self._stack.callback(self._delete_tap)
            (index,) = ipr.link_lookup(ifname=self.tap)
            if self.tap_address and self.gateway:
                ipr.addr("add", index=index, address=self.gateway, prefixlen=self.prefix)
            if self.tap_address and self.gateway6:
                ipr.addr("add", index=index, address=self.gateway6, prefixlen=self.prefix6,
                         flags=0x02)  # IFA_F_NODAD: usable at once, no duplicate detection wait
            ipr.link("set", index=index, state="up")

    def _delete_tap(self) -> None:
        try:
            with entered(self.netns), IPRoute() as ipr:
                ipr.link("del", ifname=self.tap)
        except OSError as exc:
            # Already gone (the namespace or the link was removed): nothing to undo.
            if exc.errno not in (errno.ENODEV, errno.ENOENT):
                raise

    def _boot(self, image: BootImage) -> None:
        assert self.run_dir is not None
        command = nsenter_argv(self.netns, self.qemu_command(image))
        stderr = (self.run_dir / "qemu.stderr").open("wb")
        self._started = time.monotonic()
        try:
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr
            )
        except OSError as exc:
            raise VmError(f"cannot run qemu for VM '{self.name}': {exc}", step="qemu",
                          command=" ".join(command)) from exc
        finally:
            stderr.close()
        self._command = command
        self._stack.callback(self._kill, self._process)

    @staticmethod
    def _kill(process: subprocess.Popen[bytes]) -> None:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _wait_ready(self) -> None:
        assert self._process is not None and self.run_dir is not None
        deadline = self._started + self.boot_timeout
        while True:
            text = self.console()
            for line in text.splitlines()[: text.count("\n")]:  # whole lines only
                if line.startswith(READY_MARK):
                    self.boot_seconds = time.monotonic() - self._started
                    fields = dict(w.split("=", 1) for w in line.split()[1:] if "=" in w)
                    self.guest_uptime = float(fields.get("uptime", "nan"))
                    return
                if line.startswith(FAILED_MARK):
                    raise VmError(
                        f"VM '{self.name}' failed to set up: {line.removeprefix(FAILED_MARK).strip()}",
                        step="init", command=" ".join(self._command), stderr=text,
                    )
            if self._process.poll() is not None:
                stderr = (self.run_dir / "qemu.stderr").read_text(errors="replace").strip()
                raise VmError(
                    f"qemu for VM '{self.name}' exited with status {self._process.returncode} "
                    f"before the VM was ready: {stderr or text[-2000:] or 'no output'}",
                    step="qemu", command=" ".join(self._command), stderr=stderr + "\n" + text,
                )
            if time.monotonic() > deadline:
                raise VmError(
                    f"VM '{self.name}' not ready after {self.boot_timeout:g} s (no '{READY_MARK}' "
                    f"on its console); last console output: {text[-2000:]!r}. A busy host slows "
                    "TCG: raise boot_timeout",
                    step="boot", command=" ".join(self._command), stderr=text,
                )
            time.sleep(_POLL_S)  # polling the console file, bounded by the deadline above


def guest_run(control: Path, argv: Sequence[str], timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run argv in a VM through its control socket: one request line, output until the DONE line.

    The guest's shell runs the words as given (quoted here); stderr is folded into stdout. A
    request that finds the channel busy or the VM gone fails with a VmError naming the socket.
    """
    request = hashlib.sha256(f"{time.monotonic_ns()} {argv}".encode()).hexdigest()[:12]
    line = f"{request} {shlex.join(argv)}\n".encode()
    deadline = time.monotonic() + timeout
    output = b""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(control))
            sock.sendall(line)
            marker = f"{DONE_MARK} {request} ".encode()
            while marker not in output or not output.split(marker, 1)[1].count(b"\n"):
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                chunk = sock.recv(65536)
                if not chunk:
                    raise VmError(f"the VM closed its control channel {control} during {shlex.join(argv)!r}",
                                  step="control", command=shlex.join(argv), stderr=output.decode(errors="replace"))
                output += chunk
    except TimeoutError as exc:
        raise VmError(f"no answer from the VM's control channel {control} within {timeout:g} s for "
                      f"{shlex.join(argv)!r}; got so far: {output[-500:]!r}",
                      step="control", command=shlex.join(argv)) from exc
    except OSError as exc:
        raise VmError(f"cannot reach the VM's control channel {control}: {exc}; is the VM running?",
                      step="control", command=shlex.join(argv)) from exc
    text = output.decode(errors="replace")
    # Output of an earlier request abandoned mid-way may precede this one's: keep only ours.
    before, _, status = text.rpartition(f"{DONE_MARK} {request} ")
    body = before.rsplit(f"{BEGIN_MARK} {request}\n", 1)[-1]
    return subprocess.CompletedProcess(list(argv), int(status.split()[0]), stdout=body, stderr="")
