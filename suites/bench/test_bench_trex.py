"""`l4lab bench --trex` on what can be real without TRex: the command line, and the LB side over real ssh.

There is no TRex server and no NIC here, so the LB is the default lab's `lb` namespace reached as a
target (lab.remote.target.for_netns_lab: ssh, with `sshd -i` started inside the namespace), with a [trex]
table pointing at a loopback port nobody listens on. Real here: the floor program held by
`lab.bench.floorhold` over ssh and the frames it counts, lbctl loaded, applied and unloaded over ssh, the
whole bench's phases against that LB with a stand-in generator, and the CLI failing on the
unreachable server and leaving the LB as it found it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.bench import cli as bench_cli
from lab.bench import model
from lab.bench.gen.base import Endpoints, Family, FrameSpec, Generator, Latency, TrialResult
from lab.bench.trex import BENCH_INSTANCE, FloorHold, LbHost, RemoteBalancer, bench_config, bench_trex, lb_host
from lab.harness import poll
from lab.remote.target import Target, for_netns_lab
from lab.remote.target import load as load_target
from reports.schema import BenchPayload, parse_result

pytestmark = pytest.mark.topology("default")

REPO = Path(__file__).resolve().parents[2]
PIN_DIR = f"/sys/fs/bpf/lbctl/{BENCH_INSTANCE}"
STATE_FILE = f"/run/lbctl/{BENCH_INSTANCE}.json"
TX_MAC, RX_MAC = "02:00:00:00:aa:01", "02:00:00:00:aa:02"
ETH_P_EXPERIMENTAL = 0x88B5  # IEEE local experimental EtherType: no stack on the LB answers it


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _trex_table(port: int, **override: str) -> str:
    keys = {"server": '"127.0.0.1"', "tx_port": "0", "rx_port": "1", "tx_mac": f'"{TX_MAC}"',
            "rx_mac": f'"{RX_MAC}"', "sync_port": str(port), "async_port": str(port), **override}
    return "\n[trex]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items() if v)


@pytest.fixture(scope="module")
def target(lab: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """Name: target. Scope: module. Depends: lab.

    The module's lab as an ssh target with a [trex] table at a loopback port nobody listens on::

        def test_x(target):
            target.run("lb", ["ip", "link"])
    """
    if Path(PIN_DIR).exists() or Path(STATE_FILE).exists():
        pytest.skip(f"lbctl instance '{BENCH_INSTANCE}' is loaded on this machine (a bench running here?); "
                    f"unload it with `lbctl --instance {BENCH_INSTANCE} unload` first")
    path = for_netns_lab(lab.name, "default", tmp_path_factory.mktemp("target"))
    with path.open("a") as out:
        out.write(_trex_table(_unused_port()))
    yield load_target(path)
    # Whatever a failed test left on the LB goes with the lab; the bench's instance is pinned outside it.
    if Path(STATE_FILE).exists():
        subprocess.run([sys.executable, "-m", "balancer.cli", "--instance", BENCH_INSTANCE, "unload"],
                       cwd=REPO, capture_output=True, check=False)


@pytest.fixture(scope="module")
def lb(target: Target) -> LbHost:
    """Name: lb. Scope: module. Depends: target. The bench's view of the target's LB node::

        def test_x(lb):
            assert lb.ifname == "lb-rt"
    """
    return lb_host(target)


def _xdp(target: Target) -> dict[str, Any] | None:
    """The XDP attachment of the LB's lb-rt as `ip -j link show` reports it over ssh (None: nothing)."""
    (link,) = json.loads(target.run("lb", ["ip", "-j", "link", "show", "dev", "lb-rt"]).stdout)
    xdp: dict[str, Any] | None = link.get("xdp")
    return xdp


def _exists(target: Target, path: str) -> bool:
    return target.run("lb", ["test", "-e", path], check=False).returncode == 0


def _assert_lb_clean(target: Target) -> None:
    assert _xdp(target) is None, "an XDP program is still attached to lb-rt"
    assert not _exists(target, PIN_DIR), f"{PIN_DIR} is still pinned"
    assert not _exists(target, STATE_FILE), f"{STATE_FILE} is still there"


