"""`l4lab bench --trex TARGET.toml`: the single-arm hardware bench, TRex sending and counting, the LB reached over SSH.

Wiring (DESIGN.md, "Hardware runs"): TRex's `tx_port` sends UDP flows to the VIP, addressed to the
MAC of the LB's data interface (the LB node's link in the topology, renamed by the target's
`interfaces` table); the program on that interface sends each frame back out of the same NIC.
Which TRex port counts what came back depends on where the program sends it:

- every encap: the balancer addresses each encapsulated frame to its next hop, `trex.rx_mac`, so
  `rx_port` counts;
- the XDP_TX floor: the MAC-swap program returns each frame to its source, `trex.tx_mac`, so
  `tx_port` counts (the same port when tx_port == rx_port);
- the XDP_DROP floor: nothing comes back, so a trial's `received` is what the LB's own counter
  (floor.o's fl_count, read by lab/bench/floorhold.py before and after the trial) grew by.

Order: the floors first (XDP_DROP, then XDP_TX, every frame size each, the program held by
`python -m lab.bench.floorhold` over ssh), then the balancer: `lbctl --instance l4lab-bench load` once
with the first encap's config, `lbctl apply` per encap (one UDP VIP, four reals of its family that
need not exist: TRex only counts frames), every frame size each, and `lbctl unload`. The floor and
the balancer never share the interface. Each step on the LB registers its undo the moment it
succeeds, so a failure, Ctrl-C or SIGTERM leaves the LB as it was found.

Each search starts at the LB link's line rate for the frame size (its speed read over ssh), or at
--max-rate-mpps if that is lower or the speed cannot be read. Importing TRex's client replaces
scapy in the process (lab/bench/gen/trex.py): nothing here imports scapy, and the CLI runs in a process
of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shlex
import subprocess
import time
import warnings
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from balancer import config as cfg
from lab.bench.gen.base import Endpoints, Family, FrameSpec, Generator, TrialResult, mean_frame_size
from lab.bench.model import ENCAPS, VIP4, VIP6, VIP_PORT, Measured, Options, Report, lb_config, ndr_point
from lab.bench.results import finish
from lab.errors import LabError, UsageError
from lab.lbconf import lb_link
from lab.progress import BenchProgress
from lab.remote.target import Target, TrexPorts
from lab.remote.target import load as load_target

BENCH_INSTANCE = "l4lab-bench"
PREAMBLE_AND_GAP = 20  # bytes on the wire around every frame: preamble + start delimiter 8, gap 12
LATENCY_PPS = 1000.0
#: (endpoints, the port that counts, whether to measure latency) -> a generator sending from tx_port.
GeneratorFactory = Callable[[Endpoints, int, bool], Generator]


# --- the LB host ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LbHost:
    """The target's LB node and its data interface as the bench uses them."""

    target: Target
    node: str
    ifname: str  # the host's name for it
    mac: str
    mtu: int
    speed_mbps: int | None  # None: the driver does not say (virtual NICs)
    driver: str = ""  # `ethtool -i`
    model: str = ""  # lspci's vendor and device names, else the PCI ids

    def describe(self) -> str:
        speed = f"{self.speed_mbps / 1000:g} Gb/s" if self.speed_mbps else "speed unknown"
        return f"{self.node} ({self.target.node(self.node).ssh}) {self.ifname} {self.mac}, MTU {self.mtu}, {speed}"


def trex_ports(target: Target) -> TrexPorts:
    """The target's [trex] table, with the two MACs the bench cannot do without; UsageError naming the key."""
    if target.trex is None:
        raise UsageError(f"{target.path}: trex is missing: `l4lab bench --trex` needs a [trex] table with "
                         "server, tx_port, rx_port, tx_mac and rx_mac (see lab/remote/target.py)")
    for key, port in (("tx_mac", target.trex.tx_port), ("rx_mac", target.trex.rx_port)):
        if not getattr(target.trex, key):
            raise UsageError(f"{target.path}: trex.{key} must be the MAC address of TRex port {port} "
                             "but is not set")
    return target.trex


