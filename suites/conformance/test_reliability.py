"""Reliability under live traffic: the controller dies, restarts, upgrades, crashes mid-apply; the LRU evicts.

Topology `default`, IPv4 in IPIP. Every scenario runs CONNS long-lived TCP connections to a line
echo on the reals (a request on each every INTERVAL_S) and opens a new connection every
NEW_EVERY_S (lab/nodes/churn_client.py), and counts, per connection, failed requests
(reset or timeout) and moves (answered by another real than the first). Unless the scenario moves
flows on purpose, both must be 0 and every new connection must be answered. Every process of the
flows is pinned to CPU 0 (see test_churn.py: veth runs XDP on the sender's CPU, sessions are per CPU).

    daemon    `lbctl run` is SIGKILLed and started again while traffic flows: the pinned datapath
              forwards throughout, and the new daemon adopts it and writes nothing (its start-up
              apply logs writes = 0, and the VIP, real and ring maps are byte-identical).
    upgrade   `lbctl upgrade` swaps in another copy of the object behind the XDP link (the
              interface's program id changes) on the same maps.
    crash     `lbctl apply` is SIGKILLed (controller.CRASH_AFTER_SLOTS_ENV) after writing part of a
              VIP's new ring; the next apply, of the old config or the new one, must converge to
              exactly that config's ring, and the VIP whose config did not change keeps its ring
              byte for byte.
    eviction  see test_ring_change_after_lru_eviction.

These are l4lab's white-box forms (the daemon's log, the maps byte for byte, crash injection). The
black-box forms for every DUT are test_dut_control.py (a control-plane restart breaks nothing) and
test_dut_multilb.py (an LB node that dies loses no connection once the router knows).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from balancer import config as cfg
from balancer.controller import CRASH_AFTER_SLOTS_ENV, Instance
from balancer.encaps import IP4_IPIP
from lab.dut import Capability
from lab.harness import REPO, Lab, LabBalancer, poll
from lab.lbconf import lb_link, real_addresses
from lab.nodes.churn_client import ChurnClient
from lab.nodes.tcp_services import Services
from suites.conformance._counters import changed, counters
from suites.conformance._daemon import Daemon, start_daemon
from suites.conformance._owners import owner_changed, ring_owners

pytestmark = [pytest.mark.topology("default")]
ENCAP = IP4_IPIP
PORT_A, PORT_B = 7021, 7022  # two echo VIPs on the same address: A never changes, B may
CONNS = 200
INTERVAL_S = 0.5
TIMEOUT_S = 3.0
NEW_EVERY_S = 0.1
OBSERVE_S = 1.5
ADDED = "real3"
CRASH_AFTER = 700  # ring slots an apply writes before it is killed (adding a third real writes ~21800)


# ---- the world


@pytest.fixture(scope="module")
def echo(lab: Lab) -> Iterator[Services]:
    """Name: echo. Scope: module. Depends: lab. The line echo on every real, on both ports of the IPv4 VIP."""
    with Services(lab, sorted(real_addresses(lab.topology, 4)), "echo",
                  [f"{_vip(lab)}:{PORT_A}", f"{_vip(lab)}:{PORT_B}"], cpu=0) as services:
        yield services


@pytest.fixture
def lb(lab: Lab, echo: Services, tmp_path: Path) -> Iterator[LabBalancer]:
    """Name: lb. Scope: function. Depends: lab, echo.

    A LabBalancer handle for the lab's LB node, not loaded yet (the scenario loads it, by lbctl or by
    the daemon); unloaded afterwards, with no echo connection left on any real::

        def test_x(lb):
            lb.apply(_config(lb, {PORT_A: None}))
    """
    _kill_echo_connections(lab)
    b = LabBalancer(lab, "lb", ENCAP, tmp_path / "lb.toml")
    try:
        yield b
    finally:
        b.lbctl("unload", check=False)
        _kill_echo_connections(lab)


def _kill_echo_connections(lab: Lab) -> None:
    for node in sorted(real_addresses(lab.topology, 4)):
        for port in (PORT_A, PORT_B):
            lab.run(node, ["ss", "-K", "-tn", "state", "connected", "sport", "=", f":{port}"])


def _vip(lab: Lab) -> str:
    return next(str(v.address) for v in lab.topology.vips if v.address.version == 4)


def _config(b: LabBalancer, ports: dict[int, str | None], **datapath: Any) -> cfg.Config:
    """TCP VIPs on the echo ports, each with every real but the one named (None: all of them)."""
    conf = b.config_for()
    first = conf.vips[0]
    addrs = real_addresses(b.lab.topology, 4)
    vips = tuple(replace(first, port=port, proto="tcp",
                         reals=tuple(r for r in first.reals if without is None or str(r.address) != addrs[without]))
                 for port, without in ports.items())
    return replace(conf, vips=vips, datapath=replace(conf.datapath, **datapath))


def _load(b: LabBalancer, conf: cfg.Config) -> None:
    b.config_path.write_text(cfg.dump(conf))
    b.lbctl("load", "--interface", b.lab.ifname("lb", lb_link(b.lab.topology, "lb")[0]), "--mode", "native",
            "--config", str(b.config_path))


def _client(lab: Lab, port: int, conns: int = CONNS, new_every: float = NEW_EVERY_S) -> ChurnClient:
    return ChurnClient(lab, "client", _vip(lab), port, "--conns", str(conns), "--interval", str(INTERVAL_S),
                       "--timeout", str(TIMEOUT_S), "--new-every", str(new_every), "--cpu", "0")


def _maps(instance: str) -> dict[str, bytes]:
    """The bytes of every VIP's ring, of the VIP and real tables and of the VIP index: what a controller writes."""
    inst = Instance.open(instance)
    try:
        out = {f"ring {name}": inst.dp.ring_array(num).tobytes() for name, num in inst.state.vip_nums.items()}
        for m in ("lb_vips", "lb_reals"):
            out[m] = b"".join(k + v for k, v in sorted(inst.dp.maps[m].items()))
        out["lb_vip_index"] = inst.dp.vip_index().tobytes()
        return out
    finally:
        inst.close()


