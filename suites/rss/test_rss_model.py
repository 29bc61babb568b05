"""The RSS model (lab/rss/toeplitz.py): Toeplitz against published vectors, indirection, spread statistics."""

from __future__ import annotations

import ipaddress
import math
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lab.rss.toeplitz import (
    MICROSOFT_KEY,
    RETA_SIZE,
    Flow,
    Toeplitz,
    chi2_sf,
    flow_input,
    hash_flows,
    indirection_table,
    inputs_v4,
    nic_input,
    predict_queues,
    queues_of,
    spread,
    toeplitz,
)

# Microsoft, "Verifying the RSS Hash Calculation" (learn.microsoft.com/windows-hardware/drivers/
# network/verifying-the-rss-hash-calculation), with the key 6d5a56da…01fa; the same table is in
# Intel's 82599 datasheet, 7.1.2.8.3 "RSS Verification Suite".
# (source address, source port, destination address, destination port, hash "sd", hash "sdfn")
IPV4_VECTORS = [
    ("66.9.149.187", 2794, "161.142.100.80", 1766, 0x323E8FC2, 0x51CCC178),
    ("199.92.111.2", 14230, "65.69.140.83", 4739, 0xD718262A, 0xC626B0EA),
    ("24.19.198.95", 12898, "12.22.207.184", 38024, 0xD2D0A5DE, 0x5C2B394A),
    ("38.27.205.30", 48228, "209.142.163.6", 2217, 0x82989176, 0xAFC7327F),
    ("153.39.163.191", 44251, "202.188.127.2", 1303, 0x5D1809C5, 0x10E828A2),
]
IPV6_VECTORS = [
    ("3ffe:2501:200:1fff::7", 2794, "3ffe:2501:200:3::1", 1766, 0x2CC18CD5, 0x40207D3D),
    ("3ffe:501:8::260:97ff:fe40:efab", 14230, "ff02::1", 4739, 0x0F0C461C, 0xDDE51BBF),
    ("3ffe:1900:4545:3:200:f8ff:fe21:67cf", 44251, "fe80::200:f8ff:fe21:67cf", 38024, 0x4B61E985, 0x02D1FEEF),
]
VECTORS = IPV4_VECTORS + IPV6_VECTORS


def test_key_is_microsofts() -> None:
    assert (
        MICROSOFT_KEY.hex()
        == "6d5a56da255b0ec24167253d43a38fb0d0ca2bcbae7b30b477cb2da38030f20c6a42b73bbeac01fa"
    )


@pytest.mark.parametrize(("src", "sport", "dst", "dport", "sd", "sdfn"), VECTORS, ids=[v[0] for v in VECTORS])
def test_published_vectors_one_by_one(src: str, sport: int, dst: str, dport: int, sd: int, sdfn: int) -> None:
    flow = Flow(src, dst, sport, dport)
    assert toeplitz(flow_input(flow, "sd")) == sd
    assert toeplitz(flow_input(flow, "sdfn")) == sdfn
    hasher = Toeplitz()
    assert hasher.hash_bytes(flow_input(flow, "sd")) == sd
    assert hasher.hash_bytes(flow_input(flow, "sdfn")) == sdfn


@pytest.mark.parametrize(("src", "sport", "dst", "dport", "sd", "sdfn"), VECTORS, ids=[v[0] for v in VECTORS])
def test_nic_input_of_frames_hashes_outer_headers_as_a_nic(src: str, sport: int, dst: str, dport: int, sd: int,
                                                           sdfn: int) -> None:
    """UDP is hashed on ports under sdfn only; a tunnel (IPIP, 6in6) on its outer addresses always."""
    from scapy.layers.inet import IP, UDP
    from scapy.layers.inet6 import IPv6
    from scapy.layers.l2 import Dot1Q, Ether

    outer = IPv6(src=src, dst=dst) if ":" in src else IP(src=src, dst=dst)
    inner = IP(src="192.0.2.2", dst="198.51.100.100") / UDP(sport=40000, dport=9000)
    udp = bytes(Ether() / outer / UDP(sport=sport, dport=dport) / inner)
    tunnel = bytes(Ether() / outer / inner)
    tagged = bytes(Ether() / Dot1Q(vlan=7) / outer / UDP(sport=sport, dport=dport))
    hasher = Toeplitz()
    assert hasher.hash_bytes(nic_input(udp, "sdfn")) == sdfn
    assert hasher.hash_bytes(nic_input(tagged, "sdfn")) == sdfn
    assert hasher.hash_bytes(nic_input(udp, "sd")) == sd
    assert hasher.hash_bytes(nic_input(tunnel, "sdfn")) == sd
    with pytest.raises(ValueError, match="ethertype 0x0806 is neither IPv4 nor IPv6"):
        nic_input(bytes(Ether(type=0x0806)) + bytes(28), "sd")