def lb_host(target: Target) -> LbHost:
    """The first node of role lb that the target lists, its data interface, MAC, MTU and link speed."""
    names = [n.name for n in target.topology.nodes_with_role("lb") if n.name in target.nodes]
    if not names:
        raise UsageError(f"{target.path}: nodes has no node of role lb of topology '{target.topology.name}'; "
                         "add a [nodes.NAME] table for the LB host")
    node = names[0]
    target.python_argv(node, "lab.bench.floorhold")  # UsageError now, not mid-run, when the LB has no repo
    topo_if = lb_link(target.topology, node)[0]
    ifname = target.node(node).ifname(topo_if)
    mac = target.mac(node, topo_if)
    # Netlink and ethtool, not /sys/class/net: they answer for the network namespace ssh lands in.
    quoted = shlex.quote(ifname)
    nic = (f"echo {_NIC_MARK}; ethtool -i {quoted} 2>/dev/null; bus=$(ethtool -i {quoted} 2>/dev/null | "
           f"sed -n 's/^bus-info: //p'); if [ -n \"$bus\" ]; then lspci -mm -nn -s \"$bus\" 2>/dev/null; fi; true")
    out = target.run(node, ["sh", "-c", f"ip -j link show dev {quoted} && {{ ethtool {quoted} 2>/dev/null || true; }}"
                                        f"; {nic}"]).stdout
    out, _, nic_text = out.partition(_NIC_MARK + "\n")
    first, _, rest = out.partition("\n")
    try:
        mtu = int(json.loads(first)[0]["mtu"])
    except (ValueError, LookupError, TypeError):
        raise LabError(f"cannot read the MTU of {ifname} on {node} from `ip -j link show`: got {first!r}") from None
    speed = next((_mbps(line) for line in rest.splitlines() if line.strip().startswith("Speed:")), None)
    driver, model = nic_identity(nic_text)
    return LbHost(target, node, ifname, mac, mtu, speed, driver, model)


_NIC_MARK = "--- nic ---"


def nic_identity(text: str) -> tuple[str, str]:
    """(driver, model) from `ethtool -i` followed by `lspci -mm -nn -s BUS`; empty strings when unknown.

    lspci -mm quotes its fields: slot "class [id]" "vendor [id]" "device [id]" …"""
    driver = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("driver:")), "")
    model = ""
    for line in text.splitlines():
        fields = re.findall(r'"([^"]*)"', line)
        if len(fields) >= 3 and "Ethernet" in fields[0]:
            model = f"{fields[1]} {fields[2]}".strip()
    return driver, model


def _mbps(line: str) -> int | None:
    """ethtool's "Speed: 25000Mb/s" in Mb/s; None for "Speed: Unknown!"."""
    value = line.split(":", 1)[1].strip().removesuffix("Mb/s")
    return int(value) if value.isdigit() and int(value) > 0 else None