def _ring(instance: str, port: int) -> bytes:
    return next(v for k, v in _maps(instance).items() if k.startswith("ring ") and k.endswith(f":{port}/tcp"))


def _verdict(scenario: str, report: dict[str, Any], *, moved_ok: bool = False, least: int = CONNS) -> dict[str, int]:
    """Print and assert the scenario's figures: connections, requests, failed, moved, new flows."""
    conns = report["conns"]
    failed = [c for c in conns if c["status"] not in ("ok", "moved")]
    moved = [c for c in conns if c["status"] == "moved" or len(c["nodes"]) > 1]
    new_failed = [f for f in report["new"] if "error" in f]
    figures = {"connections": len(conns), "requests": sum(c["answers"] for c in conns) + len(report["new"]),
               "failed": len(failed) + len(new_failed), "moved": len(moved), "new": len(report["new"])}
    sys.stdout.write(f"\n{scenario}: {figures['connections']} connections, {figures['requests']} requests "
                     f"({figures['new']} on new connections), {figures['failed']} failed, "
                     f"{figures['moved']} moved to another real\n")
    assert len(conns) >= least, f"{scenario}: only {len(conns)} connections"
    if not moved_ok:
        assert not failed and not new_failed, (f"{scenario}: {len(failed)} connections and {len(new_failed)} new "
                                               f"connections failed: {failed[:3]} {new_failed[:3]}")
        assert not moved, f"{scenario}: {len(moved)} connections moved to another real: {moved[:3]}"
    return figures


# ---- the daemon (suites/conformance/_daemon.py)


