"""ipvs.py: Linux IPVS as a device under test, as it is deployed: keepalived driving IPVS in tunnel mode.

The LB is a VM (lab/dut/ipvs_vm.py) whose tap sits in the router's namespace on a subnet of its
own; the router's VIP routes are pointed at the VM while it runs (and restored after), so the
lab's LB node stands idle. keepalived (Debian's package, in the VM) holds one virtual server per
VIP, port and protocol: `lvs_sched mh` hashing ports too (`mh-port`) and falling back from a
drained real (`mh-fallback`), `lvs_method TUN` (IPIP, or GUE variant 0), TCP_CHECK or HTTP_GET
health checks when a check asks for them. A change is keepalived.conf rewritten and a SIGHUP,
waited for until the kernel's table shows it. `--ipvs-control ipvsadm` drives IPVS with ipvsadm
alone (no health checks, no control plane to restart); `--ipvs-scheduler` picks another scheduler.
What differs from IPVS's defaults, and what it lacks, is lab/dut/ipvs.toml.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import operator
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from balancer import encaps
from lab.dut import keepalived
from lab.dut.base import Dut, HealthCheck, LabLike, LbLink
from lab.dut.fleet import ROUTER, Fleet
from lab.dut.ipvs_vm import IpvsLb, Service
from lab.errors import CommandError, LabError
from lab.poll import poll

DEFAULT_SCHEDULER = "mh:mh-port,mh-fallback"
CONTROLS = ("keepalived", "ipvsadm")
TABLE_DEADLINE_S = 15.0
SETTLE_DEADLINE_S = 20.0


def subnets(index: int) -> tuple[ipaddress.IPv4Network, ipaddress.IPv6Network]:
    """The VM's own link: a /29 and a /64 beside the router, outside every topology's prefixes."""
    return (ipaddress.IPv4Network(f"198.51.100.{32 + 8 * index}/29"),
            ipaddress.IPv6Network(f"2001:db8:1c:{index:x}::/64"))


class IpvsDut(Dut):
    """Linux IPVS (tunnel mode, Maglev `mh`) in a VM beside the router, driven by keepalived or ipvsadm."""

    name = "ipvs"
    router = "router"
    counter_lag_s = 2.0  # IPVS sums its per-CPU counters in its estimator, every 2 s

    def __init__(self, lab: LabLike, workdir: Path, options: Mapping[str, str] | None = None,
                 index: int = 0, steer: bool = True) -> None:
        super().__init__(lab, workdir, options)
        self.control = self.options.get("control", "keepalived")
        if self.control not in CONTROLS:
            raise LabError(f"--ipvs-control must be one of {', '.join(CONTROLS)} but got {self.control!r}")
        scheduler, _, flags = self.options.get("scheduler", DEFAULT_SCHEDULER).partition(":")
        self.scheduler, self.flags = scheduler, tuple(f for f in flags.split(",") if f)
        self.index, self.steer = index, steer
        self.tap = "vm-ipvs" if index == 0 else f"vm-ipvs{index}"
        self.vm: Any = None
        self._build = ""
        self._table_order: list[str] | None | bool = False  # the `order` keepalived built IPVS's table in
        self._stack = contextlib.ExitStack()

    @classmethod
    def variant(cls, options: Mapping[str, str]) -> str:
        scheduler = options.get("scheduler", DEFAULT_SCHEDULER).partition(":")[0]
        return f"{options.get('control', 'keepalived')} {scheduler}"

    @property
    def addresses(self) -> tuple[str, str, str, str]:
        """(VM IPv4, router IPv4, VM IPv6, router IPv6) on the VM's link."""
        net4, net6 = subnets(self.index)
        hosts4 = list(net4.hosts())
        return str(hosts4[1]), str(hosts4[0]), str(net6[2]), str(net6[1])

    def start(self) -> None:
        addr4, gw4, addr6, gw6 = self.addresses
        net4, net6 = subnets(self.index)
        all_vips = sorted({str(v.address) for v in self.lab.topology.vips})
        try:
            self.vm = IpvsLb(f"{self.lab.name}-ipvs{self.index}", netns=self.lab.netns(self.router), addr=addr4,
                             prefix=net4.prefixlen, gateway=gw4, vips=all_vips, tap=self.tap,
                             addr6=addr6, prefix6=net6.prefixlen, gateway6=gw6)
            self.vm.start()
            self._stack.callback(self.vm.stop)
            # A packet of a connection IPVS has no entry for (ECMP moved it from another LB, or its
            # entry expired) is scheduled too, not only a SYN: lab/dut/ipvs.toml.
            self.vm.sh("sysctl -w net.ipv4.vs.sloppy_tcp=1")
            if self.steer:
                self._stack.enter_context(steered(self.lab, self.router, {4: [addr4], 6: [addr6]}))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        try:
            self._stack.close()
        finally:
            self._stack = contextlib.ExitStack()
            self.vm = None
            self._build = ""
            self._table_order = False

    def build_info(self) -> str:
        if self.vm is None:
            return self.spec().product
        if not self._build:
            self._build = self._ask_build()
        return self._build

    def _ask_build(self) -> str:
        kernel = self.vm.sh("uname -r")[1].strip()
        ipvsadm = self.vm.sh("ipvsadm --version")[1].strip().splitlines()[:1]
        daemon = self.vm.sh("keepalived --version 2>&1 | head -n 1")[1].strip() if self.control == "keepalived" else ""
        flags = f":{','.join(self.flags)}" if self.flags else ""
        return (f"Linux {kernel} IPVS, {' '.join(ipvsadm)}, {daemon or 'no daemon'}; driven by {self.control}, "
                f"scheduler {self.scheduler}{flags}")

    # -- the wanted state ---------------------------------------------------------------------

    def _tunnel(self) -> str:
        assert self.encap_id is not None
        return "gue" if encaps.by_id(self.encap_id).gue else "ipip"

    def _services(self) -> list[keepalived.VirtualServer]:
        reals = self.reals()
        members = tuple(keepalived.RealServer(reals[n], self.weights[n]) for n in self.ordered(self.weights))
        out = []
        for vip in self.lab.topology.vips:
            if vip.address.version != self.family:
                continue
            for port, proto in [(p.port, p.proto) for p in vip.ports] + list(self.extra_ports):
                out.append(keepalived.VirtualServer(str(vip.address), port, proto, self.scheduler, self.flags,
                                                    self._tunnel(), members, self.healthcheck))
        return out

    def _wanted_table(self) -> dict[str, dict[str, int]]:
        return {f"{s.proto} {_host(s.vip)}:{s.port}": {r.address: r.weight for r in s.reals} for s in self._services()}

    # -- configuring ---------------------------------------------------------------------------

    def configure(self, encap_id: str, weights: Mapping[str, int] | None = None,
                  extra_ports: Sequence[tuple[int, str]] = (), healthcheck: HealthCheck | None = None) -> None:
        if healthcheck is not None and self.control != "keepalived":
            raise LabError("IPVS driven by ipvsadm alone has no health checks: run with --ipvs-control keepalived")
        self._remember(encap_id, weights, extra_ports, healthcheck)
        if self.control == "keepalived":
            self._keepalived_apply()
        else:
            self._ipvsadm_configure()

    def _keepalived_apply(self) -> None:
        config = keepalived.render(self._services())
        if self.vm.keepalived_pids() and self._table_order == self.order:
            self.vm.keepalived_reload(config)
        else:
            # keepalived adds the reals a table lacks and leaves the others where they are, and mh builds
            # its table in dest-list order: told of the reals in another order, the node builds it anew
            # (suites/conformance/test_dut_multilb.py compares nodes told different orders).
            if self.vm.keepalived_pids():
                self._keepalived_stop("TERM")
            self.vm.clear()
            self.vm.keepalived_start(config)
            self._table_order = self.order
        self._wait_table()

    def _keepalived_stop(self, signal: str) -> None:
        """Signal keepalived (TERM leaves IPVS as it is, with -I) and wait until its processes are gone."""
        self.vm.keepalived_stop(signal)
        # A crash kills what is left too: a checker forked while its parent died has no one to stop it.
        left = (lambda: self.vm.keepalived_signal("KILL")) if signal == "KILL" else self.vm.keepalived_pids
        gone = poll(TABLE_DEADLINE_S, left, "keepalived's processes gone",
                    until=operator.not_, check=False, interval_s=0.1)
        if gone:
            raise LabError(f"keepalived processes {gone} outlived SIG{signal} for {TABLE_DEADLINE_S:g} s: "
                           f"{self.vm.keepalived_log()[-800:]}")

    def _wait_table(self) -> None:
        want = self._wanted_table()
        got = poll(TABLE_DEADLINE_S, self.vm.table, "keepalived programming IPVS", until=lambda t: t == want,
                   check=False, interval_s=0.2)
        if got != want:
            raise LabError(f"keepalived did not program IPVS within {TABLE_DEADLINE_S:g} s: the table is {got}, "
                           f"the config asks {want}; keepalived said: {self.vm.keepalived_log()[-1500:]}")

    def _ipvsadm_configure(self) -> None:
        self.vm.clear()
        self.vm.ipvsadm("--set", *map(str, keepalived.TIMEOUTS))
        for vs in self._services():
            svc = Service(vs.vip, vs.port, vs.proto, self.scheduler, self.flags)
            self.vm.add_service(svc)
            for real in vs.reals:
                self.vm.add_real(svc, real.address, weight=real.weight, tunnel=vs.tunnel)

    def _change(self, real: str, weight: int | None) -> None:
        """Apply one real's new weight (None: removed) through the control plane."""
        if self.control == "keepalived":
            self._keepalived_apply()
            return

        address = self.reals()[real]
        for vs in self._services():
            svc = Service(vs.vip, vs.port, vs.proto, self.scheduler, self.flags)
            present = address in self.vm.table().get(f"{vs.proto} {_host(vs.vip)}:{vs.port}", {})
            if weight is None:
                self.vm.delete_real(svc, address)
            elif present:
                self.vm.edit_real(svc, address, weight=weight, tunnel=vs.tunnel)
            else:
                self.vm.add_real(svc, address, weight=weight, tunnel=vs.tunnel)

    def set_weight(self, real: str, weight: int) -> None:
        self.weights[real] = weight
        self._change(real, weight)

    def remove_real(self, real: str) -> None:
        self.weights.pop(real, None)
        self._change(real, None)

    def add_real(self, real: str, weight: int = 1) -> None:
        self.weights[real] = weight
        self._change(real, weight)

    def restart_control_plane(self, how: str = "crash") -> float:
        """keepalived killed (crash: SIGKILL to every process; graceful: SIGTERM, which with -I leaves
        IPVS as it is) and started again; returns the seconds until the new one held the table."""
        if self.control != "keepalived":
            return super().restart_control_plane(how)
        started = time.monotonic()
        self._keepalived_stop("KILL" if how == "crash" else "TERM")
        self.vm.keepalived_start(keepalived.render(self._services()))
        self._wait_table()
        return time.monotonic() - started

    # -- observing -----------------------------------------------------------------------------

    @classmethod
    def fleet(cls, lab: LabLike, workdir: Path, options: Mapping[str, str], count: int = 2) -> Fleet:
        return IpvsFleet(lab, workdir, options, count)

    def forwarded(self) -> dict[str, int]:
        by_addr = {a: n for n, a in self.reals().items()}
        out = {n: 0 for n in self.reals()}
        for svc in self.vm.stats().values():
            for addr, st in svc.reals.items():
                if addr in by_addr:
                    out[by_addr[addr]] += st.in_pkts
        return out

    def link(self) -> LbLink:
        return LbLink(self.router, self.tap, self.vm.mac.lower())

    def settle(self, port: int | None = None) -> None:
        """Wait until IPVS's connection entries (to `port`) expired: it keeps scheduling a known 5-tuple
        to the real it had (lvs_timeouts: 5 s established, 2 s after a FIN, 2 s UDP)."""
        def entries() -> list[dict[str, str]]:
            return [c for c in self.vm.connections() if port is None or c["virtual"].endswith(f":{port}")]

        left = poll(SETTLE_DEADLINE_S, entries, "IPVS's connection entries expired",
                    until=operator.not_, check=False, interval_s=0.5)
        if left:
            raise LabError(f"IPVS kept connection entries for {SETTLE_DEADLINE_S:g} s: {left[:3]}")

    def evidence(self) -> str:
        try:
            text = str(self.vm.ipvsadm("-Ln", "--stats", "--exact")) + "\n" + str(self.vm.ipvsadm("-Lnc"))[-1500:]
            if self.control == "keepalived":
                text += "\nkeepalived:\n" + self.vm.keepalived_log()[-1000:]
            return text
        except LabError as exc:
            return f"ipvsadm failed: {exc}"


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