class FloorHold:
    """`python -m lab.bench.floorhold` on the LB over ssh: the floor program stays attached while this runs.

    The ssh session runs in a session of its own, so a Ctrl-C meant for the bench does not cut it
    before the bench has read its last count; release() closes its input, which detaches."""

    def __init__(self, lb: LbHost, program: str, mode: str = "native", timeout_s: float = 60.0) -> None:
        self.what = f"the {program} floor on {lb.ifname} of {lb.node}"
        self.timeout_s = timeout_s
        argv = lb.target.python_argv(lb.node, "lab.bench.floorhold", "--interface", lb.ifname, "--program", program,
                                     "--mode", mode)
        self.proc = subprocess.Popen(lb.target.ssh_argv(lb.node, argv), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        self._buffer = b""
        line = self._readline()
        if line != "attached":
            problem = self._finish()
            raise LabError(f"cannot attach {self.what}: {problem or f'it answered {line!r}'}")

    def _readline(self) -> str | None:
        """The next line of output, or None at its end; LabError after timeout_s of silence."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + self.timeout_s
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise LabError(f"{self.what}: lab.bench.floorhold said nothing for {self.timeout_s:g} s")
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 4096)
                if not chunk:
                    return None
                self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode(errors="replace").strip()

    def count(self) -> int:
        """Packets the floor program has seen since it was attached."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(b"\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass  # it is gone: the read below says so
        line = self._readline()
        if line is None or not line.isdigit():
            raise LabError(f"{self.what}: lab.bench.floorhold stopped answering: {self._finish() or line!r}")
        return int(line)

    def _finish(self) -> str:
        """Close its input, wait for it, and return what went wrong ('' when it exited 0)."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            with contextlib.suppress(BrokenPipeError):
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.terminate()  # ssh goes; the remote side reads end of input and detaches
            self.proc.wait()
        assert self.proc.stderr is not None
        stderr = self.proc.stderr.read().decode(errors="replace").strip()
        self.proc.stderr.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.proc.returncode == 0:
            return ""
        why = stderr.splitlines()[-1].removeprefix("lab.bench.floorhold: ") if stderr else "no message"
        if self.proc.returncode == 255:
            why = f"ssh failed: {why}"
        return f"{why} (exit status {self.proc.returncode})"

    def release(self) -> None:
        """Detach: close its input and wait; LabError if it did not end cleanly."""
        problem = self._finish()
        if problem:
            raise LabError(f"cannot detach {self.what}: {problem}")


class RemoteBalancer:
    """One lbctl instance on the LB over ssh; its configs travel through one temporary file there."""

    def __init__(self, lb: LbHost, instance: str = BENCH_INSTANCE) -> None:
        self.lb = lb
        self.instance = instance
        self.config_path: str | None = None

    def lbctl(self, *args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
        t, node = self.lb.target, self.lb.node
        return t.run(node, t.python_argv(node, "balancer.cli", "--instance", self.instance, *args), timeout=timeout)

    def put_config(self, config: Any) -> str:
        """Write config to the temporary file on the LB (made on first use); its path there."""
        t, node = self.lb.target, self.lb.node
        if self.config_path is None:
            self.config_path = t.run(node, ["mktemp", "-t", "l4lab-bench.XXXXXXXX"]).stdout.strip()
        t.write(node, self.config_path, cfg.dump(config))
        return self.config_path

    def remove_config(self) -> None:
        if self.config_path is not None:
            self.lb.target.run(self.lb.node, ["rm", "-f", self.config_path])
            self.config_path = None

    def load(self, config: Any, mode: str = "native") -> None:
        self.lbctl("load", "--interface", self.lb.ifname, "--mode", mode, "--config", self.put_config(config))

    def apply(self, config: Any) -> None:
        self.lbctl("apply", self.put_config(config))

    def status(self) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.lbctl("status", "--json").stdout)
        return result

    def unload(self) -> None:
        self.lbctl("unload")


def bench_config(case: str, lb: LbHost, trex: TrexPorts) -> Any:
    """The balancer config of one encap for the hardware bench: next hop TRex's rx port, on the LB's NIC."""
    return lb_config(case, ifname=lb.ifname, nexthop_mac=trex.rx_mac, mtu=lb.mtu)


# --- measuring ------------------------------------------------------------------------------------


class LbCounted(Generator):
    """Trials whose frames the LB drops: a trial received what the LB's counter grew by while it ran."""

    name = "lb-counted"

    def __init__(self, inner: Generator, count: Callable[[], int]) -> None:
        self.inner = inner
        self.count = count

    def run(self, rate_pps: float, duration_s: float, frame_size: FrameSpec, flows: int,
            family: Family) -> TrialResult:
        before = self.count()
        sent = self.inner.run(rate_pps, duration_s, frame_size, flows, family)
        return TrialResult(sent.offered, sent.sent, self.count() - before, sent.duration)

    def close(self) -> None:
        self.inner.close()


def line_rate_pps(speed_mbps: int, size: FrameSpec) -> float:
    """Frames per second a link of speed_mbps carries at this frame size (size includes the FCS)."""
    return speed_mbps * 1e6 / ((mean_frame_size(size) + PREAMBLE_AND_GAP) * 8)


def max_rates(opts: Options, lb: LbHost) -> dict[FrameSpec, float]:
    """Where each frame size's search starts: line rate, capped by --max-rate-mpps."""
    rates = {}
    for size in opts.sizes:
        if lb.speed_mbps is not None:
            line = line_rate_pps(lb.speed_mbps, size)
            rates[size] = min(line, opts.max_rate_pps) if opts.max_rate_given else line
        elif opts.max_rate_given:
            rates[size] = opts.max_rate_pps
        else:
            raise UsageError(f"cannot read the link speed of {lb.ifname} on {lb.node} (its driver does not say); "
                             "pass --max-rate-mpps")
    return rates


def trex_generator(trex: TrexPorts) -> GeneratorFactory:
    """TrexGenerators of the target's server, sending from tx_port."""

    def make(endpoints: Endpoints, rx_port: int, latency: bool) -> Generator:
        from lab.bench.gen.trex import TrexGenerator  # TRex's client library is optional (setup.sh --extra trex)

        return TrexGenerator(trex.server, endpoints, tx_port=trex.tx_port, rx_port=rx_port,
                             sync_port=trex.sync_port, async_port=trex.async_port,
                             latency_pps=LATENCY_PPS if latency else 0.0)

    return make


def _undo(stack: ExitStack, what: str, fn: Callable[[], None]) -> None:
    """Run fn on the way out; when it fails while another error unwinds, that error carries a note."""

    def on_exit(exc_type: object, exc: BaseException | None, tb: object) -> bool:
        try:
            fn()
        except Exception as err:
            if exc is None:
                raise LabError(f"cannot {what}: {err}") from err
            exc.add_note(f"cannot {what}: {err}")
        return False

    stack.push(on_exit)


def _measure(gen: Generator, name: str, family: Family, opts: Options, rates: dict[FrameSpec, float],
             report: Report, say: Callable[[str], None], progress: BenchProgress) -> None:
    for size in opts.sizes:
        progress.start_point(name, str(size))
        measured: Measured = ndr_point(gen, name, size, opts.flows, family, opts.search_settings(rates[size]),
                                       on_trial=progress.trial)
        progress.end_point()
        report.ndr[(name, str(size))] = measured
        outcome = measured.result
        say(f"  {name:<11} {size!s:>5}  NDR {outcome.ndr_pps / 1e6:7.3f} Mpps  "
            f"PDR {outcome.pdr_pps / 1e6:7.3f} Mpps  ({len(outcome.trials)} trials)")


def measure(lb: LbHost, trex: TrexPorts, opts: Options, report: Report, make: GeneratorFactory,
            say: Callable[[str], None]) -> None:
    """The floors, then every encap, each at every frame size; the LB is clean again afterwards."""
    rates = max_rates(opts, lb)
    progress = BenchProgress((2 + len(opts.encaps)) * len(opts.sizes), opts.search_settings().max_trials)
    ep = Endpoints(src_mac=trex.tx_mac, dst_mac=lb.mac, dst4=VIP4, dst6=VIP6, dport=VIP_PORT)
    for name, program, rx_port in (("xdp_drop", "xdp_drop", trex.rx_port), ("xdp_tx", "xdp_tx_swap", trex.tx_port)):
        with ExitStack() as phase:
            hold = FloorHold(lb, program)
            _undo(phase, f"detach {hold.what}", hold.release)
            gen = make(ep, rx_port, False)
            phase.callback(gen.close)
            if program == "xdp_drop":
                gen = LbCounted(gen, hold.count)
            _measure(gen, name, 4, opts, rates, report, say, progress)
    if not opts.encaps:
        return
    with ExitStack() as phase:
        balancer = RemoteBalancer(lb)
        _undo(phase, f"remove the bench's config file on {lb.node}", balancer.remove_config)
        balancer.load(bench_config(opts.encaps[0], lb, trex))
        _undo(phase, f"unload lbctl instance {balancer.instance} on {lb.node}", balancer.unload)
        gen = make(ep, trex.rx_port, True)
        phase.callback(gen.close)
        for case in opts.encaps:
            balancer.apply(bench_config(case, lb, trex))
            _measure(gen, case, ENCAPS[case].vip_family, opts, rates, report, say, progress)


def bench_trex(opts: Options, say: Callable[[str], None] = print, make: GeneratorFactory | None = None) -> Report:
    """The hardware bench of opts.trex (a target file): measure, print the summary, write the results.

    `make` builds the generators (default: TrexGenerators of the target's [trex] server)."""
    if opts.trex is None:
        raise UsageError("the hardware bench needs --trex TARGET.toml")
    target = load_target(opts.trex)
    trex = trex_ports(target)
    lb = lb_host(target)
    started = time.monotonic()
    report = Report(generator="trex", egress_mtu=lb.mtu,
                    nic={"model": lb.model or "unknown", "driver": lb.driver, "speed_mbps": lb.speed_mbps}
                    if lb.driver else None)
    say(f"hardware bench of {target.name}: TRex {trex.server} port {trex.tx_port} → LB {lb.describe()} → "
        f"TRex port {trex.rx_port} (XDP_TX floor: port {trex.tx_port}; XDP_DROP floor: the LB's count)")
    say(f"NDR/PDR search ({'quick' if opts.quick else 'full'}), {opts.flows} flows:")
    with warnings.catch_warnings():  # SIGTERM unwinds as Ctrl-C does: the CLI's sigterm_unwinds()
        # TRex's bundled scapy 2.4.3 imports ciphers that `cryptography` deprecates: noise, on every run.
        warnings.filterwarnings("ignore", message=".* has been deprecated", module=r"scapy\.layers\.ipsec")
        measure(lb, trex, opts, report, make or trex_generator(trex), say)
    return finish(report, opts, started, say)