@pytest.mark.needs(Capability.HITLESS_RESTART)
def test_daemon_killed_and_restarted_keeps_forwarding_and_rewrites_nothing(
        lab: Lab, lb: LabBalancer, tmp_path: Path) -> None:
    conf = _config(lb, {PORT_A: None})
    lb.config_path.write_text(cfg.dump(conf))
    log = tmp_path / "lbctl-run.log"
    log.touch()
    with contextlib.ExitStack() as stack:
        first = Daemon(lb, lb.config_path, log)
        stack.callback(first.stop)
        first.wait("running")
        client = stack.enter_context(_client(lab, PORT_A))
        before = _maps(lb.instance)
        killed = client.mark("killed")
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        second = Daemon(lb, lb.config_path, log)
        stack.callback(second.stop)
        adopted = second.wait("adopted")
        applied = second.wait("applied")
        second.wait("running")
        back = client.mark("running again")
        after = _maps(lb.instance)
        report = client.stop(after=OBSERVE_S)
    assert applied.get("trigger") == "start" and applied.get("writes") == 0, \
        f"the restarted daemon wrote to the datapath: {applied}"
    assert adopted.get("instance") == lb.instance
    differ = [k for k in before if before[k] != after.get(k)]
    assert not differ and before.keys() == after.keys(), f"maps changed across the restart: {differ}"
    gap = [f for f in report["new"] if killed < f["t"] < back]
    assert gap and all("error" not in f for f in gap), \
        f"no new connection was answered while no daemon ran ({killed:.2f}..{back:.2f} s): {gap[:3]}"
    _verdict("lbctl run SIGKILLed and restarted", report)
    sys.stdout.write(f"no daemon for {back - killed:.2f} s; {len(gap)} new connections answered meanwhile; "
                     f"the new daemon's apply wrote {applied['writes']} entries\n")


@pytest.mark.needs(Capability.HITLESS_UPGRADE)
def test_upgrade_under_traffic(lab: Lab, lb: LabBalancer, tmp_path: Path) -> None:
    _load(lb, _config(lb, {PORT_A: None}))
    rebuilt = tmp_path / "rebuilt" / "balancer.o"
    rebuilt.parent.mkdir()
    shutil.copyfile(REPO / "build" / "bpf" / "balancer.o", rebuilt)
    with _client(lab, PORT_A) as client:
        prog_before, maps_before = _prog_id(lb), _maps(lb.instance)
        client.mark("upgrade")
        lb.lbctl("upgrade", "--object", str(rebuilt))
        client.mark("upgraded")
        prog_after, maps_after = _prog_id(lb), _maps(lb.instance)
        report = client.stop(after=OBSERVE_S)
    assert prog_after != prog_before, f"the interface still runs program {prog_before} after the upgrade"
    assert maps_before == maps_after, "the upgrade changed the VIP, real or ring maps"
    _verdict("lbctl upgrade", report)
    sys.stdout.write(f"XDP program {prog_before} -> {prog_after} on the same maps\n")


@pytest.mark.needs(Capability.HITLESS_UPGRADE)
def test_upgrade_through_the_daemon_under_traffic(lab: Lab, lb: LabBalancer, tmp_path: Path) -> None:
    """`lbctl upgrade` while `lbctl run` owns the instance and probes the reals: the daemon swaps in a
    build that really differs (suites/variant.py), then the original again; 0 requests fail."""
    from suites.variant import build_variant

    variant, original = build_variant(tmp_path), REPO / "build" / "bpf" / "balancer.o"
    conf = _config(lb, {PORT_A: None})
    # Tunnel probes: the echo listens on the VIP only.
    check = cfg.HealthCheck(port=PORT_A, type="tcp", interval_s=0.5, timeout_s=0.4, via="tunnel")
    lb.config_path.write_text(cfg.dump(replace(conf, vips=tuple(replace(v, healthcheck=check) for v in conf.vips))))
    with contextlib.ExitStack() as stack:
        daemon = start_daemon(stack, lb, tmp_path)
        assert daemon.wait("running")["health_targets"] == 3
        client = stack.enter_context(_client(lab, PORT_A))
        progs, checks = [_prog_id(lb)], [_checks_ok(lb)]
        for obj in (variant, original):
            client.mark(f"upgrade to {obj}")
            done = lb.lbctl("upgrade", "--object", str(obj))
            assert done.stdout.startswith(f"replaced the program behind 1 link(s) with {obj}"), done.stdout
            progs.append(_prog_id(lb))
        report = client.stop(after=OBSERVE_S)
        checks.append(_checks_ok(lb))
        upgraded = [e for e in daemon.events() if e.get("event") == "upgraded"]
        probes_failed = [e for e in daemon.events() if e.get("event") == "real_down"]
        assert daemon.stop() == 0
    assert [e["object"] for e in upgraded] == [str(variant), str(original)], upgraded
    assert len(set(progs)) == 3, f"the link's program ids across the two upgrades: {progs}"
    assert not probes_failed, f"a health check failed during the upgrades: {probes_failed}"
    assert checks[1] > checks[0] + 3, f"passed health checks before and after the upgrades: {checks}"
    _verdict("lbctl upgrade through lbctl run, twice", report)
    sys.stdout.write(f"XDP program {' -> '.join(map(str, progs))}; {checks[1] - checks[0]:.0f} health checks "
                     "passed meanwhile, none failed\n")