@contextlib.contextmanager
def steered(lab: LabLike, router: str, via: Mapping[int, Sequence[str]]) -> Any:
    """Point the router's routes to the topology's VIPs at `via` (per family: one next hop, or
    several as one ECMP route) while the block runs; restore the topology's routes after."""
    ns = lab.netns(router)
    with contextlib.ExitStack() as undo:
        for vip in lab.topology.vips:
            v = vip.address
            dst = f"{v}/{v.max_prefixlen}"
            old = subprocess.run(["ip", "-n", ns, "-j", f"-{v.version}", "route", "show", dst],
                                 capture_output=True, text=True, check=True).stdout
            previous = json.loads(old or "[]")
            route(ns, dst, v.version, via[v.version])
            if previous and previous[0].get("gateway"):
                undo.callback(route, ns, dst, v.version, [previous[0]["gateway"]])
            else:
                undo.callback(_ip, ns, f"-{v.version}", "route", "del", dst)
        yield


def route(ns: str, dst: str, family: int, hops: Sequence[str]) -> None:
    """`ip route replace dst` via one next hop, or via several (ECMP)."""
    if len(hops) == 1:
        _ip(ns, f"-{family}", "route", "replace", dst, "via", hops[0])
    else:
        _ip(ns, f"-{family}", "route", "replace", dst, *[w for h in hops for w in ("nexthop", "via", h)])