class RouterSender:
    """Frames into the LB's link from the router's side of it, through a raw socket opened in the router's namespace."""

    def __init__(self, lab: Any) -> None:
        from lab.nsexec import entered

        with entered(lab.netns("router")):
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
            self.sock.bind(("rt-lb", 0))
        self.src = self.sock.getsockname()[4]

    def send(self, dst_mac: str, frames: int) -> None:
        frame = bytes.fromhex(dst_mac.replace(":", "")) + self.src + ETH_P_EXPERIMENTAL.to_bytes(2, "big") + bytes(46)
        for _ in range(frames):
            self.sock.send(frame)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def sender(lab: Any) -> Iterator[RouterSender]:
    """Name: sender. Scope: function. Depends: lab. A raw socket on the router's rt-lb::

        def test_x(sender, lb):
            sender.send(lb.mac, 100)
    """
    s = RouterSender(lab)
    try:
        yield s
    finally:
        s.close()


# --- the command line ------------------------------------------------------------------------------


LB_NODE = '[nodes.lb]\nssh = "lb"\n'


def _target_file(tmp_path: Path, trex: str = "", nodes: str = LB_NODE) -> Path:
    path = tmp_path / "target.toml"
    path.write_text(f'name = "t"\ntopology = "default"\n\n{nodes}{trex}')
    return path