def test_published_vectors_vectorised_and_mixed_families() -> None:
    flows = [Flow(s, d, sp, dp) for s, sp, d, dp, _, _ in VECTORS]
    assert hash_flows(flows, "sd").tolist() == [v[4] for v in VECTORS]
    assert hash_flows(flows, "sdfn").tolist() == [v[5] for v in VECTORS]


def test_ipv4_fast_path_matches_published_vectors() -> None:
    src = [int(ipaddress.IPv4Address(v[0])) for v in IPV4_VECTORS]
    dst = [int(ipaddress.IPv4Address(v[2])) for v in IPV4_VECTORS]
    sport = [v[1] for v in IPV4_VECTORS]
    dport = [v[3] for v in IPV4_VECTORS]
    hasher = Toeplitz()
    assert hasher.hash(inputs_v4(src, dst, sport, dport, "sdfn")).tolist() == [v[5] for v in IPV4_VECTORS]
    assert hasher.hash(inputs_v4(src, dst, fields="sd")).tolist() == [v[4] for v in IPV4_VECTORS]


@settings(max_examples=200, deadline=None)
@given(
    data=st.binary(min_size=0, max_size=36),
    key=st.one_of(st.just(MICROSOFT_KEY), st.binary(min_size=40, max_size=52)),
)
def test_table_method_equals_bit_by_bit_definition(data: bytes, key: bytes) -> None:
    assert Toeplitz(key).hash_bytes(data) == toeplitz(data, key)


def test_ipv4_fast_path_equals_parsed_flows() -> None:
    rng = np.random.default_rng(3)
    src = rng.integers(0, 2**32, 500)
    dst = rng.integers(0, 2**32, 500)
    sport = rng.integers(0, 65536, 500)
    dport = rng.integers(0, 65536, 500)
    flows = [
        Flow(str(ipaddress.IPv4Address(int(s))), str(ipaddress.IPv4Address(int(d))), int(a), int(b))
        for s, d, a, b in zip(src, dst, sport, dport, strict=True)
    ]
    for fields in ("sd", "sdfn"):
        fast = Toeplitz().hash(inputs_v4(src, dst, sport, dport, fields))
        assert np.array_equal(fast, hash_flows(flows, fields))


def test_indirection_table_is_round_robin_and_indexed_by_low_bits() -> None:
    table = indirection_table(6)
    assert table.size == RETA_SIZE
    assert table[:8].tolist() == [0, 1, 2, 3, 4, 5, 0, 1]
    assert queues_of([0, 5, 6, 127, 128, 129, 0xFFFFFFFF], table).tolist() == [0, 5, 0, 1, 0, 1, 1]
    custom = np.zeros(RETA_SIZE, dtype=np.uint32)
    custom[1] = 3
    assert queues_of([1, 129, 2], custom).tolist() == [3, 3, 0]


def test_predict_queues_uses_hash_and_table() -> None:
    flow = Flow("66.9.149.187", "161.142.100.80", 2794, 1766)
    assert predict_queues([flow], 16).tolist() == [0x51CCC178 % 128 % 16]
    assert predict_queues([flow], 16, "sd").tolist() == [0x323E8FC2 % 128 % 16]


# ------------------------------------------------------------------------------- what suites ask


def test_fixed_outer_addresses_collapse_onto_one_queue() -> None:
    """IPIP with a fixed outer source: the NIC hashes addresses only, every flow hits one queue."""
    flows = [Flow("198.51.100.128", "203.0.113.18") for _ in range(5000)]
    s = spread(predict_queues(flows, 8, "sd"), 8)
    assert s.max_over_mean == 8.0
    assert s.p_value < 1e-12


def test_flow_derived_outer_sources_spread_over_queues() -> None:
    """IPIP with outer sources drawn from a /25: the NIC sees 128 sources and spreads them."""
    rng = np.random.default_rng(11)
    base = (198 << 24) | (51 << 16) | (100 << 8) | 128
    src = base + rng.integers(0, 128, 20000)
    dst = (203 << 24) | (0 << 16) | (113 << 8) | 18
    queues = queues_of(Toeplitz().hash(inputs_v4(src, dst, fields="sd")), indirection_table(8))
    s = spread(queues, 8)
    print(f"\n/25 outer sources over 8 queues: {s}")
    assert s.max_over_mean < 1.5
    assert min(s.counts) > 0


