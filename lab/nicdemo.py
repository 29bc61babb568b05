"""nicdemo.py: how an actual NIC spreads each encap's flows over its receive queues, on a lab of its own.

`nic_spread()` builds the nic-rss topology (its real is a qemu VM with a 4-queue virtio-net whose
RSS qemu computes, proven on at boot), loads the balancer, and for every encap, outer source
(fixed or per flow) and `rx-flow-hash udp4|udp6 sd|sdfn` setting sends `flows` UDP flows (one
datagram each) from the client through the balancer, reading the real's per-queue counters
(`ethtool -S`) before and after. It returns the measured packets per queue and the verdict, then
removes the lab. suites/rss/test_nic_queues.py asserts the same NIC flow by flow against Toeplitz.

    python -m lab.nicdemo [--name NAME] [--flows N]
"""

from __future__ import annotations

import argparse
import contextlib
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from balancer import config as cfg
from balancer.encaps import SAME_FAMILY, by_id
from lab import netns, topology
from lab.errors import LabError
from lab.lbconf import balancer_config, lb_link, real_addresses
from lab.nsexec import entered, nsenter_argv
from lab.poll import poll
from lab.remote import vmnodes
from lab.rss.nic import deltas, flow_hash_fields, queue_counters, spread_verdict
from lab.state import netns_name, state_dir

REPO = Path(__file__).resolve().parent.parent
TOPOLOGY = "nic-rss"
REAL = "real1"
SETTINGS = [(outer_src, fields) for outer_src in ("fixed", "flow") for fields in ("sd", "sdfn")]
FIRST_PORT = 30000
ATTEMPTS = 3  # per setting, while a window counts more frames than flows


@dataclass(frozen=True)
class NicSpread:
    """Packets per receive queue of the real's NIC for one encap and setting, and what they show."""

    encap: str  # a case id of balancer/encaps.py
    outer_src: str  # fixed, flow
    fields: str  # the NIC's rx-flow-hash for udp4/udp6: sd, sdfn
    queue_counts: tuple[int, ...]
    flows: int
    verdict: str  # lab.rss.nic.spread_verdict: one queue, spread, uneven
    source: str = "nic:virtio"


def _lbctl(lab: str, *args: str) -> None:
    argv = [sys.executable, "-m", "balancer.cli", "--instance", f"{lab}-lb", *args]
    done = subprocess.run(nsenter_argv(netns_name(lab, "lb"), argv), capture_output=True, text=True,
                          timeout=120, cwd=REPO, check=False)
    if done.returncode != 0:
        raise LabError(f"lbctl {' '.join(args)} failed: {done.stderr.strip()}", command=" ".join(argv))


def _guest(lab: str, *argv: str) -> str:
    done = vmnodes.run(lab, REAL, list(argv))
    if done.returncode != 0:
        raise LabError(f"{' '.join(argv)} in VM real {REAL} failed: {done.stdout.strip()}", command=" ".join(argv))
    return done.stdout


def _wait_for(total: int, before: dict[int, int], read: Callable[[], dict[int, int]],
              timeout: float = 10.0) -> list[int]:
    """Per-queue deltas since `before` once they add up to `total` (or at the deadline)."""
    return poll(timeout, lambda: deltas(before, read()), f"{total} packets counted on the queues",
                until=lambda got: sum(got) >= total, check=False, interval_s=0.02)


def _settle(read: Callable[[], dict[int, int]], timeout: float = 5.0) -> None:
    """Return once two readings in a row are equal (or at the deadline)."""
    readings = [read()]

    def steady() -> bool:
        readings.append(read())
        return readings[-1] == readings[-2]

    poll(timeout, steady, "two equal readings in a row", check=False, interval_s=0.0)


def _send(lab: str, fam: int, sockets: contextlib.ExitStack, sport: int, vip: str, port: int) -> socket.socket:
    """One datagram from the client's port `sport` to the VIP, its socket kept open in `sockets`."""
    with entered(netns_name(lab, "client")):
        sock = sockets.enter_context(socket.socket(socket.AF_INET6 if fam == 6 else socket.AF_INET,
                                                   socket.SOCK_DGRAM))
    sock.bind(("::" if fam == 6 else "0.0.0.0", sport))
    sock.sendto(b"l4lab-nic-spread", (vip, port))
    return sock


def _await_echoes(socks: list[socket.socket], timeout: float = 3.0) -> None:
    """Return once every socket got the real's echo (its NIC has counted the datagram) or at the deadline."""
    waiting = list(socks)
    deadline = time.monotonic() + timeout
    while waiting and time.monotonic() < deadline:
        ready, _, _ = select.select(waiting, [], [], max(0.0, deadline - time.monotonic()))
        for sock in ready:
            sock.recv(2048)
            waiting.remove(sock)


