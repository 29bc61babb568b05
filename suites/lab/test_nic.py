"""Per-queue NIC counters (`ethtool -S`) for RSS spread on hardware: the parser and a real veth."""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from balancer.libbpf import BpfObject
from lab.nic import counts_spread, deltas, queue_counters, read_queue_counters
from lab.nsexec import entered

REPO = Path(__file__).resolve().parents[2]

SAMPLES = {
    "mlx5": ("NIC statistics:\n     rx_packets: 900\n     rx0_packets: 100\n     rx0_bytes: 6400\n"
             "     rx1_packets: 300\n     tx0_packets: 5\n     rx2_packets: 500\n", {0: 100, 1: 300, 2: 500}),
    "ixgbe": ("NIC statistics:\n     rx_packets: 30\n     rx_queue_0_packets: 10\n     rx_queue_0_bytes: 1\n"
              "     rx_queue_1_packets: 20\n     tx_queue_0_packets: 7\n", {0: 10, 1: 20}),
    "i40e": ("     rx-0.packets: 4\n     rx-0.bytes: 256\n     rx-1.packets: 6\n     tx-0.packets: 1\n", {0: 4, 1: 6}),
    "bnxt_en": ("     [0]: rx_ucast_packets: 11\n     [0]: rx_mcast_packets: 2\n     [1]: rx_ucast_packets: 13\n",
                {0: 11, 1: 13}),
    "ena": ("     queue_0_rx_cnt: 8\n     queue_0_tx_cnt: 1\n     queue_1_rx_cnt: 9\n", {0: 8, 1: 9}),
    "veth": ("     peer_ifindex: 2\n     rx_queue_0_xdp_packets: 3\n     rx_queue_1_xdp_packets: 4\n", {0: 3, 1: 4}),
    "unknown": ("     rx_packets: 5\n     tx_packets: 5\n", {}),
}


@pytest.mark.parametrize("driver", sorted(SAMPLES))
def test_queue_counters_of_each_driver_naming(driver: str) -> None:
    text, want = SAMPLES[driver]
    assert queue_counters(text) == want


def test_spread_of_counts() -> None:
    even = counts_spread([100, 100, 100, 100])
    assert even["max_over_mean"] == 1.0 and even["p_value"] > 0.99
    skew = counts_spread([400, 0, 0, 0])
    assert skew["max_over_mean"] == 4.0 and skew["p_value"] < 1e-6
    assert deltas({0: 5, 1: 7}, {0: 9, 1: 7, 2: 1}) == [4, 0, 1]


@pytest.fixture
def veth_pair() -> Iterator[str]:
    """Name: veth_pair. Scope: function. Depends: root.

    Netns `nic-XXXXXX` (va, 192.0.2.1) joined by a 2-queue veth to `nic-XXXXXX-b` (vb, 192.0.2.2)::

        def test_x(veth_pair):
            read_queue_counters("vb", veth_pair + "-b")
    """
    if os.geteuid() != 0:
        pytest.skip("needs root")
    ns = "nic-" + secrets.token_hex(3)
    peer = ns + "-b"
    for n in (ns, peer):
        subprocess.run(["ip", "netns", "add", n], check=True)
    try:
        for cmd in (["link", "add", "va", "numtxqueues", "2", "numrxqueues", "2", "type", "veth", "peer", "name",
                     "vb", "numtxqueues", "2", "numrxqueues", "2", "netns", peer],
                    ["addr", "add", "192.0.2.1/24", "dev", "va"], ["link", "set", "va", "up"]):
            subprocess.run(["ip", "-n", ns, *cmd], check=True)
        for cmd in (["addr", "add", "192.0.2.2/24", "dev", "vb"], ["link", "set", "vb", "up"]):
            subprocess.run(["ip", "-n", peer, *cmd], check=True)
        yield ns
    finally:
        for n in (ns, peer):
            subprocess.run(["ip", "netns", "del", n], check=False)


def test_counters_of_a_real_veth_count_every_packet(veth_pair: str) -> None:
    obj_path = REPO / "build" / "bpf" / "pass.o"
    if not obj_path.exists():
        pytest.skip("run make bpf")
    with BpfObject(str(obj_path)) as obj:
        obj.load()
        with entered(veth_pair + "-b"):
            link = obj.program("xdp_pass").attach_xdp(socket.if_nametoindex("vb"), "native", "vb")
        with entered(veth_pair):
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            before = read_queue_counters("vb", veth_pair + "-b")
            assert set(before) == {0, 1}
            with sock:
                for port in range(40000, 40200):
                    sock.sendto(b"x", ("192.0.2.2", port))
            after = read_queue_counters("vb", veth_pair + "-b")
        finally:
            link.close()
    got = deltas(before, after)
    assert sum(got) >= 200  # every datagram crossed vb's XDP path (plus any neighbour discovery)
    # veth picks the queue from the flow hash: 200 flows over 2 queues leave neither empty
    assert min(got) > 0, f"per-queue packets on vb: {got}"