def test_gue_source_port_spreads_only_when_ports_are_hashed() -> None:
    rng = np.random.default_rng(5)
    sport = rng.integers(32768, 65536, 20000)
    src, dst = 0xC6336480, 0xCB007112
    hasher = Toeplitz()
    sd = spread(queues_of(hasher.hash(inputs_v4(src, dst, sport, 6080, "sd")), indirection_table(8)), 8)
    sdfn = spread(queues_of(hasher.hash(inputs_v4(src, dst, sport, 6080, "sdfn")), indirection_table(8)), 8)
    print(
        f"\nGUE fixed source, sd: {sd.max_over_mean:.2f}; "
        f"sdfn: {sdfn.max_over_mean:.2f} (p={sdfn.p_value:.3f})"
    )
    assert sd.max_over_mean == 8.0
    assert sdfn.max_over_mean < 1.1 and sdfn.p_value > 1e-4


# ----------------------------------------------------------------------------------- statistics


def test_spread_of_a_perfect_and_a_collapsed_assignment() -> None:
    even = spread(np.arange(800) % 8, 8)
    assert (even.max_over_mean, even.chi2, even.p_value) == (1.0, 0.0, 1.0)
    assert even.counts == (100,) * 8
    one = spread(np.zeros(800, dtype=int), 8)
    assert one.max_over_mean == 8.0 and one.chi2 == pytest.approx(5600.0) and one.p_value < 1e-300
    assert spread([0, 0], 1).p_value == 1.0
    assert set(even.as_dict()) == {"max_over_mean", "chi2", "p_value", "counts"}


@pytest.mark.parametrize(
    ("x", "dof", "p"),
    [
        # upper 5 % and 1 % critical values of the chi-square distribution (standard tables)
        (3.841459, 1, 0.05),
        (6.634897, 1, 0.01),
        (14.06714, 7, 0.05),
        (18.47531, 7, 0.01),
        (24.99579, 15, 0.05),
        (154.3015, 127, 0.05),
        (2.732637, 8, 0.95),
        (0.0, 3, 1.0),
    ],
)
def test_chi2_sf_against_tables(x: float, dof: int, p: float) -> None:
    assert chi2_sf(x, dof) == pytest.approx(p, rel=2e-5, abs=1e-12)


@pytest.mark.parametrize("x", [0.01, 0.5, 1.0, 2.0, 3.0, 10.0, 50.0, 700.0])
def test_chi2_sf_closed_forms(x: float) -> None:
    # dof 2: exp(-x/2); dof 1: erfc(sqrt(x/2)); dof 4: exp(-x/2) (1 + x/2)
    assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-10, abs=1e-300)
    assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-9, abs=1e-300)
    assert chi2_sf(x, 4) == pytest.approx(math.exp(-x / 2) * (1 + x / 2), rel=1e-10, abs=1e-300)


# ---------------------------------------------------------------------------------------- errors


def test_errors_name_the_problem() -> None:
    with pytest.raises(
        ValueError, match=r"^inputs of 37 bytes are longer than this 40-byte key can hash \(36\)"
    ):
        Toeplitz().hash(np.zeros((1, 37), dtype=np.uint8))
    with pytest.raises(ValueError, match=r"^flow 10\.0\.0\.1 -> 2001:db8::1 mixes IPv4 and IPv6"):
        flow_input(Flow("10.0.0.1", "2001:db8::1"))
    with pytest.raises(ValueError, match=r'^fields must be "sd" or "sdfn" but got \'sdf\''):
        flow_input(Flow("10.0.0.1", "10.0.0.2"), "sdf")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^a NIC needs at least 1 receive queue but got 0"):
        indirection_table(0)
    with pytest.raises(ValueError, match=r"^the indirection table size must be a power of two but got 100"):
        indirection_table(4, 100)
    with pytest.raises(ValueError, match=r"^queue numbers must be 0\.\.3 but got 0\.\.4"):
        spread([0, 4], 4)
    with pytest.raises(ValueError, match=r"^cannot judge the spread of zero flows"):
        spread([], 4)


def test_hash_speed() -> None:
    """Prints the model's throughput; asserts only that every flow got a hash."""
    rng = np.random.default_rng(0)
    n = 100_000
    start = time.perf_counter()
    hashes = Toeplitz().hash(
        inputs_v4(rng.integers(0, 2**32, n), 0xC6336464, rng.integers(1024, 65536, n), 80)
    )
    elapsed = time.perf_counter() - start
    print(f"\nToeplitz model: {n} IPv4 sdfn flows in {elapsed * 1000:.1f} ms")
    assert hashes.shape == (n,)