def _ip(ns: str, *args: str) -> None:
    done = subprocess.run(["ip", "-n", ns, *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise CommandError(f"ip -n {ns} {' '.join(args)} failed: {done.stderr.strip()}",
                           command=" ".join(args), stderr=done.stderr)


class IpvsFleet(Fleet):
    """IPVS VMs beside the router (topology multi-lb, whose LB nodes stay idle), one static ECMP route
    over them; a member dies as its VM is killed, and the router drops the next hop whose tap lost
    its carrier (ignore_routes_with_linkdown)."""

    def __init__(self, lab: LabLike, workdir: Path, options: Mapping[str, str], count: int) -> None:
        super().__init__(lab, [IpvsDut(lab, workdir / f"ipvs{i}", options, index=i, steer=False)
                               for i in range(count)])

    def _ipvs(self, index: int) -> IpvsDut:
        member = self.members[index]
        assert isinstance(member, IpvsDut)
        return member

    def _hops(self, skip: int | None = None) -> dict[int, list[str]]:
        live = [self._ipvs(i).addresses for i in range(len(self.members)) if i != skip]
        return {4: [a[0] for a in live], 6: [a[2] for a in live]}

    def start(self) -> None:
        super().start()
        try:
            for family in (4, 6):
                key = f"net.ipv{family}.conf.all.ignore_routes_with_linkdown"
                old = self.lab.run(ROUTER, ["sysctl", "-n", key]).stdout.strip()
                self.lab.run(ROUTER, ["sysctl", "-q", "-w", f"{key}=1"])
                self._stack.callback(self.lab.run, ROUTER, ["sysctl", "-q", "-w", f"{key}={old}"], check=False)
            self._stack.enter_context(steered(self.lab, ROUTER, self._hops()))
        except BaseException:
            self.stop()
            raise

    def _route(self, hops: dict[int, list[str]]) -> None:
        ns = self.lab.netns(ROUTER)
        for vip in self.lab.topology.vips:
            route(ns, f"{vip.address}/{vip.address.max_prefixlen}", vip.address.version, hops[vip.address.version])

    def _join(self) -> None:
        self._route(self._hops())

    def _revive(self, index: int) -> None:
        member = self._ipvs(index)
        if member.vm is not None and not member.vm.alive:
            member.stop()
            member.start()

    def withdraw(self, index: int) -> float:
        self._route(self._hops(skip=index))
        rest = {p for i, p in enumerate(self.member_paths()) if i != index}
        return self.wait_paths(rest, f"the route leaving IPVS VM {index}")

    def kill(self, index: int) -> float:
        died = time.monotonic()
        self._ipvs(index).vm.kill()
        rest = {p for i, p in enumerate(self.member_paths()) if i != index}
        return self.wait_paths(rest, f"the router dropping the next hop of the dead IPVS VM {index}") - died
