"""Per-queue NIC counters (`ethtool -S`) for RSS spread on hardware: the parser and a real veth."""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from balancer.libbpf import BpfObject
from lab.errors import LabError
from lab.harness import unique_name
from lab.nsexec import entered
from lab.rss.nic import (
    ONE_QUEUE,
    SPREAD,
    UNEVEN,
    counts_spread,
    decode_batch,
    deltas,
    flow_hash_fields,
    observe_queues,
    parse_rss,
    queue_counters,
    read_queue_counters,
    spread_verdict,
)
from lab.rss.toeplitz import MICROSOFT_KEY

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


# `ethtool -x eth0` of the nic-rss topology's VM real (virtio-net, 4 queues, key set at boot)
ETHTOOL_X = ("RX flow hash indirection table for eth0 with 4 RX ring(s):\n"
             + "".join(f"  {i:>3}:      0     1     2     3     0     1     2     3\n" for i in range(0, 128, 8))
             + "RSS hash key:\n" + ":".join(f"{b:02x}" for b in MICROSOFT_KEY) + "\n"
             "RSS hash function:\n    toeplitz: on\n    xor: off\n    crc32: off\n")
ETHTOOL_N_SDFN = ("UDP over IPV4 flows use these fields for computing Hash flow key:\nIP SA\nIP DA\n"
                  "L4 bytes 0 & 1 [TCP/UDP src port]\nL4 bytes 2 & 3 [TCP/UDP dst port]\n")


def test_rss_settings_from_ethtool_x() -> None:
    rss = parse_rss(ETHTOOL_X)
    assert rss.key == MICROSOFT_KEY and rss.function == "toeplitz" and rss.queues == 4
    assert rss.table == tuple(i % 4 for i in range(128))
    with pytest.raises(LabError, match="no indirection table"):
        parse_rss("Cannot get RX ring count: Operation not supported\n")


def test_flow_hash_fields_from_ethtool_n() -> None:
    assert flow_hash_fields(ETHTOOL_N_SDFN) == "sdfn"
    assert flow_hash_fields(ETHTOOL_N_SDFN.split("L4")[0]) == "sd"
    with pytest.raises(LabError, match="names no hashed field"):
        flow_hash_fields("rxclass: Cannot get RX class rule count\n")


def test_spread_verdict() -> None:
    assert spread_verdict([0, 0, 24, 0]) == ONE_QUEUE
    assert spread_verdict([6, 5, 7, 6]) == SPREAD
    assert spread_verdict([20, 1, 1, 2]) == UNEVEN  # every queue used, but p < 0.001
    assert spread_verdict([12, 12, 0, 0]) == UNEVEN


def test_decode_batch_names_each_flows_queue() -> None:
    # flows 0..3 sent 1, 2, 4, 8 packets: queue 0 got flows 0 and 3, queue 2 flow 1, queue 3 flow 2
    assert decode_batch([9, 0, 2, 4], 4) == [0, 2, 3, 0]
    assert decode_batch([0, 30], 4, repeat=2) == [1, 1, 1, 1]
    with pytest.raises(ValueError, match="add up to 14, not the 15 sent"):
        decode_batch([9, 0, 1, 4], 4)
    with pytest.raises(ValueError, match="went to several queues"):
        decode_batch([3, 3], 2, repeat=2)


class _Nic:
    """Per-queue counters that a send moves as a fixed flow-to-queue map says, plus scripted strays."""

    def __init__(self, queue_of: dict[int, int], strays: list[int]) -> None:
        self.queue_of = queue_of
        self.strays = strays  # for the n-th send: a stray packet on this queue (-1: none)
        self.counts = {q: 0 for q in range(4)}
        self.sends = 0

    def send(self, batch: list[tuple[int, int]]) -> None:
        for flow, count in batch:
            self.counts[self.queue_of[flow]] += count
        stray = self.strays[self.sends] if self.sends < len(self.strays) else -1
        if stray >= 0:
            self.counts[stray] += 1
        self.sends += 1

    def counters(self) -> dict[int, int]:
        return dict(self.counts)


def test_observe_queues_resends_a_batch_that_counted_a_stray_packet() -> None:
    queue_of = {f: (f * 7) % 4 for f in range(10)}
    nic = _Nic(queue_of, strays=[-1, 0, -1, -1])  # the second batch's first send sees an ARP on queue 0
    record: list[list[int]] = []
    got = observe_queues(list(range(10)), nic.send, nic.counters, batch=4, record=record)  # type: ignore[arg-type]
    assert got == [queue_of[f] for f in range(10)]
    # batch 2 over-counted: it is resent together with batch 1 (whose late packet it might have been)
    assert nic.sends == 5 and len(record) == 5 and sum(record[1]) == 16


def test_observe_queues_gives_up_naming_the_deltas() -> None:
    nic = _Nic({0: 1}, strays=[2] * 10)
    with pytest.raises(LabError, match=r"did not add up .* other traffic on the NIC"):
        observe_queues([0], nic.send, nic.counters, attempts=3)  # type: ignore[arg-type]


@pytest.fixture
def veth_pair() -> Iterator[str]:
    """Name: veth_pair. Scope: function. Depends: root.

    Netns `nic-XXXXXX` (va, 192.0.2.1) joined by a 2-queue veth to `nic-XXXXXX-b` (vb, 192.0.2.2)::

        def test_x(veth_pair):
            read_queue_counters("vb", veth_pair + "-b")
    """
    if os.geteuid() != 0:
        pytest.skip("needs root")
    ns = unique_name("nic")
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
