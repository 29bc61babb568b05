"""The Vagrant lab: the plan matches each shipped topology, the provisioning scripts run, the Vagrantfile validates.

The scripts run for real inside fresh namespaces `vgt-<hex>-*` standing in for machines (removed
afterwards); `vagrant validate` runs when vagrant is installed (`apt-get install vagrant`).
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from balancer import config as cfg
from lab import cli, topology
from lab.harness import unique_name
from lab.nsexec import NETNS_DIR
from lab.remote import vagrant
from lab.topology import Topology

REPO = Path(__file__).resolve().parents[2]
PROVISION = REPO / "lab" / "remote" / "provision"
SCRIPTS = sorted(PROVISION.glob("*.sh"))
PREFIX = "vgt-"
TOPOLOGIES = topology.shipped()

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="namespaces need root")


def _plan(name: str) -> tuple[Topology, dict[str, Any]]:
    topo = topology.load(name)
    return topo, vagrant.plan(topo)


def _entry(plan: dict[str, Any], node: str) -> dict[str, Any]:
    entries: list[dict[str, Any]] = [n for n in plan["nodes"] if n["name"] == node]
    assert len(entries) == 1, f"plan has {len(entries)} entries for node {node}"
    return entries[0]


# ---- the plan against the topology


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_plan_has_every_node_with_its_role(name: str) -> None:
    topo, plan = _plan(name)
    assert plan["topology"] == name
    assert [(n["name"], n["role"]) for n in plan["nodes"]] == [(n.name, n.role) for n in topo.nodes]
    for entry in plan["nodes"]:
        assert entry["box"] == vagrant.BOX
        assert entry["cpus"] >= 1 and entry["memory"] >= 256


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_plan_networks_are_the_links_with_their_addresses(name: str) -> None:
    topo, plan = _plan(name)
    macs: list[str] = []
    for index, link in enumerate(topo.links):
        for ep in link.endpoints:
            nets = [n for n in _entry(plan, ep.node)["networks"] if n["ifname"] == ep.ifname]
            assert len(nets) == 1
            net = nets[0]
            assert net["network"] == vagrant.network_name(topo, index)
            assert net["mtu"] == link.mtu
            assert net["addresses"] == [str(a) for a in ep.all_addresses]
            primary = ipaddress.ip_interface(f"{net['ip']}/{net['netmask']}")
            assert primary in ep.all_addresses
            macs.append(net["mac"])
    assert sum(len(n["networks"]) for n in plan["nodes"]) == 2 * len(topo.links)
    assert len(set(macs)) == len(macs), "two NICs share a MAC"
    assert all(int(m.split(":")[0], 16) & 0b11 == 0b10 for m in macs), "MACs must be local unicast"


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_plan_routes_cover_the_topology_routes(name: str) -> None:
    topo, plan = _plan(name)
    lab_nets = {a.network for link in topo.links for ep in link.endpoints for a in ep.all_addresses}
    lab_nets |= {ipaddress.ip_network(v.address) for v in topo.vips}
    for node in topo.nodes:
        got = {(ipaddress.ip_network(r["dst"]), ipaddress.ip_address(r["via"]))
               for r in _entry(plan, node.name)["routes"]}
        assert len(got) == len(_entry(plan, node.name)["routes"]), "duplicate routes"
        connected = {a.network for ep in topo.endpoints_of(node.name) for a in ep.all_addresses}
        local = {ipaddress.ip_network(v.address) for v in topo.vips} if node.role == "real" else set()
        for route in node.routes:
            if route.dst is not None:
                assert (route.dst, route.via) in got
                continue
            # A default route becomes a route to every lab network the node is not on.
            for net in lab_nets - connected - local:
                if net.version == route.family:
                    assert (net, route.via) in got, f"{node.name}: no route to {net} via {route.via}"
        assert all(dst.version == via.version for dst, via in got)
        assert not any(dst in connected for dst, _ in got), f"{node.name}: a route to a connected subnet"


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_plan_reals_hold_every_vip_with_kernel_decap(name: str) -> None:
    topo, plan = _plan(name)
    want = [{"address": str(v.address),
             "services": [{"proto": p.proto, "port": p.port, "service": p.service} for p in v.ports]}
            for v in topo.vips]
    for node in topo.nodes:
        entry = _entry(plan, node.name)
        scripts = [Path(s["script"]).name for s in entry["provision"]]
        assert scripts == ["common.sh", f"{node.role}.sh"]
        if node.role == "real":
            assert entry["vips"] == want
            assert entry["decap"] == {"mode": "kernel", "ipip": "tunl0", "ip6": "ip6tnl0",
                                      "gue_ports": [6080]}
            args = entry["provision"][1]["args"]
            assert [args[i + 1] for i, a in enumerate(args) if a == "--vip"] == [v["address"] for v in want]
        else:
            assert entry["vips"] == [] and entry["decap"] is None
        assert not any("*" in key for key in entry["sysctls"])
        ifnames = ("all", "default", "lo", *[ep.ifname for ep in topo.endpoints_of(node.name)])
        for key, value in node.sysctls:
            for concrete in [key.replace(".*.", f".{i}.") for i in ifnames] if ".*." in key else [key]:
                assert entry["sysctls"][concrete] == value, f"{node.name}: {concrete}"


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_plan_lb_config_balances_the_vips_over_the_reals(name: str) -> None:
    topo, plan = _plan(name)
    for node in topo.nodes_with_role("lb"):
        entry = _entry(plan, node.name)
        conf = cfg.loads(entry["lb_config"], file=f"{name}/{node.name}")
        lb_net = entry["networks"][0]
        peer_node, peer_if = lb_net["peer"].split(":")
        peer_addr = next(n["addresses"][0] for n in _entry(plan, peer_node)["networks"] if n["ifname"] == peer_if)
        assert conf.datapath.interfaces == (lb_net["ifname"],)
        assert (conf.encap.nexthop_mac, str(conf.encap.nexthop)) == ("auto", peer_addr.split("/")[0])
        reals = {str(a.ip) for r in topo.nodes_with_role("real")
                 for ep in topo.endpoints_of(r.name) for a in ep.addresses[:2]}
        served = {(str(v.address), p.port, p.proto) for v in topo.vips for p in v.ports}
        assert {(str(v.address), v.port, v.proto) for v in conf.vips} == served
        for vip in conf.vips:
            assert vip.reals and {str(r.address) for r in vip.reals} <= reals


@pytest.mark.parametrize("name", TOPOLOGIES)
def test_plan_links_are_udp_tunnels_whose_ends_meet(name: str) -> None:
    topo = topology.load(name)
    plan = vagrant.plan(topo, driver="qemu")
    ends = {(e["name"], n["ifname"]): n["tunnel"] for e in plan["nodes"] for n in e["networks"]}
    ports = [t["local_port"] for t in ends.values()]
    assert len(set(ports)) == len(ports), "two NICs listen on one UDP port"
    for link in topo.links:
        a, b = ends[(link.a.node, link.a.ifname)], ends[(link.b.node, link.b.ifname)]
        assert (a["peer_port"], b["peer_port"]) == (b["local_port"], a["local_port"])
    assert all(vagrant.TUNNEL_PORT_BASE <= p < 65536 for p in ports)


def test_plan_local_box_is_isolated_and_named_for_the_lab() -> None:
    topo = topology.load("default")
    public, local = vagrant.plan(topo, driver="qemu"), vagrant.plan(topo, "local", driver="qemu", lab="x1")
    assert {n["box"] for n in public["nodes"]} == {vagrant.BOX}
    assert {n["box"] for n in local["nodes"]} == {vagrant.LOCAL_BOX}
    assert public["libvirt"]["management_network"]["mode"] == "nat"
    assert local["libvirt"]["management_network"]["mode"] == "none"
    assert local["libvirt"]["prefix"] == "l4lab-vg-x1-" and public["libvirt"]["prefix"] == "l4lab-vg-default-"
    assert local["libvirt"]["driver"] == "qemu"
    assert all(256 <= n["memory"] <= 384 for n in local["nodes"])


def test_plan_light_init_is_the_local_boxs_kernel_command_line() -> None:
    from lab.errors import UsageError
    from lab.remote import vagrantbox

    topo = topology.load("default")
    assert "cmd_line" not in vagrant.plan(topo, "local", driver="qemu")["libvirt"]  # the box's own: systemd
    light = vagrant.plan(topo, "local", driver="qemu", init="light")["libvirt"]["cmd_line"]
    assert light == f"{vagrantbox.CMDLINE} init={vagrantbox.LIGHT_INIT}"
    assert vagrant.plan(topo, "local", driver="qemu", init="light")["libvirt"]["ssh_insert_key"] is False
    assert f"cat >{vagrantbox.LIGHT_INIT} <<" in (PROVISION / "box.sh").read_text(), "box.sh does not write it"
    with pytest.raises(UsageError, match="the box init 'light' is the local box's"):
        vagrant.plan(topo, "public", driver="qemu", init="light")
    with pytest.raises(UsageError, match="unknown box init 'openrc'"):
        vagrant.plan(topo, "local", driver="qemu", init="openrc")


def test_cli_prints_the_plan_and_the_lb_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["vagrant-plan", "default"]) == 0
    assert json.loads(capsys.readouterr().out) == vagrant.plan(topology.load("default"))
    assert cli.main(["vagrant-plan", "default", "--lb-config", "lb"]) == 0
    assert capsys.readouterr().out == vagrant.lb_config(topology.load("default"), "lb")
    assert cli.main(["vagrant-plan", "default", "--lb-config", "client"]) == 2
    assert "node 'client' of topology 'default' is no LB" in capsys.readouterr().err


# ---- the scripts


@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_script_parses(script: Path) -> None:
    done = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is missing: apt-get install shellcheck")
@pytest.mark.parametrize("script", SCRIPTS, ids=[s.name for s in SCRIPTS])
def test_script_passes_shellcheck(script: Path) -> None:
    done = subprocess.run(["shellcheck", str(script)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout


def test_every_script_the_plan_names_exists() -> None:
    for name in TOPOLOGIES:
        for entry in vagrant.plan(topology.load(name))["nodes"]:
            for step in entry["provision"]:
                assert (REPO / step["script"]).is_file(), step["script"]


# ---- the scripts run in namespaces standing in for machines


def _ip(*args: str) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"'ip {' '.join(args)}' failed: {done.stderr.strip()}")
    return done.stdout


def _in(ns: str, argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nsenter", f"--net={NETNS_DIR / ns}", "--", *argv], capture_output=True,
                          text=True, check=False, timeout=60, env=env)


def _sysctl(ns: str, key: str) -> str:
    return _in(ns, ["sysctl", "-n", key]).stdout.strip()


@pytest.fixture
def machine() -> Iterator[tuple[str, str]]:
    """A fresh namespace `vgt-<hex>-vm` whose only NIC is `eth1` (its peer in `vgt-<hex>-sw`); removed after.

    Name: machine
    Scope: function
    Depends: -

        def test_x(machine):
            vm, mac = machine
    """
    lab = unique_name("lbt")
    vm, sw = f"{lab}-vm", f"{lab}-sw"
    made: list[str] = []
    try:
        for ns in (vm, sw):
            _ip("netns", "add", ns)
            made.append(ns)
        _ip("link", "add", "eth1", "netns", vm, "type", "veth", "peer", "name", "sw0", "netns", sw)
        _ip("-n", sw, "link", "set", "sw0", "up")
        mac = json.loads(_ip("-j", "-n", vm, "link", "show", "eth1"))[0]["address"]
        yield vm, mac
    finally:
        for ns in made:
            if (NETNS_DIR / ns).exists():
                _ip("netns", "del", ns)


def _with_mac(args: list[str], plan_mac: str, mac: str) -> list[str]:
    return [mac if a == plan_mac else a for a in args]


@needs_root
def test_common_sh_renames_the_nic_and_configures_the_plan(machine: tuple[str, str]) -> None:
    vm, mac = machine
    entry = _entry(vagrant.plan(topology.load("default")), "real1")
    net = entry["networks"][0]
    args = _with_mac(entry["provision"][0]["args"], net["mac"], mac)
    for attempt in (1, 2):  # idempotent: the second run succeeds and changes nothing
        done = _in(vm, ["bash", str(PROVISION / "common.sh"), *args])
        assert done.returncode == 0, f"run {attempt}: {done.stderr}"
    link = json.loads(_ip("-j", "-n", vm, "addr", "show", "dev", net["ifname"]))[0]
    assert link["address"] == mac and link["mtu"] == net["mtu"]
    got = {f"{a['local']}/{a['prefixlen']}" for a in link["addr_info"] if a.get("scope") == "global"}
    assert got == set(net["addresses"])
    routes = _ip("-n", vm, "route", "show") + _ip("-n", vm, "-6", "route", "show")
    for route in entry["routes"]:
        assert f"{route['dst']} via {route['via']}" in routes
    assert _sysctl(vm, f"net.ipv4.conf.{net['ifname']}.rp_filter") == "0"
    assert _sysctl(vm, "net.ipv4.conf.all.arp_ignore") == "1"


@needs_root
def test_common_sh_names_a_missing_nic(machine: tuple[str, str]) -> None:
    vm, _ = machine
    done = _in(vm, ["bash", str(PROVISION / "common.sh"), "--name", "x", "--iface", "02:4c:00:00:00:99",
                    "lb-rt", "1500"])
    assert done.returncode == 1
    assert "no NIC has MAC 02:4c:00:00:00:99 (wanted as lb-rt)" in done.stderr


@needs_root
def test_router_sh_forwards_without_rp_filter(machine: tuple[str, str]) -> None:
    vm, _ = machine
    for _attempt in (1, 2):
        done = _in(vm, ["bash", str(PROVISION / "router.sh"), "--iface-all", "eth1"])
        assert done.returncode == 0, done.stderr
    assert _sysctl(vm, "net.ipv4.ip_forward") == "1"
    assert _sysctl(vm, "net.ipv6.conf.all.forwarding") == "1"
    for c in ("all", "default", "lo", "eth1"):
        assert _sysctl(vm, f"net.ipv4.conf.{c}.rp_filter") == "0"


@needs_root
def test_real_sh_sets_vips_and_arp_rules_then_names_the_missing_module(
    machine: tuple[str, str], tmp_path: Path
) -> None:
    vm, _ = machine
    entry = _entry(vagrant.plan(topology.load("default")), "real1")
    args = [str(REPO) if a == vagrant.SYNCED_FOLDER else a for a in entry["provision"][1]["args"]]
    env = {**os.environ, "L4LAB_RUN_DIR": str(tmp_path)}
    results = [_in(vm, ["bash", str(PROVISION / "real.sh"), *args], env=env) for _ in (1, 2)]
    if _in(vm, ["ip", "link", "show", "tunl0"]).returncode == 0:
        # A kernel with ipip/fou (not this machine's): the script must go all the way.
        pid = (tmp_path / "services.pid").read_text().strip() if (tmp_path / "services.pid").exists() else ""
        if pid:
            subprocess.run(["kill", pid], check=False)
        assert [r.returncode for r in results] == [0, 0], results[-1].stderr
    else:
        for done in results:  # the same outcome twice: the steps before decap are idempotent
            assert done.returncode == 3, done.stderr
            assert "real.sh: kernel module 'ipip' is missing: tunl0 does not exist" in done.stderr
    lo = _ip("-n", vm, "addr", "show", "dev", "lo")
    for vip in entry["vips"]:
        plen = 32 if ":" not in vip["address"] else 128
        assert f"{vip['address']}/{plen}" in lo
    for c in ("all", "default", "lo"):
        assert _sysctl(vm, f"net.ipv4.conf.{c}.arp_ignore") == "1"
        assert _sysctl(vm, f"net.ipv4.conf.{c}.arp_announce") == "2"
        assert _sysctl(vm, f"net.ipv4.conf.{c}.rp_filter") == "0"


# ---- vagrant itself


@pytest.mark.skipif(shutil.which("vagrant") is None,
                    reason="vagrant is missing: apt-get install vagrant (Debian 12 has 2.3.4)")
@pytest.mark.parametrize("name", TOPOLOGIES)
def test_vagrant_validate(name: str, tmp_path: Path) -> None:
    env = {**os.environ, "L4LAB_TOPOLOGY": name, "VAGRANT_DOTFILE_PATH": str(tmp_path / "dot"),
           "VAGRANT_HOME": os.environ.get("VAGRANT_HOME", str(Path.home() / ".vagrant.d")),
           "L4LAB": str(Path(sys.executable).with_name("l4lab"))}
    done = subprocess.run(["vagrant", "validate", "--ignore-provider"], cwd=REPO, env=env,
                          capture_output=True, text=True, check=False, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Vagrantfile validated successfully" in done.stdout
    assert not (REPO / ".vagrant").exists(), "vagrant wrote .vagrant/ into the source tree"


# ---- the local box and libvirt's driver


@pytest.mark.skipif(shutil.which("dpkg") is None or subprocess.run(["dpkg", "-s", "vagrant"], capture_output=True,
                                                                     check=False).returncode != 0,
                    reason="vagrant is missing: apt-get install vagrant (its insecure key is part of the box)")
def test_box_key_covers_every_input(monkeypatch: pytest.MonkeyPatch) -> None:
    from lab.remote import vagrantbox

    key = vagrantbox.cache_key()
    assert key == vagrantbox.cache_key(), "the key of the same inputs changed"
    assert vagrantbox.cache_key("http://mirror.example/debian") != key
    monkeypatch.setattr(vagrantbox, "PACKAGES", (*vagrantbox.PACKAGES, "less"))
    assert vagrantbox.cache_key() != key
    text = vagrantbox.box_vagrantfile(key)
    assert f'lv.kernel = "/var/lib/libvirt/boot/l4lab-vg-{key}/vmlinuz"' in text
    assert "root=/dev/vda" in text


def test_libvirt_driver_is_forced_or_probed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from lab.remote import libvirtd

    monkeypatch.setenv("L4LAB_LIBVIRT_DRIVER", "qemu")
    assert libvirtd.driver() == "qemu"
    monkeypatch.delenv("L4LAB_LIBVIRT_DRIVER")
    monkeypatch.setattr(libvirtd, "RUN_DIR", tmp_path)
    (tmp_path / "kvm").write_text("a KVM guest printed nothing\n")  # the cached answer of this boot
    assert libvirtd.driver() == "qemu"
    (tmp_path / "kvm").write_text("\n")
    assert libvirtd.driver() == "kvm"


# ---- the lab booted for real: libvirt (qemu, TCG where KVM runs no guest) and the local box

SMOKE_MACHINES = ("router", "lb", "real1")  # the router is the client: one LB, one real, one DSR request
LIBVIRT_PACKAGES = {"vagrant": "vagrant", "libvirtd": "libvirt-daemon-system", "virsh": "libvirt-clients",
                    "qemu-img": "qemu-utils", "mmdebstrap": "mmdebstrap", "dnsmasq": "dnsmasq-base",
                    "qemu-system-x86_64": "qemu-system-x86"}


def _vagrant_libvirt_missing() -> str | None:
    """Why the Vagrant lab cannot boot here (None when it can)."""
    if os.geteuid() != 0:
        return "the Vagrant lab needs root (libvirt's system daemon, mmdebstrap)"
    missing = sorted({pkg for tool, pkg in LIBVIRT_PACKAGES.items() if shutil.which(tool) is None})
    if not list(Path("/usr/share").glob("rubygems-integration/all/gems/vagrant-libvirt-*")) and \
            not list((Path.home() / ".vagrant.d" / "gems").glob("*/gems/vagrant-libvirt-*")):
        missing.append("vagrant-libvirt")
    if missing:
        return f"missing {', '.join(missing)}: scripts/setup.sh --extra vagrant"
    return None


@pytest.fixture
def smoke_lab() -> Iterator[Any]:
    """Name: smoke_lab. Scope: function. Depends: root, vagrant-libvirt, libvirt, mmdebstrap (skips otherwise).

    router, lb and real1 of the default topology booted from the local box as lab `smoke-<hex>`
    (libvirt domains l4lab-vg-smoke-<hex>-*), as a lab.remote.target.Target; destroyed after, and the
    test fails if anything of it is left::

        def test_x(smoke_lab):
            smoke_lab.run("router", ["curl", "http://198.51.100.100/"])
    """
    from lab.remote import libvirtd, target, vagrantbox, vagrantlab

    if os.environ.get("L4LAB_VAGRANT_SMOKE") != "1":
        pytest.skip("the Vagrant smoke runs on its own after the suites (its three TCG machines take about 4 minutes "
                    "from nothing): make test runs it so, make test-vagrant-smoke alone (L4LAB_VAGRANT_SMOKE=1)")
    why = _vagrant_libvirt_missing()
    if why:  # asked for by name (make test, make test-vagrant-smoke): a smoke that cannot boot fails
        pytest.fail(f"L4LAB_VAGRANT_SMOKE=1 asks for the Vagrant smoke, but it cannot boot here: {why}")
    lab = unique_name("smoke")
    environ = vagrantlab.env("default", lab, init="light")  # the box's light init: half systemd's boot under TCG
    log = vagrantlab.state_dir(lab) / "vagrant.log"
    t = vagrantlab.Timings()  # each phase's seconds on stderr (make test shows them: -s)
    start = now = time.monotonic()
    started = libvirtd.start()
    try:
        vagrantbox.ensure()
        now = t.mark("smoke: libvirtd and box", now)
        try:
            vagrantlab.vagrant(["up", "--no-tty", *SMOKE_MACHINES], environ, log, timeout=2400)
            now = t.mark("smoke: vagrant up of " + " ".join(SMOKE_MACHINES), now)
            path = target.for_vagrant("default", vagrantlab.state_dir(lab) / "target", env=environ,
                                      machines=SMOKE_MACHINES)
            with target.shared_connections(target.load(path)) as hosts:  # one ssh connection per machine
                yield hosts
            now = t.mark("smoke: the DSR request", now)
        finally:
            vagrantlab.vagrant(["destroy", "-f"], environ, log, timeout=900)
            now = t.mark("smoke: vagrant destroy", now)
        left = vagrantlab.leftovers(lab)
        assert not left, f"`vagrant destroy -f` left {', '.join(left)} (see {log})"
    finally:
        if started.ours:
            libvirtd.stop()
        t.mark("smoke: total", start)


def _tunl0_rx(tgt: Any, node: str) -> int:
    link = json.loads(tgt.run(node, ["ip", "-j", "-s", "link", "show", "dev", "tunl0"]).stdout)[0]
    return int(link["stats64"]["rx"]["packets"])


@pytest.mark.timeout(3600)
def test_vagrant_smoke_one_dsr_request_through_the_local_box(smoke_lab: Any, tmp_path: Path) -> None:
    from dataclasses import replace

    from lab.lbconf import lb_link, real_addresses
    from lab.observe.capture import classify_lb_link
    from lab.remote.target import RemoteCapture

    tgt = smoke_lab
    topo = tgt.topology
    vip = next(v for v in topo.vips if v.address.version == 4)
    port = next(p.port for p in vip.ports if p.service == "http")
    real1 = ipaddress.ip_address(real_addresses(topo, 4)["real1"])
    # Only real1 is up: the VIP's ring holds it alone.
    conf = cfg.loads(vagrant.lb_config(topo, "lb"), file="vagrant lb config")
    conf = replace(conf, vips=tuple(replace(v, reals=tuple(r for r in v.reals if r.address == real1))
                                    for v in conf.vips if v.address.version == 4))
    tgt.write("lb", "/tmp/l4lab-smoke.toml", cfg.dump(conf))
    tgt.run("lb", tgt.python_argv("lb", "balancer.cli", "apply", "/tmp/l4lab-smoke.toml"), timeout=300)

    def encapsulated() -> int:
        stats = json.loads(tgt.run("lb", tgt.python_argv("lb", "balancer.cli", "stats", "--json"), timeout=300).stdout)
        return int(stats["reasons"]["TX_ENCAP"]["packets"])

    # The router is the client (it is the LB's next hop): it sends from its address on the LB's link,
    # the LB sends the request back to it encapsulated, and real1's reply comes to it over real1's link.
    lb_if, router, router_if = lb_link(topo, "lb")
    client = {str(a.ip) for ep in topo.endpoints_of(router) if ep.ifname == router_if for a in ep.addresses
              if a.version == 4}
    encap0, decap0 = encapsulated(), _tunl0_rx(tgt, "real1")
    pcap = tmp_path / "router-lb.pcap"
    with RemoteCapture(tgt, router, router_if, pcap):
        done = tgt.run(router, ["curl", "-sS", "--max-time", "60", f"http://{vip.address}:{port}/"], timeout=120)
    assert done.stdout.strip() == "real1", f"the VIP answered {done.stdout!r}, not real1's HTTP service"
    assert encapsulated() > encap0, "the LB's XDP program encapsulated nothing"
    assert _tunl0_rx(tgt, "real1") > decap0, "real1's kernel (tunl0) decapsulated nothing"
    # DSR: the LB's link carried the request both ways (plain to the LB, encapsulated back) and no reply.
    counts = classify_lb_link(pcap, vagrant.mac_for(topo.name, "lb", lb_if), {str(vip.address)}, client,
                              vagrant.GUE_PORT)
    assert not counts.stray, f"the LB's link carried other traffic (replies?): {counts.stray[:5]}"
    assert counts.to_lb > 0 and counts.from_lb == counts.to_lb, counts
    xdp = tgt.run("lb", ["ip", "-d", "link", "show", "dev", lb_if]).stdout
    assert " xdp " in xdp, f"no native XDP program on the LB's virtio NIC:\n{xdp}"
    # real.sh once took the IPv4 GUE port for the IPv6 one (`ip fou show` lists both): ip6-gue1 died there
    fou = json.loads(tgt.run("real1", ["ip", "-j", "fou", "show"]).stdout)
    families = {f["family"] for f in fou if f["port"] == vagrant.GUE_PORT}
    assert families == {"inet", "inet6"}, f"real1 decapsulates GUE on port {vagrant.GUE_PORT} for {families}: {fou}"