@pytest.mark.parametrize(("trex", "nodes", "message"), [
    ("", LB_NODE, "trex is missing: `l4lab bench --trex` needs a [trex] table"),
    (_trex_table(4501, tx_mac=""), LB_NODE, "trex.tx_mac must be the MAC address of TRex port 0"),
    (_trex_table(4501, rx_mac=""), LB_NODE, "trex.rx_mac must be the MAC address of TRex port 1"),
    (_trex_table(4501), '[nodes.router]\nssh = "router"\n', "nodes has no node of role lb"),
    (_trex_table(4501), LB_NODE, "[nodes.lb] needs repo = PATH (an l4lab checkout there)"),
], ids=["no-trex", "no-tx-mac", "no-rx-mac", "no-lb-node", "no-repo"])
def test_a_target_the_bench_cannot_use_exits_2_naming_file_and_key(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], trex: str, nodes: str, message: str) -> None:
    path = _target_file(tmp_path, trex, nodes)
    assert bench_cli.main(["--trex", str(path), "--quick", "--results", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"l4lab bench: {path}: ") and message in err, err
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["--max-rate-mpps", "0"], "--max-rate-mpps must be a rate above 0.01 and at most 1000 Mpps but got 0"),
    (["--max-rate-mpps", "-3"], "--max-rate-mpps must be a rate above 0.01"),
    (["--max-rate-mpps", "nan"], "--max-rate-mpps must be a rate above 0.01"),
    (["--max-rate-mpps", "fast"], "argument --max-rate-mpps: invalid float value: 'fast'"),
    (["--parts", "micro"], "with --trex only ndr runs"),
    (["--encap", "ip4-vxlan"], "argument --encap: invalid choice"),
    (["--flows", "0"], "--flows must be 1.."),
])
def test_bad_options_with_trex_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                      message: str) -> None:
    path = _target_file(tmp_path, _trex_table(4501))
    assert bench_cli.main(["--trex", str(path), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_target_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert bench_cli.main(["--trex", str(tmp_path / "nope.toml")]) == 2
    assert f"target file {tmp_path / 'nope.toml'} does not exist" in capsys.readouterr().err


# --- lab.bench.floorhold over ssh ------------------------------------------------------------------------


@pytest.mark.parametrize("program", ["xdp_drop", "xdp_tx_swap"])
def test_floorhold_attaches_counts_real_frames_and_detaches_at_end_of_input(
        target: Target, lb: LbHost, sender: RouterSender, program: str) -> None:
    assert _xdp(target) is None
    hold = FloorHold(lb, program)
    try:
        xdp = _xdp(target)
        assert xdp is not None and xdp["prog"]["name"] == program, xdp
        assert xdp["mode"] == 1, "native (driver) mode, as the bench asks"
        # The link may carry a stray frame of the router's own (an IPv6 report) at any time: ask again
        # until one burst is counted alone; every burst is counted in full.
        deltas = []
        for frames in (200, 300, 400):
            before = hold.count()
            sender.send(lb.mac, frames)
            deltas.append(hold.count() - before - frames)
            if deltas[-1] == 0:
                break
        assert deltas[-1] == 0 and min(deltas) >= 0, f"counted minus sent per burst: {deltas}"
    finally:
        hold.release()  # closes its input: it detaches and exits 0, or this raises
    assert _xdp(target) is None


def test_floorhold_refuses_a_second_program_with_one_line(target: Target, lb: LbHost) -> None:
    first = FloorHold(lb, "xdp_drop")
    try:
        with pytest.raises(Exception, match=r"cannot attach the xdp_tx_swap floor on lb-rt of lb: "
                                            r"cannot attach XDP program 'xdp_tx_swap' to 'lb-rt'.*"
                                            r"\(exit status 1\)$") as caught:
            FloorHold(lb, "xdp_tx_swap")
        assert "\n" not in str(caught.value)
        assert _xdp(target)["prog"]["name"] == "xdp_drop"  # type: ignore[index]
    finally:
        first.release()
    assert _xdp(target) is None


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_floorhold_detaches_on_a_signal(lab: Any, target: Target, signum: int) -> None:
    from lab.nsexec import nsenter_argv

    argv = nsenter_argv(lab.netns("lb"), [sys.executable, "-m", "lab.bench.floorhold", "--interface", "lb-rt",
                                          "--program", "xdp_drop"])
    proc = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "attached"
        assert _xdp(target) is not None
        proc.send_signal(signum)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
    assert _xdp(target) is None


# --- the balancer over ssh -------------------------------------------------------------------------


def _nexthop_mac(target: Target) -> str:
    """The next-hop MAC in the running datapath's settings map (bpftool, over ssh)."""
    out = target.run("lb", ["bpftool", "-j", "map", "dump", "pinned", f"{PIN_DIR}/lb_settings"]).stdout
    (entry,) = json.loads(out)
    return ":".join(f"{b:02x}" for b in entry["formatted"]["value"]["nexthop_mac"])


def test_remote_balancer_loads_applies_every_encap_and_unloads_clean(target: Target, lb: LbHost) -> None:
    assert target.trex is not None
    balancer = RemoteBalancer(lb)
    try:
        balancer.load(bench_config("ip4-ipip", lb, target.trex))
        config_path = balancer.config_path
        assert config_path is not None and _exists(target, config_path)
        for case, c in model.ENCAPS.items():
            balancer.apply(bench_config(case, lb, target.trex))
            status = balancer.status()
            assert status["interfaces"] == {"lb-rt": "native"}
            vip = model.VIP4 if c.vip_family == 4 else f"[{model.VIP6}]"
            (entry,) = status["vips"]
            assert (entry["vip"], entry["encap"]) == (f"{vip}:{model.VIP_PORT}/udp", c.config_name), (case, entry)
            assert len(entry["reals"]) == 4
            assert _nexthop_mac(target) == RX_MAC, case
        assert _xdp(target)["prog"]["name"] == "balancer_xdp"  # type: ignore[index]
    finally:
        balancer.unload()
        balancer.remove_config()
    _assert_lb_clean(target)
    assert not _exists(target, config_path)


# --- the whole bench with a stand-in generator ------------------------------------------------------


class StandIn(Generator):
    """In place of TRex: claims every frame of the rate came back, and sends a real burst into the LB.

    What it claims stands for TRex's rx port; the burst of BURST frames to the LB's MAC is all that
    really reaches the LB, so the XDP_DROP floor, which must count on the LB, sees a loss of
    1 − BURST / sent. Every trial records which program the LB had attached."""

    BURST = 100

    def __init__(self, lab: Any, endpoints: Endpoints, rx_port: int, latency: bool) -> None:
        self.lab = lab
        self.endpoints = endpoints
        self.rx_port = rx_port
        self.latency = latency
        self.sender = RouterSender(lab)
        self.trials: list[tuple[str, float, int]] = []  # (program on lb-rt, rate, frames claimed sent)

    def run(self, rate_pps: float, duration_s: float, frame_size: FrameSpec, flows: int,
            family: Family) -> TrialResult:
        (link,) = json.loads(self.lab.run("lb", ["ip", "-j", "link", "show", "dev", "lb-rt"]).stdout)
        sent = round(rate_pps * duration_s)
        self.trials.append((link.get("xdp", {}).get("prog", {}).get("name", ""), rate_pps, sent))
        self.sender.send(self.endpoints.dst_mac, self.BURST)
        us = 5 + 20 * rate_pps / 1e6
        return TrialResult(sent, sent, sent, duration_s, Latency(us / 2, us, us * 3) if self.latency else None)

    def close(self) -> None:
        self.sender.close()


def test_bench_runs_every_phase_on_the_lb_and_writes_a_trex_result(
        lab: Any, target: Target, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    made: list[tuple[int, bool, StandIn]] = []

    def make(endpoints: Endpoints, rx_port: int, latency: bool) -> Generator:
        made.append((rx_port, latency, StandIn(lab, endpoints, rx_port, latency)))
        return made[-1][2]

    opts = model.Options(encaps=("ip4-ipip", "ip6-gue1"), sizes=(64,), parts=("ndr",), results=tmp_path,
                         quick=True, max_rate_pps=1e6, max_rate_given=True, trex=target.path,
                         result_id="test_bench_trex")
    try:
        report = bench_trex(opts, make=make)
    finally:
        _assert_lb_clean(target)
    out = capsys.readouterr().out
    assert f"TRex 127.0.0.1 port 0 → LB lb (lb) lb-rt {lb_host(target).mac}, MTU 1500, 10 Gb/s → TRex port 1" in out
    # One generator per phase: the drop floor (counted on the LB), the XDP_TX floor counted on the
    # tx port (the MAC swap returns frames to it), the encaps counted on the rx port with latency.
    assert [(rx, lat) for rx, lat, _ in made] == [(1, False), (0, False), (1, True)]
    assert all(g.endpoints == Endpoints(src_mac=TX_MAC, dst_mac=lb_host(target).mac, dst4=model.VIP4,
                                        dst6=model.VIP6, dport=model.VIP_PORT) for _, _, g in made)
    assert {p for p, _, _ in made[0][2].trials} == {"xdp_drop"}
    assert {p for p, _, _ in made[1][2].trials} == {"xdp_tx_swap"}
    assert {p for p, _, _ in made[2][2].trials} == {"balancer_xdp"}
    # The XDP_DROP floor's trials received only what reached the LB: the bursts, not the claims.
    drop = report.ndr[("xdp_drop", "64")].result
    for trial, (_, _, sent) in zip(drop.trials, made[0][2].trials, strict=True):
        assert math.isclose(trial.loss, 1 - StandIn.BURST / sent, abs_tol=3 / sent), (trial, sent)
    assert drop.ndr_pps == 0

    assert report.results_file is not None and report.results_file.parent == tmp_path
    result = parse_result(json.loads(report.results_file.read_text()), report.results_file)
    assert result.id == "test_bench_trex[quick]"
    payload = result.payload
    assert isinstance(payload, BenchPayload)
    assert (payload.generator, payload.egress_mtu) == ("trex", 1500)
    # The LB's NIC as `ethtool -i` names it over ssh (a veth here: no PCI bus, so no lspci model).
    assert payload.nic is not None and (payload.nic.driver, payload.nic.model) == ("veth", "unknown")
    assert [(p.encap, p.frame_size) for p in payload.points] == [("ip4-ipip", 64), ("ip6-gue1", 64)]
    for point in payload.points:
        assert point.ndr_mpps == pytest.approx(1.0) and point.trials[0].rate_mpps == pytest.approx(1.0)
        assert point.floor.xdp_tx_mpps == pytest.approx(1.0) and point.floor.xdp_drop_mpps == 0.0
        assert [f.share_of_pdr for f in point.latency] == [10, 50, 90]
        assert [f.rate_mpps for f in point.latency] == pytest.approx([0.1, 0.5, 0.9])
        assert all(f.min_us < f.avg_us < f.max_us for f in point.latency)


# --- the command line against an unreachable TRex server -------------------------------------------


def _bench_cli(target: Target, tmp_path: Path) -> list[str]:
    return [sys.executable, "-m", "lab.cli", "bench", "--trex", str(target.path), "--quick", "--encap", "ip4-ipip",
            "--results", str(tmp_path / "results")]


def test_unreachable_trex_exits_1_naming_the_server_and_leaves_the_lb_clean(target: Target,
                                                                             tmp_path: Path) -> None:
    assert target.trex is not None
    done = subprocess.run(_bench_cli(target, tmp_path), cwd=REPO, capture_output=True, text=True, timeout=180,
                          check=False)
    assert done.returncode == 1, done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()  # one line: no clean-up failed
    assert line.startswith("l4lab bench: cannot use the TRex server at 127.0.0.1 "
                           f"(sync port {target.trex.sync_port})"), line
    assert "start `./t-rex-64 -i` there" in line
    assert "NDR/PDR search" in done.stdout  # it got as far as the first floor
    _assert_lb_clean(target)
    assert not (tmp_path / "results").exists()


def test_sigterm_during_the_bench_leaves_the_lb_clean(target: Target, tmp_path: Path) -> None:
    proc = subprocess.Popen(_bench_cli(target, tmp_path), cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        def attached() -> bool:  # the XDP_DROP floor is held while the client tries to connect
            if _xdp(target) is not None:
                return True
            assert proc.poll() is None, "the bench never attached the floor"
            return False

        poll(60.0, attached, "the bench's floor attached")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    assert err.strip().splitlines()[-1] == "l4lab bench: interrupted (what the bench had set up is removed)"
    _assert_lb_clean(target)
