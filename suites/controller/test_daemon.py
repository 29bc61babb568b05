"""`lbctl run` end to end in a private netns world: drains on failed health checks, sessions kept,
metrics, SIGHUP reloads, crash and adoption, and the packaging's install script.

The world (prefix ``dmt-``): netns ``dmt-<id>-lb`` holds veth ``lb0`` (192.0.2.1/24, the balancer's
XDP program attaches there) whose peer ``rl0`` sits in ``dmt-<id>-rl`` with one address per real
(192.0.2.2, .3, .4), each served by its own process (HTTP on port 80, UDP echo on 9000) so a real is
killed alone. The daemon runs in the lb netns as ``python -m balancer.cli --instance dmt-<id> run``.
Client packets are written onto ``rl0`` with a packet socket: they enter ``lb0`` where the balancer
picks a real and counts it per real (the encapsulated frames it transmits back are not needed).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from pyroute2 import NetNS

from balancer import config as cfg
from balancer import controller, health
from balancer.controller import Instance
from balancer.datapath import Decap
from lab.harness import poll

from ._daemon_rig import (
    EXTRA_REAL,
    FALL,
    INTERVAL,
    METRICS_PORT,
    OBJ,
    PY,
    QUIET_INTERVAL,
    REALS,
    REPO,
    RISE,
    SETTLE_S,
    TCP_VIP,
    UDP_VIP,
    VIP,
    World,
    in_netns,
)

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not os.path.ismount("/sys/fs/bpf"),
                                reason="needs root and bpffs mounted at /sys/fs/bpf")

@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """Name: world. Scope: function. Depends: root, bpffs, built balancer object.

    Two namespaces joined by a veth, real servers and daemons on demand; all removed afterwards::

        def test_x(world):
            world.start_server("192.0.2.2"); mark = world.start_daemon(world.write_config(["192.0.2.2"]))
            world.wait_running(mark)
    """
    if not OBJ.exists():
        pytest.fail(f"{OBJ} is missing: run `make bpf` first")
    monkeypatch.setattr(controller, "STATE_ROOT", str(tmp_path / "state"))
    with ExitStack() as stack:
        w = World(stack, tmp_path)
        try:
            yield w
        except BaseException:
            if w.log_path.exists():
                print(w.log_path.read_text()[-4000:], file=sys.stderr)  # the daemon's story
            raise


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def _families(text: str) -> dict[str, Metric]:
    """The exposition parsed by the Prometheus client's own parser, keyed by exposed family name
    (the parser strips a counter's ``_total``; it is put back here). The parser is lax: a sample
    that does not belong to the family declared above it becomes a family of type "unknown", so
    such a family here means a sample line without its own TYPE."""
    out: dict[str, Metric] = {}
    for fam in text_string_to_metric_families(text):
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        assert fam.type not in ("unknown", "untyped"), f"{name}: no TYPE line for {fam.samples}"
        assert name not in out, f"{name} declared twice"
        out[name] = fam
    return out


def _samples(text: str) -> Samples:
    out: Samples = {}
    for fam in _families(text).values():
        for sample in fam.samples:
            key = (sample.name, frozenset(sample.labels.items()))
            assert key not in out, f"duplicate sample {sample}"
            out[key] = sample.value
    return out


def _counters_of(stats: dict[str, Any]) -> Samples:
    """The packet/byte samples the endpoint must serve for ``lbctl stats --json`` output."""
    out: Samples = {}
    for group, label in (("vips", "vip"), ("reals", "real"), ("reasons", "reason")):
        for key, c in stats[group].items():
            value = key.lower() if group == "reasons" else key
            for unit in ("packets", "bytes"):
                out[(f"l4lab_{label}_{unit}_total", frozenset({(label, value)}))] = c[unit]
    for event, n in stats["events"].items():
        out[("l4lab_events_total", frozenset({("event", event.lower())}))] = n
    return out


COUNTER_FAMILIES = {f"l4lab_{label}_{unit}_total" for label in ("vip", "real", "reason")
                    for unit in ("packets", "bytes")} | {"l4lab_events_total"}

# Every family the endpoint serves: its type and the label names of each of its samples.
FAMILIES = {
    "l4lab_vip_packets_total": ("counter", {"vip"}),
    "l4lab_vip_bytes_total": ("counter", {"vip"}),
    "l4lab_real_packets_total": ("counter", {"real"}),
    "l4lab_real_bytes_total": ("counter", {"real"}),
    "l4lab_reason_packets_total": ("counter", {"reason"}),
    "l4lab_reason_bytes_total": ("counter", {"reason"}),
    "l4lab_events_total": ("counter", {"event"}),
    "l4lab_real_up": ("gauge", {"vip", "real"}),
    "l4lab_real_weight": ("gauge", {"vip", "real"}),
    "l4lab_real_configured_weight": ("gauge", {"vip", "real"}),
    "l4lab_health_checks_total": ("counter", {"vip", "real", "result"}),
    "l4lab_applies_total": ("counter", {"trigger"}),
    "l4lab_apply_errors_total": ("counter", {"trigger"}),
    "l4lab_last_reload_success": ("gauge", set()),
    "l4lab_last_reload_success_timestamp_seconds": ("gauge", set()),
    "l4lab_build_info": ("gauge", {"version", "abi_digest", "python", "lb_instance"}),
}
# prometheus_client's process metrics of the daemon (Linux), beside ours.
PROCESS_FAMILIES = {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                    "process_start_time_seconds", "process_open_fds", "process_max_fds"}


def _get(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


# ------------------------------------------------------------------------------------------- tests


def test_failed_real_is_drained_keeps_its_sessions_and_comes_back(world: World) -> None:
    for addr in REALS:
        world.start_server(addr)
    mark = world.start_daemon(world.write_config(REALS))
    world.wait_running(mark)
    a, b = REALS
    id_a, id_b = world.real_id(a), world.real_id(b)
    assert world.ring_ids(TCP_VIP) == {id_a, id_b}
    assert world.ring_ids(UDP_VIP) == {id_a, id_b}

    # A flow that the ring sends to a, established before a fails.
    sport = next(p for p in range(20000, 20100) if world.flow_real(p) == a)

    t_sick = time.monotonic()
    world.sicken_server(a)
    ev = world.wait_event("real_down", mark, SETTLE_S, match=lambda r: r["vip"] == TCP_VIP and r["real"] == a)
    # the fall-th failed probe in a row drained it: the server numbered its sick answers 501, 502, ...
    assert ev["detail"].endswith(f"status {500 + FALL} (expected 2xx or 3xx)"), ev
    poll(SETTLE_S, lambda: world.ring_ids(TCP_VIP) == {id_b}, f"{a} (id {id_a}) leaving the ring of {TCP_VIP}")
    took = time.monotonic() - t_sick
    print(f"\ndrain: {a} out of the ring after exactly {FALL} failed probes (the log's detail), "
          f"{took:.2f} s after its server turned sick (interval {INTERVAL} s)")
    assert took >= (FALL - 1) * INTERVAL, took  # fall probes, interval apart: never sooner
    world.wait_event("real_down", mark, SETTLE_S, match=lambda r: r["vip"] == UDP_VIP and r["real"] == a)
    poll(SETTLE_S, lambda: world.ring_ids(UDP_VIP) == {id_b}, f"{a} leaving the ring of {UDP_VIP}")
    status, _ctype, text = world.scrape()
    s = _samples(text)
    assert _get(s, "l4lab_real_up", vip=TCP_VIP, real=a) == 0
    assert _get(s, "l4lab_real_weight", vip=TCP_VIP, real=a) == 0
    assert _get(s, "l4lab_real_configured_weight", vip=TCP_VIP, real=a) == 1
    assert _get(s, "l4lab_real_up", vip=TCP_VIP, real=b) == 1
    assert _get(s, "l4lab_health_checks_total", vip=TCP_VIP, real=a, result="failed") >= FALL

    # The established flow still reaches a through its session; new flows all go to b.
    assert world.flow_real(sport) == a
    assert {world.flow_real(p) for p in range(21000, 21012)} == {b}

    t_up = time.monotonic()
    world.heal_server(a)
    ev = world.wait_event("real_up", mark, SETTLE_S, match=lambda r: r["vip"] == TCP_VIP and r["real"] == a)
    assert ev["detail"] == f"status {200 + RISE}", ev  # the rise-th good probe in a row restored it
    poll(SETTLE_S, lambda: world.ring_ids(TCP_VIP) == {id_a, id_b}, f"{a} returning to the ring")
    back = time.monotonic() - t_up
    print(f"restore: {a} back in the ring after exactly {RISE} good probes, {back:.2f} s after its server healed")
    assert back >= (RISE - 1) * INTERVAL, back
    poll(SETTLE_S, lambda: world.ring_ids(UDP_VIP) == {id_a, id_b}, f"{a} returning to the UDP ring")
    applied = [r for r in world.logs()[mark:] if r["event"] == "applied"]
    assert [r["trigger"] for r in applied][0] == "start"
    assert {r["trigger"] for r in applied[1:]} == {"health"}


def test_metrics_parse_with_the_prometheus_parser_and_match_lbctl_stats(world: World) -> None:
    for addr in REALS:
        world.start_server(addr)
    mark = world.start_daemon(world.write_config(REALS, interval=QUIET_INTERVAL))
    world.wait_running(mark)
    counted = {world.flow_real(p) for p in range(30000, 30016)}
    assert counted == set(REALS)  # 16 flows over two equal reals: both get some

    # Client traffic has stopped, but health probes' replies and the kernel's own packets still
    # cross lb0 now and then. Counters only grow, so `lbctl stats` read between two scrapes that
    # agree on every counter must equal them exactly; retry until a quiet window gives that.
    attempts = 0

    def settled() -> tuple[tuple[int, str, str], Samples, dict[str, Any]] | None:
        nonlocal attempts
        attempts += 1
        first = world.scrape()
        stats = world.lbctl_stats()
        second = world.scrape()
        assert first[0] == second[0] == 200, f"scrape answered {first[0]}, {second[0]}: {first[2]}"
        counters = {k: v for k, v in _samples(first[2]).items() if k[0] in COUNTER_FAMILIES}
        again = {k: v for k, v in _samples(second[2]).items() if k[0] in COUNTER_FAMILIES}
        return (first, counters, stats) if counters == again else None
    (status, ctype, text), scraped, stats = poll(
        10 * QUIET_INTERVAL, settled, "two scrapes agreeing around `lbctl stats --json`", interval_s=0.1)
    print(f"\nmetrics: scrapes agreed around lbctl stats on attempt {attempts}")
    assert status == 200
    assert ctype == "text/plain; version=0.0.4; charset=utf-8"
    expected = _counters_of(stats)
    assert set(scraped) == set(expected), (f"served but not in lbctl: {set(scraped) - set(expected)}; "
                                           f"in lbctl but not served: {set(expected) - set(scraped)}")
    differ = {k: (scraped[k], expected[k]) for k in expected if scraped[k] != expected[k]}
    assert not differ, f"metric (served, lbctl) differ: {differ}"
    # The comparison is not 0 == 0: the flows sent are there, on both sides.
    assert stats["vips"][TCP_VIP]["packets"] == 16
    assert all(stats["reals"][real]["packets"] > 0 for real in REALS)
    assert stats["reasons"]["TX_ENCAP"]["packets"] == 16
    assert stats["events"]["LRU_MISS"] == 16

    # Every family: its TYPE, a HELP text, and exactly its label names on every sample.
    families = _families(text)
    assert set(families) == set(FAMILIES) | PROCESS_FAMILIES
    for name, fam in families.items():
        if name in PROCESS_FAMILIES:
            continue
        kind, label_names = FAMILIES[name]
        assert fam.type == kind, f"{name} is typed {fam.type}, expected {kind}"
        assert (kind == "counter") == name.endswith("_total"), name
        assert fam.documentation.strip(), f"{name} has no HELP text"
        assert fam.samples, f"{name} has no samples"
        for sample in fam.samples:
            assert sample.name == name, f"{sample.name} under family {name}"
            assert set(sample.labels) == label_names, f"{name} sample labels {sample.labels}"

    s = _samples(text)
    for real in REALS:
        for vip in (TCP_VIP, UDP_VIP):
            assert _get(s, "l4lab_real_up", vip=vip, real=real) == 1
            assert _get(s, "l4lab_real_weight", vip=vip, real=real) == 1
            assert _get(s, "l4lab_real_configured_weight", vip=vip, real=real) == 1
            assert _get(s, "l4lab_health_checks_total", vip=vip, real=real, result="ok") >= 1
            assert _get(s, "l4lab_health_checks_total", vip=vip, real=real, result="failed") == 0
    assert _get(s, "l4lab_applies_total", trigger="start") == 1
    assert _get(s, "l4lab_apply_errors_total", trigger="start") == 0
    (info,) = families["l4lab_build_info"].samples
    assert info.value == 1
    assert info.labels["lb_instance"] == world.instance
    assert not [(n, k) for n, k in s if "instance" in dict(k)], "a label named instance clashes with Prometheus's"
    assert _get(s, "l4lab_last_reload_success") == 1
    assert time.time() - 600 < _get(s, "l4lab_last_reload_success_timestamp_seconds") <= time.time()
    assert _get(s, "process_open_fds") > 3  # the daemon's own: maps, sockets, the log
    assert _get(s, "process_start_time_seconds") <= time.time()
    assert world.scrape("/")[0] == 404


def test_sighup_applies_a_changed_config_and_keeps_state_on_a_bad_one(world: World) -> None:
    for addr in (*REALS, EXTRA_REAL):
        world.start_server(addr)
    config = world.write_config(REALS)
    mark = world.start_daemon(config)
    world.wait_running(mark)
    assert world.daemon is not None
    ids = world.ring_ids(TCP_VIP)

    world.write_config([*REALS, EXTRA_REAL])
    world.daemon.send_signal(signal.SIGHUP)
    world.wait_event("applied", mark, 10.0, match=lambda r: r["trigger"] == "reload")
    id_c = world.real_id(EXTRA_REAL)
    reloaded = _samples(world.scrape()[2])
    assert _get(reloaded, "l4lab_last_reload_success") == 1
    good_at = _get(reloaded, "l4lab_last_reload_success_timestamp_seconds")
    assert world.ring_ids(TCP_VIP) == ids | {id_c}
    assert world.ring_ids(UDP_VIP) == ids | {id_c}
    poll(5.0, lambda: _get(_samples(world.scrape()[2]), "l4lab_health_checks_total", vip=TCP_VIP,
                          real=EXTRA_REAL, result="ok") >= 1, f"probes of the added real {EXTRA_REAL}")

    good_state = Instance.state_path(world.instance).read_text()
    config.write_text(config.read_text().replace('port = 80\n', 'port = 80\nbogus_key = 1\n', 1))
    world.daemon.send_signal(signal.SIGHUP)
    err = world.wait_event("reload_failed", mark, 10.0)
    assert err["level"] == "error"
    assert err["error"] == f"{config}: vips[0].bogus_key is not a known key; known keys here: address, " \
        "encap, gue_csum, hash, healthcheck, katran_ring, lru, outer_src, port, proto, reals, server_id_from, " \
        "src_routes, udp_flow_migration"
    world.write_config([*REALS, EXTRA_REAL, "2001:db8::5"], extra='via = "tunnel"\n')
    n_failed = len([r for r in world.logs() if r["event"] == "reload_failed"])
    world.daemon.send_signal(signal.SIGHUP)
    poll(10.0, lambda: len([r for r in world.logs() if r["event"] == "reload_failed"]) > n_failed,
             "the 4in6 tunnel config refused")
    err = [r for r in world.logs() if r["event"] == "reload_failed"][-1]
    assert err["error"] == f'{config}: vips[0].healthcheck.via = "tunnel" cannot probe vips[0].reals[3] ' \
        f"(2001:db8::5) of {TCP_VIP}: tunnel probes keep the VIP's family (4in4, 6in6, GUE over the same " \
        'family); use via = "direct" for this VIP'

    # Valid, but the loaded datapath cannot take it: the apply is refused and rolled back.
    world.write_config([*REALS, EXTRA_REAL])
    config.write_text(config.read_text().replace("ring_size = 251", "ring_size = 257"))
    world.daemon.send_signal(signal.SIGHUP)
    refused = world.wait_event("apply_failed", mark, 10.0, match=lambda r: r["trigger"] == "reload")
    assert refused["error"] == "cannot change ring_size from 251 to 257 while loaded; run `lbctl unload` " \
        "and `lbctl load` again"
    assert any(r["event"] == "restart_needed" for r in world.logs()[mark:])
    world.wait_event("reload_failed", mark, 5.0, match=lambda r: "datapath refused" in r["error"])

    assert world.daemon.poll() is None
    assert Instance.state_path(world.instance).read_text() == good_state
    assert world.ring_ids(TCP_VIP) == ids | {id_c}
    s = _samples(world.scrape()[2])
    assert _get(s, "l4lab_applies_total", trigger="reload") == 1
    assert _get(s, "l4lab_apply_errors_total", trigger="reload") == 3
    assert _get(s, "l4lab_last_reload_success") == 0  # the last SIGHUP was refused ...
    assert _get(s, "l4lab_last_reload_success_timestamp_seconds") == good_at  # ... the good one stays the last
    assert _get(s, "l4lab_real_up", vip=TCP_VIP, real=EXTRA_REAL) == 1  # probes still run


def test_killed_daemon_leaves_forwarding_and_a_restart_adopts_it(world: World) -> None:
    a, b = REALS
    world.start_server(a)
    world.start_server(b)
    config = world.write_config(REALS)
    mark = world.start_daemon(config)
    world.wait_running(mark)
    assert any(r["event"] == "loaded" for r in world.logs()[mark:])
    prog = world.prog_id()
    sport = 40000
    first = world.flow_real(sport)

    world.kill_server(b)  # b is drained when the daemon dies: a restart must keep it drained
    world.wait_event("real_down", mark, SETTLE_S,
                     match=lambda r: r["vip"] == TCP_VIP and r["real"] == b)
    poll(SETTLE_S, lambda: world.ring_ids(TCP_VIP) == {world.real_id(a)}, f"{b} drained")
    assert world.daemon is not None
    world.daemon.send_signal(signal.SIGKILL)
    assert world.daemon.wait(timeout=10) == -signal.SIGKILL

    # Nothing runs the controller now: the program still forwards and keeps sessions.
    assert world.prog_id() == prog
    assert world.flow_real(sport) == first
    assert world.flow_real(sport + 1) == a

    mark = world.start_daemon(config)
    run = world.wait_running(mark)
    assert run["vips"] == 2
    events = [r["event"] for r in world.logs()[mark:]]
    assert "adopted" in events and "loaded" not in events
    assert world.prog_id() == prog
    assert world.ring_ids(TCP_VIP) == {world.real_id(a)}  # still drained at once, no flap
    assert world.flow_real(sport) == first

    world.daemon.send_signal(signal.SIGTERM)
    assert world.daemon.wait(timeout=10) == 0
    world.wait_event("stopped", mark, SETTLE_S)
    assert world.prog_id() == prog  # a clean stop leaves the datapath loaded too
    assert world.flow_real(sport) == first


def _notifications(sock: socket.socket, until: str, timeout: float) -> list[dict[str, str]]:
    """The sd_notify datagrams that arrive on `sock`, parsed, up to the first with the line `until`."""
    got: list[dict[str, str]] = []
    deadline = time.monotonic() + timeout
    while not got or until not in [f"{k}={v}" for k, v in got[-1].items()]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(f"no {until} from the daemon after {timeout:g} s; got {got}")
        sock.settimeout(remaining)
        with contextlib.suppress(TimeoutError):
            got.append(dict(line.split("=", 1) for line in sock.recv(4096).decode().splitlines()))
    return got


def test_under_systemd_it_notifies_ready_after_the_maps_are_programmed(world: World, tmp_path: Path) -> None:
    """`lbctl run` speaks sd_notify(3) to the socket in NOTIFY_SOCKET (the unit is Type=notify):
    READY=1 once the datapath is loaded and the config applied, RELOADING=1 then READY=1 around a
    SIGHUP, WATCHDOG=1 from its event loop when WATCHDOG_USEC asks, STOPPING=1 on SIGTERM."""
    for addr in REALS:
        world.start_server(addr)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    world.stack.callback(sock.close)
    sock.bind(str(tmp_path / "notify.sock"))
    mark = world.start_daemon(world.write_config(REALS),
                              {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "400000"})
    assert world.daemon is not None

    before = _notifications(sock, "READY=1", SETTLE_S)
    # The moment READY=1 arrives the ring already holds both reals, and the log says so first.
    assert world.ring_ids(TCP_VIP) == {world.real_id(a) for a in REALS}
    events = [r["event"] for r in world.logs()[mark:]]
    assert events.index("applied") < events.index("running")
    assert len(before) == 1, f"notifications before READY=1: {before}"
    ready = before[-1]
    assert ready["MAINPID"] == str(world.daemon.pid)  # nsenter execs: the daemon is the process we started
    assert ready["STATUS"] == f"forwarding 2 VIPs; metrics at 127.0.0.1:{METRICS_PORT}"

    # Watchdog period 0.4 s: pings at least every 0.2 s while nothing happens.
    pings = _notifications(sock, "WATCHDOG=1", SETTLE_S) + _notifications(sock, "WATCHDOG=1", SETTLE_S)
    assert all(p == {"WATCHDOG": "1"} for p in pings), pings

    world.daemon.send_signal(signal.SIGHUP)
    reload = [n for n in _notifications(sock, "READY=1", SETTLE_S) if n != {"WATCHDOG": "1"}]
    assert [sorted(n) for n in reload] == [["MONOTONIC_USEC", "RELOADING"], ["READY", "STATUS"]], reload
    assert int(reload[0]["MONOTONIC_USEC"]) > 0

    world.daemon.send_signal(signal.SIGTERM)
    stop = [n for n in _notifications(sock, "STOPPING=1", SETTLE_S) if n != {"WATCHDOG": "1"}]
    assert stop == [{"STOPPING": "1", "STATUS": "stopping; the datapath stays loaded"}]
    assert world.daemon.wait(timeout=10) == 0


def test_a_config_it_cannot_run_is_refused_at_start(world: World) -> None:
    config = world.write_config([*REALS, "2001:db8::5"], extra='via = "tunnel"\n')
    mark = world.start_daemon(config)
    assert world.daemon is not None
    assert world.daemon.wait(timeout=20) == 2
    err = world.wait_event("start_failed", mark, SETTLE_S)
    assert err["error"].startswith(
        f'{config}: vips[0].healthcheck.via = "tunnel" cannot probe vips[0].reals[2] (2001:db8::5)')
    assert not Path(Instance.pin_dir(world.instance)).exists()
    assert not Instance.state_path(world.instance).exists()


@pytest.mark.parametrize("encap", ["ipip", "gue1", "gue0"])
def test_tunnel_probes_reach_the_real_through_its_decap(world: World, encap: str) -> None:
    """Probes addressed to the VIP, encapsulated by hc_encap as the VIP's traffic is: only a real that
    decapsulates passes."""
    a, b = REALS
    with NetNS(world.rl) as ipr:
        ipr.addr("add", index=ipr.link_lookup(ifname="lo")[0], address=VIP, prefixlen=32)
    with NetNS(world.lb) as ipr:  # the LB host's route to the VIP (normally its default route)
        ipr.route("add", dst=f"{VIP}/32", gateway=a, oif=ipr.link_lookup(ifname="lb0")[0])
    decap = Decap.load(str(REPO / "build" / "bpf" / "decap.o"))
    world.stack.callback(decap.close)
    decap.add_local(a)  # a decapsulates; b's tunnel packets reach a kernel without ipip and die
    in_netns(world.rl, lambda: decap.attach_tc("rl0"))
    world.start_server(VIP)  # only the VIP answers HTTP on port 80 through the tunnel
    for addr in REALS:
        world.start_server(addr)  # the UDP VIP's direct probes
    mark = world.start_daemon(world.write_config(REALS, extra='via = "tunnel"\n', tcp_encap=encap))
    run = world.wait_running(mark)
    assert run["tunnel_probes"] == 2
    tunnel = world.wait_event("tunnel_probes", 0, SETTLE_S)
    assert tunnel["interfaces"] == ["lb0"]

    world.wait_event("real_down", mark, SETTLE_S,
                     match=lambda r: r["vip"] == TCP_VIP and r["real"] == b)
    poll(SETTLE_S, lambda: world.ring_ids(TCP_VIP) == {world.real_id(a)}, f"{b} drained")
    s = _samples(world.scrape()[2])
    assert _get(s, "l4lab_health_checks_total", vip=TCP_VIP, real=a, result="ok") >= 2
    assert _get(s, "l4lab_health_checks_total", vip=TCP_VIP, real=a, result="failed") == 0
    kind = "IPIP" if encap == "ipip" else "GUE"
    assert decap.reasons()[kind] >= 2, decap.reasons()  # a's probes arrived encapsulated as the VIP's traffic
    assert decap.reasons()["PASS_NOT_LOCAL"] >= FALL  # b's too, but b does not decapsulate

    decap.add_local(b)
    world.wait_event("real_up", mark, SETTLE_S,
                     match=lambda r: r["vip"] == TCP_VIP and r["real"] == b)
    poll(SETTLE_S, lambda: world.ring_ids(TCP_VIP) == {world.real_id(a), world.real_id(b)},
             f"{b} back in the ring")
    assert not any(r["event"] == "real_down" and r["real"] == a for r in world.logs()[mark:])


def test_install_script_installs_into_a_root_and_is_idempotent(tmp_path: Path) -> None:
    root = tmp_path / "root"
    script = REPO / "packaging" / "install.sh"
    first = subprocess.run(["bash", str(script), "--root", str(root), "--lbctl", "/opt/l4lab/bin/lbctl"],
                           check=True, capture_output=True, text=True).stdout
    unit = root / "etc/systemd/system/lbctl.service"
    conf = root / "etc/l4lab/lb.toml"
    assert f"installed  {unit}" in first and f"installed  {conf}" in first
    text = unit.read_text()
    assert "ExecStart=/opt/l4lab/bin/lbctl run --config /etc/l4lab/lb.toml\n" in text
    assert "Restart=on-failure\n" in text
    assert "ExecReload=/bin/kill -HUP $MAINPID\n" in text
    assert "Type=notify\n" in text and "WatchdogSec=" in text  # lbctl run sends READY=1, WATCHDOG=1
    assert "CapabilityBoundingSet=CAP_BPF CAP_PERFMON CAP_NET_ADMIN CAP_SYS_ADMIN\n" in text
    for hardening in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                      "ReadWritePaths=/sys/fs/bpf", "RuntimeDirectory=lbctl", "RuntimeDirectoryPreserve=yes"):
        assert f"{hardening}\n" in text, hardening
    assert ".venv" not in text
    assert conf.read_text() == (REPO / "packaging" / "lb.toml").read_text()
    health.require_supported(cfg.load(conf), str(conf))  # the example is a valid config
    if shutil.which("systemd-analyze"):  # the unit as systemd reads it, with an lbctl that exists
        probe_unit = tmp_path / "lbctl.service"
        probe_unit.write_text(text.replace("/opt/l4lab/bin/lbctl", sys.executable))
        check = subprocess.run(["systemd-analyze", "verify", str(probe_unit)], capture_output=True, text=True)
        assert check.returncode == 0 and check.stderr == "", check.stderr

    snapshot = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    again = subprocess.run(["bash", str(script), "--root", str(root), "--lbctl", "/opt/l4lab/bin/lbctl"],
                           check=True, capture_output=True, text=True).stdout
    assert "installed" not in again and "updated" not in again
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == snapshot

    conf.write_text("# mine\n")
    env = dict(os.environ, DESTDIR=str(root))
    kept = subprocess.run(["bash", str(script), "--lbctl", "/opt/l4lab/bin/lbctl"], env=env,
                          check=True, capture_output=True, text=True).stdout
    assert f"kept       {conf}" in kept
    assert conf.read_text() == "# mine\n"
    bad = subprocess.run(["bash", str(script), "--root", str(root), "--lbctl", "lbctl"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "must be an absolute path" in bad.stderr

    # Without --lbctl: the installed lbctl on PATH, never the one in this source tree.
    installed = tmp_path / "bin" / "lbctl"
    installed.parent.mkdir()
    installed.write_text("#!/bin/sh\n")
    installed.chmod(0o755)
    path_env = dict(os.environ, PATH=f"{installed.parent}:/usr/bin:/bin")
    subprocess.run(["bash", str(script), "--root", str(root)], env=path_env, check=True, capture_output=True)
    assert f"ExecStart={installed} run --config" in unit.read_text()
    in_tree = REPO / ".venv" / "bin"
    if (in_tree / "lbctl").exists():
        refused = subprocess.run(["bash", str(script), "--root", str(root)], capture_output=True, text=True,
                                 env=dict(os.environ, PATH=f"{in_tree}:/usr/bin:/bin"))
        assert refused.returncode == 1 and "lives in the source tree" in refused.stderr, refused.stderr


def _lbctl(world: World, *args: str) -> subprocess.CompletedProcess[str]:
    """lbctl as an operator runs it beside the daemon: its own process, in the LB netns."""
    return subprocess.run(["nsenter", f"--net=/run/netns/{world.lb}", PY, "-m", "balancer.cli",
                           "--instance", world.instance, *args],
                          cwd=REPO, env=world.env(), capture_output=True, text=True, timeout=120)


def _prog_tag(prog_id: int) -> str:
    out = subprocess.run(["bpftool", "-j", "prog", "show", "id", str(prog_id)], check=True,
                         capture_output=True, text=True).stdout
    return str(json.loads(out)["tag"])


def test_writes_are_handed_to_the_daemon_or_refused_with_the_command_that_works(
        world: World, tmp_path: Path) -> None:
    """With `lbctl run` owning the instance, `lbctl upgrade` is carried out by the daemon (a program that
    really differs, behind the same link, on the same maps; health checks never stop), `lbctl apply`
    of the daemon's own file is its reload, answered; other writes are refused naming the file to edit."""
    from suites.variant import build_variant

    variant = build_variant(tmp_path)
    for addr in REALS:
        world.start_server(addr)
    config = world.write_config(REALS)
    mark = world.start_daemon(config)
    world.wait_running(mark)
    a = REALS[0]
    sport = next(p for p in range(22000, 22100) if world.flow_real(p) == a)
    prog, tag = world.prog_id(), _prog_tag(world.prog_id())
    checks_before = _get(_samples(world.scrape()[2]), "l4lab_health_checks_total", vip=TCP_VIP, real=a, result="ok")

    done = _lbctl(world, "upgrade", "--object", str(variant))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"replaced the program behind 1 link(s) with {variant} (was {OBJ})"), done.stdout
    upgraded = world.wait_event("upgraded", mark, SETTLE_S)
    assert upgraded["trigger"] == "request" and upgraded["object"] == str(variant), upgraded
    assert world.prog_id() != prog and _prog_tag(world.prog_id()) != tag  # other instructions are running
    assert world.flow_real(sport) == a  # its session survived the swap
    poll(SETTLE_S, lambda: _get(_samples(world.scrape()[2]), "l4lab_health_checks_total", vip=TCP_VIP, real=a,
                                result="ok") > checks_before + RISE, "health checks after the upgrade")
    assert world.daemon is not None and world.daemon.poll() is None
    print(f"\nupgrade through the daemon: program {prog} (tag {tag}) -> {world.prog_id()} "
          f"(tag {_prog_tag(world.prog_id())}); flow {sport} stayed on {a}")

    # apply of the daemon's own file: its reload, answered with the outcome.
    world.write_config([*REALS, EXTRA_REAL])
    world.start_server(EXTRA_REAL)
    done = _lbctl(world, "apply", str(config))
    assert (done.returncode, done.stdout.strip()) == (0, f"applied {config}"), done.stderr
    assert world.real_id(EXTRA_REAL) in world.ring_ids(TCP_VIP)
    config.write_text(config.read_text().replace("port = 80\n", "port = 80\nbogus_key = 1\n", 1))
    done = _lbctl(world, "apply", str(config))
    assert done.returncode == 1 and f"the daemon refused: {config}: vips[0].bogus_key is not a known key" \
        in done.stderr, done.stderr

    other = world.write_config(REALS, name="other.toml")
    pid = world.daemon.pid
    owner = f"instance '{world.instance}' is owned by lbctl run (pid {pid}), which keeps it matching {config}"
    apply_cmd = f"`lbctl --instance {world.instance} apply {config}` (or `systemctl reload lbctl`)"
    for args, remedy in ((("apply", str(other)), f"put the new config in {config}, then {apply_cmd}"),
                         (("real", "del", VIP, "80", "tcp", a), f"edit the reals in {config}, then {apply_cmd}"),
                         (("unload",), f"stop the daemon first (`systemctl stop lbctl`, or `kill {pid}`)")):
        done = _lbctl(world, *args)
        assert done.returncode == 1, (args, done.stderr)
        assert done.stderr.strip().startswith(f"lbctl: {owner}; {remedy}"), (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1

    # The socket: root's only, and a request it does not know is answered, not obeyed.
    sock_path = world.state_root / f"{world.instance}.sock"
    assert stat.S_IMODE(sock_path.stat().st_mode) & 0o077 == 0  # no access for group or others
    for line in (b'{"verb": "unload"}\n', b"unload\n"):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(10)
            s.connect(str(sock_path))
            s.sendall(line)
            answer = json.loads(s.makefile().readline())
        assert answer["ok"] is False and answer["exit"] == 2, answer
        assert answer["message"].startswith(f"bad request on {sock_path}: "), answer
    assert world.daemon.poll() is None and Instance.state_path(world.instance).exists()


def test_a_reload_upgrades_to_the_object_the_config_names(world: World, tmp_path: Path) -> None:
    """`systemctl reload lbctl` (SIGHUP) upgrades when datapath.object names another object (here a
    build renamed as a user would keep two), and does nothing to the program when it names the one
    running."""
    from suites.variant import build_variant

    variant = tmp_path / "balancer-next.o"
    shutil.copy(build_variant(tmp_path), variant)
    for addr in REALS:
        world.start_server(addr)
    config = world.write_config(REALS, extra="")
    config.write_text(config.read_text().replace("[datapath]\n", f'[datapath]\nobject = "{OBJ}"\n', 1))
    mark = world.start_daemon(config)
    world.wait_running(mark)
    prog = world.prog_id()
    assert world.daemon is not None
    world.daemon.send_signal(signal.SIGHUP)
    world.wait_event("applied", mark, SETTLE_S, match=lambda r: r["trigger"] == "reload")
    assert world.prog_id() == prog and not any(r["event"] == "upgraded" for r in world.logs()[mark:])

    config.write_text(config.read_text().replace(f'object = "{OBJ}"', f'object = "{variant}"'))
    world.daemon.send_signal(signal.SIGHUP)
    upgraded = world.wait_event("upgraded", mark, SETTLE_S)
    assert (upgraded["trigger"], upgraded["object"], upgraded["previous"]) == ("reload", str(variant), str(OBJ))
    assert world.prog_id() != prog
    inst = Instance.open(world.instance)
    try:
        assert inst.state.object == str(variant)
    finally:
        inst.close()