# Runs in the client node: a TCP request to VIP:PORT every 20 ms for SECONDS, each with a 0.2 s budget;
# writes a JSON line [start, end, answered] per request to PATH, on the kernel's monotonic clock (the test's too).
RESUME_PROBE = r"""
import json, socket, sys, time
vip, port, seconds, path = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
stop = time.monotonic() + seconds
with open(path, "w") as out:
    while time.monotonic() < stop:
        t = time.monotonic()
        try:
            with socket.create_connection((vip, port), timeout=0.2) as s:
                s.settimeout(0.2); s.sendall(b"probe\n"); ok = bool(s.recv(100))
        except OSError:
            ok = False
        print(json.dumps([t, time.monotonic(), ok]), file=out, flush=True)
        time.sleep(max(0.0, t + 0.02 - time.monotonic()))  # the probe's pace
"""
NEW_ROUTER_MAC = "00:00:5e:00:53:01"  # from the range IANA reserves for documentation (RFC 7042)


@pytest.mark.needs(Capability.NEXTHOP_FOLLOW)
def test_router_mac_replaced_traffic_resumes_within_a_second(lab: Lab, lb: LabBalancer, tmp_path: Path) -> None:
    """With nexthop_mac = "auto" (the lab sets no MAC) and `lbctl run`, the router's MAC is replaced
    mid-run (`ip link set ... address ...`; the router announces it): the datapath's next-hop MAC follows
    and new requests are answered again within 1 s; no long-lived connection fails."""
    _, router, rt_if = lb_link(lab.topology, "lb")
    old_mac = lab.mac(router, rt_if)
    lb.config_path.write_text(cfg.dump(_config(lb, {PORT_A: None})))
    assert cfg.load(lb.config_path).encap.nexthop_mac == "auto"
    with contextlib.ExitStack() as stack:
        daemon = start_daemon(stack, lb, tmp_path)
        daemon.wait("running")
        assert _settings_mac(lb.instance) == old_mac
        client = stack.enter_context(_client(lab, PORT_A))
        lines = tmp_path / "probe.jsonl"
        probe = subprocess.Popen(lab.argv("client", [sys.executable, "-c", RESUME_PROBE, _vip(lab), str(PORT_A),
                                                     "4", str(lines)]))
        stack.callback(probe.kill)
        poll(10.0, lambda: lines.exists() and lines.read_text().count("true") >= 10, "10 answered probe requests")
        stack.callback(lab.run, router, ["ip", "link", "set", "dev", rt_if, "address", old_mac])
        changed = time.monotonic()
        lab.run(router, ["ip", "link", "set", "dev", rt_if, "address", NEW_ROUTER_MAC])
        poll(5.0, lambda: _settings_mac(lb.instance) == NEW_ROUTER_MAC, "the datapath's next-hop MAC following")
        followed = time.monotonic() - changed
        assert probe.wait(timeout=30) == 0
        attempts = [json.loads(line) for line in lines.read_text().splitlines()]
        report = client.stop(after=OBSERVE_S)
        moved = daemon.wait("nexthop_changed")
    assert (moved["mac"], moved["previous"], moved["source"]) == (NEW_ROUTER_MAC, old_mac, "default route")
    before = [a for a in attempts if a[1] < changed]
    assert before and all(ok for _, _, ok in before), f"the probe's requests before the change: {before}"
    resumed = next((end - changed for start, end, ok in attempts if start >= changed and ok), None)
    assert resumed is not None, f"no request answered after the router's MAC changed: {attempts[-5:]}"
    sys.stdout.write(f"\nrouter MAC {old_mac} -> {NEW_ROUTER_MAC}: the datapath followed in {followed * 1000:.0f} ms, "
                     f"the first new request after the change was answered {resumed * 1000:.0f} ms after it "
                     f"({len(attempts)} probe requests)\n")
    assert followed < 1.0 and resumed < 1.0, (followed, resumed)
    _verdict("router MAC replaced", report)