def measure(lab: str, topo: topology.Topology, flows: int, work: Path,
            encaps: Sequence[str] = SAME_FAMILY) -> list[NicSpread]:
    """Every encap (of `encaps`) x setting on a running nic-rss lab with the balancer loaded as
    instance `<lab>-lb` (see the module)."""
    nic = topo.vm_link(REAL)[0].ifname
    results: list[NicSpread] = []
    index = 0
    for encap_id in encaps:
        case = by_id(encap_id)
        fam, mode = case.vip_family, case.config_name
        vip = next(str(v.address) for v in topo.vips if v.address.version == fam)
        port = next(p.port for v in topo.vips for p in v.ports if p.service == "udp-echo")
        proto = "udp4" if fam == 4 else "udp6"
        saved = flow_hash_fields(_guest(lab, "ethtool", "-n", nic, "rx-flow-hash", proto))
        weights = {n: int(n == REAL) for n in real_addresses(topo, fam)}

        def counters() -> dict[int, int]:
            return queue_counters(_guest(lab, "ethtool", "-S", nic))

        try:
            for i, (outer_src, fields) in enumerate(SETTINGS):
                if i == 0 or SETTINGS[i - 1][0] != outer_src:
                    conf = work / f"nic-{encap_id}-{outer_src}.toml"
                    conf.write_text(cfg.dump(balancer_config(topo, lab, encaps={fam: mode}, outer_src=outer_src,
                                                             weights=weights)))
                    _lbctl(lab, "apply", str(conf))
                if i == 0:
                    # One flow first, until the counters are still: neighbour resolution both ways on
                    # the real's link (and the reply's) is counted here, not below.
                    warm = counters()
                    with contextlib.ExitStack() as sockets:
                        _send(lab, fam, sockets, FIRST_PORT - 1 - index, vip, port)
                        _wait_for(1, warm, counters)
                        _settle(counters)
                _guest(lab, "ethtool", "-N", nic, "rx-flow-hash", proto, fields)
                for _attempt in range(ATTEMPTS):
                    before = counters()
                    with contextlib.ExitStack() as sockets:
                        # Each flow's socket stays open until counted: the real's reply must find it.
                        first = FIRST_PORT + index * flows
                        _await_echoes([_send(lab, fam, sockets, sport, vip, port)
                                       for sport in range(first, first + flows)])
                        _wait_for(flows, before, counters)
                        _settle(counters)
                        got = deltas(before, counters())
                    index += 1
                    if sum(got) == flows:
                        break
                    # More frames than flows: a neighbour probe (or other stray frame) reached the NIC
                    # inside the window and sits on some queue. Measured again on fresh ports.
                counts = tuple(got)
                results.append(NicSpread(encap_id, outer_src, fields, counts, flows, spread_verdict(counts)))
        finally:
            _guest(lab, "ethtool", "-N", nic, "rx-flow-hash", proto, saved)
    return results


def nic_spread(name: str = "l4nic", flows: int = 48) -> list[NicSpread]:
    """Build the nic-rss lab as `name`, measure every encap x setting, remove the lab (also on failure)."""
    topo = topology.load(TOPOLOGY)
    with contextlib.ExitStack() as stack:
        netns.build(topo, name)
        stack.callback(netns.teardown, name)
        _lbctl(name, "load", "--interface", lb_link(topo)[0], "--mode", "native")
        stack.callback(_lbctl_quiet, name, "unload")
        return measure(name, topo, flows, state_dir(name))


def _lbctl_quiet(lab: str, *args: str) -> None:
    with contextlib.suppress(LabError):
        _lbctl(lab, *args)


def table(results: list[NicSpread]) -> str:
    """The results as text: one line per encap x setting."""
    return "\n".join(f"  {r.encap:<11} {r.outer_src:<5} src, {r.fields:<4}  {list(r.queue_counts)!s:<22} {r.verdict}"
                     for r in results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.nicdemo", description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="l4nic", help="name of the nic-rss lab it builds and removes (default l4nic)")
    ap.add_argument("--flows", type=int, default=48,
                    help="UDP flows per encap and RSS setting, each from its own source port (default 48)")
    args = ap.parse_args(argv)
    started = time.monotonic()
    try:
        results = nic_spread(args.name, args.flows)
    except LabError as exc:
        print(f"nic spread: {exc}", file=sys.stderr)
        return 1
    print(f"NIC-measured RSS spread ({results[0].source}, {args.flows} flows each), "
          f"{time.monotonic() - started:.1f} s with the VM's boot:\n{table(results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
