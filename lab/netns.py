"""The netns lab builder: turns a Topology into namespaces, veths, addresses, routes, programs and services.

Nodes of kind "vm" get no namespace: their link's other end is a tap in that node's namespace,
made by the VM's supervisor process (lab.remote.vmnodes). Nodes with `bgp_asn` get their FRR daemons and,
on LB nodes, the health hook that announces the VIPs (lab.frr); the build waits for every BGP
session to be Established.

Every step that creates something registers its undo in an ExitStack and in the lab's persisted
journal (lab.state) the moment it succeeds, with signals held in between (lab.signals.deferred); a
failure or KeyboardInterrupt at any step unwinds everything already made, and `teardown()` replays the
journal of a lab built by another process.
Undo tolerates only "already gone" (ENOENT, ENODEV, ESRCH) and re-raises the rest.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import operator
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

from pyroute2 import IPRoute, netns
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl.ifaddrmsg import IFA_F_NODAD, IFA_F_TENTATIVE

from balancer import preflight
from balancer.errors import LbError
from lab import frr, programs, services, status
from lab.errors import LabError, LabExistsError
from lab.nsconf import set_tx_checksum, write_sysctl
from lab.nsexec import entered, netns_path
from lab.poll import poll
from lab.remote import vmnodes
from lab.signals import deferred
from lab.state import (
    BPF_DIR,
    RUN_DIR,
    LabState,
    Process,
    Undo,
    check_name,
    netns_name,
    pin_dir,
    state_dir,
)
from lab.topology import Endpoint, Node, Topology

GONE = (errno.ENOENT, errno.ENODEV, errno.ESRCH)
READY_TIMEOUT_S = 5.0
FIRST_IFINDEX = 1000  # the first end of link k is ifindex FIRST_IFINDEX + k (see Builder._make_veth)
_MNT_DETACH = 2

_libc = ctypes.CDLL(None, use_errno=True)


class InjectedFailure(LabError):
    """Raised by a build told to fail at a given step (tests of the unwinding)."""


class Builder:
    """Builds one lab; `build()` returns its state or leaves nothing behind."""

    def __init__(
        self,
        topology: Topology,
        lab: str,
        *,
        programs: bool = True,
        balancers: bool = False,
        fail_at: int | None = None,
        interrupt_at: int | None = None,
        on_step: Callable[[str], None] | None = None,
    ) -> None:
        self.topo = topology
        self.on_step = on_step  # told the name of each step as it starts (progress on a terminal)
        self.lab = check_name(lab)
        self.with_programs = programs
        self.with_balancers = balancers
        self.fail_at = fail_at
        self.interrupt_at = interrupt_at
        self.steps = 0
        self.state = LabState(lab, topology.name, str(topology.path), time.time(), builder_pid=os.getpid(),
                              builder_start=services.starttime(os.getpid()))
        self.ipr: dict[str, IPRoute] = {}

    # ---- step and journal machinery

    @contextmanager
    def _step(self, what: str) -> Iterator[None]:
        """One build step: counts it, names it to on_step, injects the requested failure, names it in any error."""
        self.steps += 1
        if self.on_step is not None:
            self.on_step(what)
        if self.steps == self.fail_at:
            raise InjectedFailure(f"injected failure at step {self.steps}: {what}", step=what)
        if self.steps == self.interrupt_at:
            raise KeyboardInterrupt(f"injected interrupt at step {self.steps}: {what}")
        try:
            yield
        except NetlinkError as exc:
            raise LabError(f"{what}: {os.strerror(exc.code)} (netlink error {exc.code})", step=what) from exc
        except OSError as exc:
            raise LabError(f"{what}: {exc.strerror or exc}", step=what) from exc
        except LbError as exc:
            raise LabError(f"{what}: {exc}", step=what) from exc

    def _register(self, stack: ExitStack, undo: Undo) -> None:
        stack.callback(undo_one, undo)
        self.state.undo.append(undo)
        self.state.save()

    # ---- the build

    def build(self) -> LabState:
        """Build the whole lab; on any failure (or KeyboardInterrupt) remove what was made, then raise."""
        with ExitStack() as stack:
            stack.callback(self._close_sockets)
            self._make_state_dir(stack)
            self._check_tools()
            for node in self.topo.netns_nodes():
                self._make_node(stack, node)
            for k, link in enumerate(self.topo.links):
                if not self.topo.is_vm_endpoint(link.a):
                    self._make_veth(stack, link.a, link.b, link.mtu, FIRST_IFINDEX + k)
            for node in self.topo.netns_nodes():
                self._configure_node(node)
            for node in self.topo.netns_nodes():
                self._links_up(node)
            self._wait_links_ready()
            for node in self.topo.netns_nodes():
                self._add_routes(node, via_vm=False)
            for link in self.topo.links:
                for ep in link.endpoints:
                    self._set_offloads(ep)
            if self.with_programs:
                self._attach_programs(stack)
            self._start_services(stack)
            self._start_vms(stack)
            for node in self.topo.netns_nodes():
                self._add_routes(node, via_vm=True)  # through a VM's tap: there once the VM is
            if self.with_balancers:
                self._load_balancers(stack)
            self._start_frr(stack)
            with self._step("record the lab as complete"):
                self.state.complete = True
                self.state.save()
            stack.pop_all()
            self._close_sockets()
        return self.state

    def _load_balancers(self, stack: ExitStack) -> None:
        """Load the balancer on every LB node as `lbctl load` does: the topology's VIPs, IPIP to the reals.

        In-process (the thread enters the node's namespace to attach): a subprocess would add a
        second of interpreter start-up to `l4lab up`. The instance is `<lab>-<node>`, so
        `lbctl --instance <lab>-<node> ...` in that node manages it afterwards.
        """
        from balancer import config as cfg  # numpy: only LB nodes load a balancer
        from balancer.controller import Instance  # numpy, libbpf: only LB nodes load a balancer
        from lab.lbconf import balancer_config, lb_link  # numpy (the balancer config): only LB nodes load a balancer
        from lab.remote import lbvm  # qemu and the LB image: only a bond-vlan LB VM needs them

        for node in self.topo.nodes_with_role("lb"):
            instance = f"{self.lab}-{node.name}"
            families = {v.address.version for v in self.topo.vips}
            if node.kind == "vm":  # its instance lives and dies with the VM: nothing to journal
                with self._step(f"load the balancer in VM {node.name} (lbctl instance {instance})"):
                    lbvm.load_balancer(lbvm.in_lab(self.lab, node.name), instance,
                                       balancer_config(self.topo, self.lab, encaps=dict.fromkeys(families, "ipip"),
                                                       lb=node.name))
                continue
            with self._step(f"check that no balancer instance {instance} exists"):
                left = [str(p) for p in (Path(Instance.pin_dir(instance)), Instance.state_path(instance))
                        if p.exists()]
                if left:
                    raise LabError(f"balancer instance {instance} exists already ({', '.join(left)}) while "
                                   f"lab '{self.lab}' is not up; remove it with "
                                   f"`lbctl --instance {instance} unload` (or remove those paths)")
            # Journaled before the load: a build killed during it still has its pins removed by `down`.
            self._register(stack, Undo("balancer", instance))
            with self._step(f"load the balancer on {node.name} (lbctl instance {instance})"):
                conf = balancer_config(self.topo, self.lab, encaps=dict.fromkeys(families, "ipip"), lb=node.name)
                (state_dir(self.lab) / f"lb-{node.name}.toml").write_text(cfg.dump(conf))
                with entered(netns_name(self.lab, node.name)):
                    Instance.load(instance, [lb_link(self.topo, node.name)[0]], "native", conf).close()

    def _check_tools(self) -> None:
        """Refuse early, before any namespace exists, when FRR or qemu is needed and missing, or
        the host cannot take a lab (capabilities, bpffs hidden)."""
        with self._step("check the capabilities and bpffs"):
            require_host(with_bpf=self.with_programs or self.with_balancers)

        if self.topo.bgp_nodes():
            with self._step("check that FRR is installed"):
                reason = frr.missing()
                if reason:
                    raise LabError(f"topology '{self.topo.name}' runs BGP nodes but {reason}")
        if self.topo.vm_nodes():
            with self._step("check that qemu and the VM kernel are installed"):
                reason = vmnodes.missing(lb=any(n.role == "lb" for n in self.topo.vm_nodes()))
                if reason:
                    raise LabError(f"topology '{self.topo.name}' has VM nodes but {reason}")

    def _endpoints(self, node: str) -> list[Endpoint]:
        """The endpoints of `node` that the builder makes (a VM's tap is made by its supervisor)."""
        return [ep for ep in self.topo.endpoints_of(node) if not self.topo.is_vm_endpoint(ep)]

    def _close_sockets(self) -> None:
        for ipr in self.ipr.values():
            ipr.close()
        self.ipr.clear()

    def _make_state_dir(self, stack: ExitStack) -> None:
        path = state_dir(self.lab)
        with deferred(), self._step(f"create the state directory {path}"):
            RUN_DIR.mkdir(parents=True, exist_ok=True)
            taken = [
                netns_name(self.lab, n.name)
                for n in self.topo.nodes
                if netns_path(netns_name(self.lab, n.name)).exists()
            ]
            try:
                path.mkdir()
            except FileExistsError as exc:
                raise LabExistsError(
                    f"a lab named '{self.lab}' is already up ({path} exists); "
                    f"run `l4lab down --name {self.lab}` first"
                ) from exc
            if taken:
                path.rmdir()
                raise LabExistsError(
                    f"network namespace {taken[0]} already exists but belongs to no running lab; "
                    f"remove it with `ip netns del {taken[0]}`"
                )
            self._register(stack, Undo("state-dir", str(path)))

    def _make_node(self, stack: ExitStack, node: Node) -> None:
        ns = netns_name(self.lab, node.name)
        # Made and journaled as one: pyroute2 makes the namespace in a forked child, which would finish
        # it after an interrupted build had unwound.
        with deferred(), self._step(f"create network namespace {ns}"):
            netns.create(ns)
            self._register(stack, Undo("netns", ns))
        with self._step(f"open a netlink socket in {ns}"), entered(ns):
            self.ipr[node.name] = IPRoute()
        for key, value in node.sysctls:
            if ".*." not in key:
                with self._step(f"set {key}={value} in {ns}"):
                    write_sysctl(ns, key, value)

    def _make_veth(self, stack: ExitStack, a: Endpoint, b: Endpoint, mtu: int, index: int) -> None:
        """A veth pair; end a gets ifindex `index`, which never equals its peer's.

        The two ends of a veth in fresh namespaces both get ifindex 2; the kernel then takes the
        pair for a device linked to itself and delays its carrier events by up to a second
        (linkwatch's non-urgent path). Distinct indexes make `up` 0.8 s faster.
        """
        ns_a, ns_b = netns_name(self.lab, a.node), netns_name(self.lab, b.node)
        with deferred(), self._step(f"create veth {a.ifname} in {ns_a} with peer {b.ifname} in {ns_b}"):
            fd = os.open(netns_path(ns_b), os.O_RDONLY | os.O_CLOEXEC)
            try:
                self.ipr[a.node].link(
                    "add",
                    index=index,
                    ifname=a.ifname,
                    kind="veth",
                    mtu=mtu,
                    peer={"ifname": b.ifname, "net_ns_fd": fd},
                )
            finally:
                os.close(fd)
            self._register(stack, Undo("veth", a.ifname, netns=ns_a))
        with self._step(f"set MTU {mtu} on {b.ifname} in {ns_b}"):
            ipr = self.ipr[b.node]
            ipr.link("set", index=_index(ipr, b.ifname, ns_b), mtu=mtu)

    def _configure_node(self, node: Node) -> None:
        ns = netns_name(self.lab, node.name)
        ipr = self.ipr[node.name]
        # A VM's tap appears later and inherits the `default` values set here.
        ifnames = [ep.ifname for ep in self._endpoints(node.name)]
        for key, value in node.sysctls:
            if ".*." in key:
                for ifname in ("all", "default", "lo", *ifnames):
                    concrete = key.replace(".*.", f".{ifname}.")
                    with self._step(f"set {concrete}={value} in {ns}"):
                        write_sysctl(ns, concrete, value)
        for ep in self._endpoints(node.name):
            index = _index(ipr, ep.ifname, ns)
            for addr in ep.all_addresses:
                with self._step(f"add address {addr} to {ep.ifname} in {ns}"):
                    flags = IFA_F_NODAD if addr.version == 6 else 0
                    ipr.addr(
                        "add",
                        index=index,
                        address=str(addr.ip),
                        prefixlen=addr.network.prefixlen,
                        flags=flags,
                    )
        if node.role == "real":
            lo = _index(ipr, "lo", ns)
            for vip in self.topo.vips:
                plen = vip.address.max_prefixlen
                with self._step(f"add VIP {vip.address}/{plen} to lo in {ns}"):
                    flags = IFA_F_NODAD if vip.address.version == 6 else 0
                    ipr.addr("add", index=lo, address=str(vip.address), prefixlen=plen, flags=flags)

    def _links_up(self, node: Node) -> None:
        ns = netns_name(self.lab, node.name)
        ipr = self.ipr[node.name]
        for ifname in ("lo", *[ep.ifname for ep in self._endpoints(node.name)]):
            with self._step(f"set {ifname} up in {ns}"):
                ipr.link("set", index=_index(ipr, ifname, ns), state="up")

    def _wait_links_ready(self) -> None:
        """Poll until every lab interface has carrier and no address is tentative."""
        with self._step("wait for links up and addresses usable"):
            pending = poll(READY_TIMEOUT_S,
                           lambda: [f"{netns_name(self.lab, n)}/{what}" for n, what in self._not_ready()],
                           "links up and addresses usable", until=operator.not_, check=False, interval_s=0.001)
            if pending:
                raise LabError(f"links or addresses not ready within {READY_TIMEOUT_S:g} s: {', '.join(pending[:5])}")

    def _not_ready(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for node in self.topo.netns_nodes():
            ipr = self.ipr[node.name]
            mine = {ep.ifname for ep in self._endpoints(node.name)}
            names = {}
            for link in ipr.get_links():
                name = link.get_attr("IFLA_IFNAME")
                names[link["index"]] = name
                if name in mine and link.get_attr("IFLA_OPERSTATE") != "UP":
                    out.append((node.name, f"{name} is {link.get_attr('IFLA_OPERSTATE')}"))
            for addr in ipr.get_addr():
                flags = addr.get_attr("IFA_FLAGS") or addr["flags"]
                if flags & IFA_F_TENTATIVE:
                    out.append(
                        (
                            node.name,
                            f"{addr.get_attr('IFA_ADDRESS')} on {names.get(addr['index'])} is tentative",
                        )
                    )
        return out

    def _add_routes(self, node: Node, via_vm: bool) -> None:
        ns = netns_name(self.lab, node.name)
        ipr = self.ipr[node.name]
        taps = [a.network for ep in self.topo.endpoints_of(node.name) if self.topo.is_vm_endpoint(ep)
                for a in ep.addresses]
        for route in node.routes:
            if any(route.via in net for net in taps) != via_vm:
                continue
            with self._step(f"add route {route.describe()} in {ns}"):
                dst = (
                    str(route.dst)
                    if route.dst is not None
                    else ("0.0.0.0/0" if route.family == 4 else "::/0")
                )
                family = socket.AF_INET if route.family == 4 else socket.AF_INET6
                ipr.route("add", family=family, dst=dst, gateway=str(route.via))

    def _set_offloads(self, ep: Endpoint) -> None:
        if self.topo.is_vm_endpoint(ep):
            return
        ns = netns_name(self.lab, ep.node)
        for feature, on in ep.offloads:
            with self._step(f"set {feature} checksum offload {'on' if on else 'off'} on {ep.ifname} in {ns}"):
                set_tx_checksum(ns, ep.ifname, on)

    def _attach_programs(self, stack: ExitStack) -> None:
        root = pin_dir(self.lab)
        with deferred(), self._step(f"create the pin directory {root}"):
            programs.require_bpffs()
            BPF_DIR.mkdir(exist_ok=True)
            root.mkdir()
            self._register(stack, Undo("pin-dir", str(root)))

        def journal(kind: str, path: str) -> None:
            self._register(stack, Undo(kind, path))

        for node in self.topo.netns_nodes():
            ns = netns_name(self.lab, node.name)
            xdp_eps = [ep for ep in self._endpoints(node.name) if ep.xdp is not None]
            if not xdp_eps and node.decap is None:
                continue
            node_dir = root / node.name
            with deferred(), self._step(f"create the pin directory {node_dir}"):
                node_dir.mkdir()
                self._register(stack, Undo("pin-dir", str(node_dir)))
            for ep in xdp_eps:
                assert ep.xdp is not None
                with deferred(), self._step(f"attach XDP {ep.xdp.program} ({ep.xdp.object}) to {ep.ifname} in {ns}"):
                    self.state.programs.append(
                        programs.attach_xdp(ns, ep.ifname, ep.xdp, node_dir, node.name, journal)
                    )
            if node.decap is not None:
                addrs = [a.ip for ep in self.topo.endpoints_of(node.name) for a in ep.all_addresses]
                with deferred(), self._step(f"attach decap ({node.decap.attach}) to {node.decap.ifname} in {ns}"):
                    self.state.programs.append(
                        programs.attach_decap(ns, node.decap, addrs, node_dir, node.name, journal)
                    )
            self.state.save()

    def _start_services(self, stack: ExitStack) -> None:
        run_dir = state_dir(self.lab)
        started = []
        for node in self.topo.nodes_with_role("real"):
            if node.kind != "netns":
                continue  # a VM real runs its services itself
            binds = [
                (port.service, str(vip.address), port.port) for vip in self.topo.vips for port in vip.ports
            ]
            if not binds:
                continue
            ns = netns_name(self.lab, node.name)
            with deferred(), self._step(f"start the services of {node.name} in {ns}"):
                proc = services.start(self.lab, ns, node.name, binds, run_dir)
                self.state.processes.append(proc)
                self._register(stack, Undo("process", str(proc.pid), starttime=proc.starttime))
            started.append(proc)
        with self._step("wait for the services to listen"):
            services.wait_ready(started, run_dir)

    def _start_vms(self, stack: ExitStack) -> None:
        """Boot every VM node (in parallel), each under a supervisor process; journal both processes."""
        started = []
        for node in self.topo.vm_nodes():
            vm_ep, tap_ep = self.topo.vm_link(node.name)
            ns = netns_name(self.lab, tap_ep.node)
            with deferred(), self._step(f"start {_vm_word(node)} {node.name} (tap {tap_ep.ifname} in {ns})"):
                proc = vmnodes.start(self.lab, ns, self.topo, node, state_dir(self.lab))
                self.state.processes.append(proc)
                self._register(stack, Undo("process", str(proc.pid), starttime=proc.starttime))
            started.append(proc)
        for proc in started:
            with self._step(f"wait for {_vm_word(self.topo.node(proc.node))} {proc.node} to boot"):
                ready = vmnodes.wait_ready(proc, state_dir(self.lab))
            qemu = vmnodes.qemu_process(proc.node, ready)
            self.state.processes.append(qemu)
            self._register(stack, Undo("process", str(qemu.pid), starttime=qemu.starttime))
            self.state.vm_boot_seconds[proc.node] = ready.boot_seconds
            self.state.vm_guest_uptime[proc.node] = ready.guest_uptime
            self.state.save()

    def _start_frr(self, stack: ExitStack) -> None:
        """Start zebra, bfdd and bgpd in every BGP node, the health hook in LB nodes; wait for BGP."""
        nodes = self.topo.bgp_nodes()
        if not nodes:
            return
        frr_root = state_dir(self.lab) / "frr"
        for node in nodes:
            ns = netns_name(self.lab, node.name)
            with self._step(f"write the FRR configs of {node.name}"):
                frr.write_configs(self.lab, self.topo, node)
            for daemon in frr.DAEMONS:
                with deferred(), self._step(f"start {daemon} in {ns}"):
                    proc = frr.start_daemon(self.lab, ns, node.name, daemon)
                    self.state.processes.append(proc)
                    self._register(stack, Undo("process", str(proc.pid), starttime=proc.starttime))
                with self._step(f"wait for {daemon} of {node.name}"):
                    frr.wait_daemon(self.lab, proc, daemon)
            if node.role == "lb":
                interface = self._endpoints(node.name)[0].ifname
                with deferred(), self._step(f"start the health hook of {node.name} in {ns}"):
                    proc = frr.start_hook(self.lab, ns, self.topo, node.name, interface)
                    self.state.processes.append(proc)
                    self._register(stack, Undo("process", str(proc.pid), starttime=proc.starttime))
                with self._step(f"wait for the health hook of {node.name}"):
                    frr.wait_hook(self.lab, proc)
        with self._step(f"wait for every BGP session to be Established (logs under {frr_root})"):
            self.state.bgp_established_seconds = frr.wait_established(self.lab, self.topo)
            self.state.save()


def _vm_word(node: Node) -> str:
    return "VM real" if node.role == "real" else "LB VM"


def build(
    topology: Topology,
    lab: str,
    *,
    programs: bool = True,
    balancers: bool = False,
    fail_at: int | None = None,
    interrupt_at: int | None = None,
    on_step: Callable[[str], None] | None = None,
) -> LabState:
    """Build `topology` as lab `lab`; see Builder (balancers: also `lbctl load` on every LB node;
    on_step: called with each step's name as it starts)."""
    return Builder(topology, lab, programs=programs, balancers=balancers, fail_at=fail_at,
                   interrupt_at=interrupt_at, on_step=on_step).build()


def journal(lab: str, undo: Undo) -> None:
    """Add to lab `lab`'s journal a resource about to be made in it after its build (a balancer that lbctl
    loads), so that teardown() and `l4lab down` remove it with the rest, also when its making was cut short."""
    state = LabState.load(lab)
    state.undo.append(undo)
    state.save()


def teardown(lab: str) -> list[tuple[str, str]]:
    """Remove lab `lab` as its journal records it (in reverse order); return what was removed,
    as (journal kind, description) pairs.

    Whatever happened since `up` (a daemon that died, an lbctl that failed, resources removed by
    hand), every entry is attempted: one that is already gone is skipped, one that cannot be
    removed is kept in the journal with the state directory, so that a second `down` can finish,
    and the failures are raised together once the rest is gone. A balancer instance goes by its
    pins and state file, not through a state file that a failed command may have removed.
    """
    directory = state_dir(lab)
    if directory.is_dir() and not (directory / "state.json").exists():
        shutil.rmtree(directory)  # a build that died before its first journal entry
        return [("state-dir", f"state directory {directory} (no journal yet)")]
    state = LabState.load(lab)
    made_by = status.builder(state)
    if not state.complete and made_by["alive"] and made_by["pid"] != os.getpid():
        # Removing what a running builder journals next would race it: it would make more after the undo.
        raise LabError(f"lab '{lab}' is being built by pid {made_by['pid']}: stop that first (an interrupt "
                       "removes what it built; after a SIGKILL `down` does), or wait for it")
    try:
        require_host(with_bpf=any(u.kind in ("pin-dir", "pin", "balancer") for u in state.undo))
    except LabError as exc:
        raise LabError(f"cannot take lab '{lab}' down from here: {exc}") from exc
    removed: list[tuple[str, str]] = []
    failed: list[tuple[Undo, LabError]] = []
    last = [u for u in state.undo if u.kind == "state-dir"]
    for undo in reversed([u for u in state.undo if u.kind != "state-dir"]):
        try:
            what = undo_one(undo)
        except LabError as exc:
            failed.append((undo, exc))
            continue
        if what:
            removed.append((undo.kind, what))
    if failed:
        state.undo = last + [u for u, _ in reversed(failed)]
        state.save()
        raise LabError(f"lab '{lab}' is partly down ({len(removed)} removed); left: "
                       + "; ".join(str(e) for _, e in failed) + f"; run `l4lab down --name {lab}` again")
    for undo in last:
        what = undo_one(undo)
        if what:
            removed.append((undo.kind, what))
    return removed


HOST_REMEDY = "run l4lab in the host's mount namespace (not under `ip netns exec` or `unshare -m`)"


def require_host(*, with_bpf: bool) -> None:
    """Refuse, before anything changes, a process that cannot build or remove a lab: one without
    CAP_SYS_ADMIN and CAP_NET_ADMIN (namespaces, links), or (with_bpf) one that cannot see bpffs,
    where every pin would look gone."""
    have = preflight.effective_caps()
    missing = [preflight.CAP_NAMES[c] for c in (preflight.CAP_SYS_ADMIN, preflight.CAP_NET_ADMIN)
               if not have >> c & 1]
    if missing:
        raise LabError(f"this process lacks {', '.join(missing)}: run l4lab as root (sudo)")
    if with_bpf:
        try:
            preflight.require_bpffs(str(BPF_DIR.parent), HOST_REMEDY)
        except LbError as exc:
            raise LabError(str(exc)) from exc


def undo_one(undo: Undo) -> str | None:
    """Remove one journaled resource and say what it was; None when it was already gone.

    Only "already gone" is tolerated; any other error is raised as a LabError.
    """
    handlers: dict[str, Callable[[Undo], str | None]] = {
        "state-dir": _undo_state_dir,
        "netns": _undo_netns,
        "veth": _undo_veth,
        "pin-dir": _undo_pin_dir,
        "pin": _undo_pin,
        "process": _undo_process,
        "balancer": _undo_balancer,
    }
    try:
        return handlers[undo.kind](undo)
    except NetlinkError as exc:
        if exc.code not in GONE:
            raise LabError(f"cannot remove {undo.kind} {undo.target}: {os.strerror(exc.code)}") from exc
    except OSError as exc:
        if exc.errno not in GONE:
            raise LabError(f"cannot remove {undo.kind} {undo.target}: {exc.strerror or exc}") from exc
    except LbError as exc:
        raise LabError(f"cannot remove {undo.kind} {undo.target}: {exc}") from exc
    return None


def _undo_state_dir(undo: Undo) -> str:
    shutil.rmtree(undo.target)
    return f"state directory {undo.target}"


def _undo_balancer(undo: Undo) -> str | None:
    """Remove a balancer instance the lab loaded: its pins (which detaches links no process holds),
    its state file, its lock and a daemon's control socket, whichever of them a daemon or a failed
    lbctl left."""
    from balancer import control, controller, preflight  # numpy, libbpf: only when a balancer instance is removed
    from balancer.datapath import Datapath  # numpy, libbpf: only when a balancer instance is removed

    name = undo.target
    pins = Path(controller.Instance.pin_dir(name))
    files = [controller.Instance.state_path(name), preflight.lock_path(controller.STATE_ROOT, name),
             control.socket_path(controller.STATE_ROOT, name)]
    if not pins.exists() and not any(f.exists() for f in files):
        return None
    holder = _lock_holder(files[1])
    Datapath.unpin(str(pins))
    for f in files:
        f.unlink(missing_ok=True)
    what = f"balancer instance {name} (pins {pins})"
    if holder:
        what += f"; {holder} still holds its program attached until it exits"
    return what


def _lock_holder(path: Path) -> str:
    """Who holds an instance's lock (a running `lbctl run`), or '' when nobody does."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return ""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return ""
    except BlockingIOError:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "a process"
    finally:
        os.close(fd)


def _undo_netns(undo: Undo) -> str | None:
    path = bytes(netns_path(undo.target))
    if _libc.umount2(path, _MNT_DETACH) != 0:
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOENT):  # EINVAL: the file is no longer a mount point
            raise OSError(err, f"umount {path.decode()}: {os.strerror(err)}")
    os.unlink(path)
    return f"netns {undo.target}"


def _undo_veth(undo: Undo) -> str | None:
    assert undo.netns is not None
    with entered(undo.netns), IPRoute() as ipr:
        found = ipr.link_lookup(ifname=undo.target)
        if found:
            ipr.link("del", index=found[0])
            return f"veth {undo.target} in {undo.netns}"
    return None


def _undo_pin_dir(undo: Undo) -> str:
    """The lab's own pin directory, with whatever was pinned into it since (it is the lab's)."""
    path = Path(undo.target)
    stray = sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True)
    for p in stray:
        if p.is_dir():
            p.rmdir()
        else:
            p.unlink()
    path.rmdir()
    if path.parent == BPF_DIR:
        with contextlib.suppress(OSError):  # the labs' root goes with the last lab: bpffs keeps nothing of ours
            BPF_DIR.rmdir()
    return f"pin directory {undo.target}" + (f" (and {len(stray)} entries pinned there since)" if stray else "")


def _undo_pin(undo: Undo) -> str:
    os.unlink(undo.target)
    return f"pin {undo.target}"


def _undo_process(undo: Undo) -> str | None:
    assert undo.starttime is not None
    if services.starttime(int(undo.target)) != undo.starttime:  # gone, or its pid reused
        return None
    services.stop(Process(node="?", pid=int(undo.target), starttime=undo.starttime, argv=[], log=""))
    return f"process {undo.target}"


# ---- small helpers that act inside a namespace


def _index(ipr: IPRoute, ifname: str, ns: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise OSError(errno.ENODEV, f"no interface {ifname} in {ns}")
    return int(found[0])