def _settings_mac(instance: str) -> str:
    inst = Instance.open(instance)
    try:
        return ":".join(f"{b:02x}" for b in bytes(inst.dp.settings().nexthop_mac))
    finally:
        inst.close()


def _checks_ok(b: LabBalancer) -> float:
    """The daemon's passed health checks so far, from its metrics endpoint in the LB node."""
    text = b.lab.run(b.node, ["curl", "-sf", "http://127.0.0.1:9100/metrics"]).stdout
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("l4lab_health_checks_total{") and 'result="ok"' in line)


def _prog_id(b: LabBalancer) -> int:
    ifname = b.lab.ifname("lb", lb_link(b.lab.topology, "lb")[0])
    link = json.loads(b.lab.run(b.node, ["ip", "-j", "-d", "link", "show", "dev", ifname]).stdout)[0]
    return int(link["xdp"]["prog"]["id"])


@pytest.mark.needs(Capability.CRASH_SAFE_APPLY)
def test_controller_killed_mid_apply_converges(lab: Lab, lb: LabBalancer, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _config(lb, {PORT_A: None, PORT_B: ADDED})
    new = _config(lb, {PORT_A: None, PORT_B: None})  # B gains the third real
    _load(lb, old)
    ring_a, ring_b_old = _ring(lb.instance, PORT_A), _ring(lb.instance, PORT_B)
    steps: list[str] = []
    with _client(lab, PORT_A) as client_a, _client(lab, PORT_B, conns=100, new_every=0.5) as client_b:
        for target in (old, new):
            _crash_apply(lb, new, monkeypatch)
            half = _ring(lb.instance, PORT_B)
            written = sum(a != b for a, b in zip(_u32(half), _u32(ring_b_old), strict=True))
            assert written == CRASH_AFTER, f"the killed apply should have written {CRASH_AFTER} slots, not {written}"
            lb.apply(target)
            want = ring_b_old if target is old else _model_ring(lb.instance, PORT_B)
            got = _ring(lb.instance, PORT_B)
            wrong = sum(a != b for a, b in zip(_u32(got), _u32(want), strict=True))
            name = "old" if target is old else "new"
            assert wrong == 0, (f"after a crash at {CRASH_AFTER} slots, applying the {name} config left {wrong} "
                                f"slots of the changed VIP's ring unlike that config's ring")
            assert _ring(lb.instance, PORT_A) == ring_a, "the unchanged VIP's ring changed"
            steps.append(f"crash after {written} slots, then apply {name}: converged")
        report_a = client_a.stop(after=OBSERVE_S)
        report_b = client_b.stop()
    _verdict("controller killed mid-apply, unchanged VIP (A)", report_a)
    _verdict("controller killed mid-apply, changed VIP with sessions (B)", report_b, least=100)
    sys.stdout.write("; ".join(steps) + "\n")


def _crash_apply(b: LabBalancer, conf: cfg.Config, monkeypatch: pytest.MonkeyPatch) -> None:
    b.config_path.write_text(cfg.dump(conf))
    with monkeypatch.context() as env:
        env.setenv(CRASH_AFTER_SLOTS_ENV, str(CRASH_AFTER))
        done = b.lbctl("apply", str(b.config_path), check=False)
    assert done.returncode == -signal.SIGKILL, \
        f"lbctl apply with {CRASH_AFTER_SLOTS_ENV} should die by SIGKILL, exited {done.returncode}: {done.stderr}"


def _u32(raw: bytes) -> memoryview:
    return memoryview(raw).cast("I")


def _model_ring(instance: str, port: int) -> bytes:
    """The ring the controller's model builds from the instance's recorded inputs (its state)."""
    from balancer.controller import _ring as build
    from balancer.controller import ring_kind

    inst = Instance.open(instance)
    try:
        name = next(n for n in inst.state.vip_nums if n.endswith(f":{port}/tcp"))
        kind = ring_kind(next(v for v in inst.config.vips if v.name == name))
        return bytes(build(inst.state.ring_inputs[name], inst.state.real_ids, inst.dp.ring_size, kind).tobytes())
    finally:
        inst.close()


@pytest.mark.needs(Capability.OWNER_QUERY)
def test_ring_change_after_lru_eviction(lab: Lab, lb: LabBalancer) -> None:
    """A session the LRU evicted no longer holds its flow: the flow's next packet is hashed on the ring
    as it is *then*. Here the session tables hold LRU_SIZE flows per CPU while CONNS connections
    and a stream of new ones cross CPU 0, so every established flow is evicted between two of its
    requests (the LB counts an LRU miss for each). Then the third real joins the VIP: a flow whose
    ring owner changed goes to the new real, which has no such connection and resets it; a flow
    whose owner did not change is hashed back to its own real and never notices. So the reset
    connections are exactly the evicted ones whose owner changed, as the oracle (the loaded
    program's ring, asked per connection) predicts. With one session table shared by the CPUs
    (issue 11) a few connections may still hold their entry at the change: those keep their real
    and are not reset. So: no connection whose owner did not change is reset, and every connection
    whose owner changed is either reset or still answered by its own real.
    """
    lru_size = 16
    _load(lb, _config(lb, {PORT_A: ADDED}, lru_size=lru_size))
    vip = _vip(lab)
    with _client(lab, PORT_A) as client:
        before_owners = ring_owners(lab, lb, vip, PORT_A, client.ready["conns"])
        mark = counters(lb)
        client.mark("change")
        lb.lbctl("real", "add", vip, str(PORT_A), "tcp", real_addresses(lab.topology, 4)[ADDED])
        report = client.stop(after=OBSERVE_S + TIMEOUT_S)
        lru = changed(mark, counters(lb))
    after_owners = ring_owners(lab, lb, vip, PORT_A, report["conns"])
    wrong = [c["index"] for c in report["conns"] if before_owners[c["index"]] != c["node"]]
    assert not wrong, f"the oracle named another real than the one that answered for connections {wrong[:5]}"
    moved = owner_changed(before_owners, after_owners)
    reset = {c["index"] for c in report["conns"] if c["status"] == "reset"}
    kinds = {c["status"] for c in report["conns"]}
    figures = _verdict("ring change after LRU eviction", report, moved_ok=True)
    sys.stdout.write(f"LRU of {lru_size} per CPU; LB counters over the change: {lru}; {len(moved)} connections "
                     f"changed ring owner, {len(reset)} were reset\n")
    assert lru.get("LRU_MISS", 0) >= figures["connections"], f"the LRU did not evict established flows: {lru}"
    assert kinds <= {"ok", "reset"}, f"an evicted flow that moved should be reset, got {kinds}"
    assert any(after_owners[i] == ADDED for i in moved), f"adding {ADDED} gave it no connection"
    assert reset <= moved, f"reset connections whose ring owner did not change: {sorted(reset - moved)[:5]}"
    kept = moved - reset
    status = {c["index"]: c["status"] for c in report["conns"]}
    assert all(status[i] == "ok" for i in kept), f"owner changed, neither reset nor ok: {sorted(kept)[:5]}"
    assert len(reset) >= 1, f"no evicted connection whose owner changed was reset (moved {len(moved)})"
    sys.stdout.write(f"{len(moved)} owner changes = {len(reset)} reset + {len(kept)} kept their session\n")
