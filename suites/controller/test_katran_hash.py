"""The model of Katran's hashing (balancer/katran_hash.py) against Katran: its vectors, its fixtures, its ring code.

- Katran's vectors (../shared/conformance/katran/maglev_vectors.json): folly's hash of real addresses,
  Maglev permutations, whole rings (V1 and V2, with weights) and flow hashes.
- Katran's own fixtures (fixtures.json): every encapsulated TCP/UDP case of its default and GUE
  tables to a VIP that hashes in one of the modes we offer goes to the real the model names.
- Katran's control-plane ring code (katran::Vip and its Maglev V1 / V2, compiled from L4LAB_KATRAN_SRC
  by lab/dut/katran_ring.py) builds, slot for slot, every ring the model builds; without a checkout
  this one skips, saying so.

The datapath's side (l4lab's program against Katran's, flow by flow) is suites/datapath/test_katran_compatible.py.
"""

from __future__ import annotations

import ctypes
import hashlib
import ipaddress
import json
import random
from collections import Counter

import numpy as np
from scapy.layers.inet import TCP, UDP
from scapy.layers.l2 import Ether

from balancer import katran_hash, maglev
from lab.dut import katran_ring
from suites.corpus import corpus_file

RING = katran_hash.DEFAULT_RING_SIZE


def test_katran_compatible_model_reproduces_katrans_vectors() -> None:
    """folly's real hashes, the permutations, whole rings (V1, V2, weights) and flow hashes, as Katran's."""
    vectors = json.loads(corpus_file("maglev_vectors.json").read_text())
    hashes = {a: f"{katran_hash.real_hash(a):#018x}" for a in vectors["folly_ip_hash"]}
    assert hashes == vectors["folly_ip_hash"]
    perms = {a: dict(zip(("offset", "skip"), katran_hash.permutation(a), strict=True)) for a in vectors["permutations"]}
    assert perms == vectors["permutations"]
    for name, want in vectors["rings"].items():
        backends = [maglev.Backend(int(i), a, w)
                    for (i, a), w in zip(want["reals"].items(), want["weights"], strict=True)]
        ring = katran_hash.build_ring(backends, RING, want["func"])
        assert {str(k): v for k, v in maglev.slot_counts(ring).items()} == want["slot_counts"], name
        assert [int(x) for x in ring[:32]] == want["first_32"], name
        assert hashlib.sha256(ring.astype("<u4").tobytes()).hexdigest() == want["sha256_u32le"], name
    for f in vectors["flow_hash"]:
        got = katran_hash.flow_hash(f["src"], f["sport"], f["dport_in_flow_key"])
        assert (got, katran_hash.ring_slot(got)) == (f["jhash"], f["ring_pos"]), f
    print(f"\n{len(hashes)} real hashes, {len(perms)} permutations, {len(vectors['rings'])} rings, "
          f"{len(vectors['flow_hash'])} flow hashes: as Katran's")


# Katran's VIP flags that change hashing, and the katran hash each stands for (others: not ours to check).
HASH_OF_FLAGS = {flag: name for name, flag in katran_hash.KATRAN_FLAGS.items()}


def test_katran_compatible_model_picks_the_reals_katrans_fixtures_expect() -> None:
    """Katran's own tables (default and GUE builds): each encapsulated TCP/UDP case to a VIP of one of
    our hash modes goes, in Katran's expected output, to the real the model's hash and V1 ring name."""
    profile = json.loads(corpus_file("config.json").read_text())["profiles"]["tester_default"]
    vips = {(v["address"], v["port"], v["proto"]): v for v in profile["vips"]}
    compared: Counter[str] = Counter()
    for case in json.loads(corpus_file("fixtures.json").read_text()):
        if case["program"] != "balancer" or case["expected_action"] != "XDP_TX" or \
                case["config_profile"] != "tester_default" or case["group"] not in ("base(testFixtures)", "gue"):
            continue
        pkt = Ether(bytes.fromhex(case["input_hex"]))
        l3, l4 = pkt.payload, pkt.payload.payload
        if not isinstance(l4, TCP | UDP):
            continue  # ICMP: echo answered, errors steered (test_katran.py)
        proto = "tcp" if isinstance(l4, TCP) else "udp"
        vip = vips.get((l3.dst, l4.dport, proto)) or vips.get((l3.dst, 0, proto))
        if vip is None or vip["flags"] not in HASH_OF_FLAGS:
            continue  # QUIC server ids, UDP flow migration: not hashing modes
        reals = {r["real_index"]: r["address"] for r in vip["reals"]}
        ring = katran_hash.build_ring([maglev.Backend(r["real_index"], r["address"], r["weight"])
                                       for r in vip["reals"]], RING, "v1")
        fields = katran_hash.fields_of(HASH_OF_FLAGS[vip["flags"]], vip["port"])
        chosen = reals[int(ring[katran_hash.ring_slot(katran_hash.flow_hash(l3.src, l4.sport, l4.dport, fields))])]
        expected = Ether(bytes.fromhex(case["expected_output_hex"])).payload.dst
        assert ipaddress.ip_address(chosen) == ipaddress.ip_address(expected), \
            f"case {case['id']}: {case['description']}"
        compared[HASH_OF_FLAGS[vip["flags"]] + ("/any-port" if vip["port"] == 0 else "")] += 1
    print(f"\nKatran's fixtures: the model picked Katran's real in {sum(compared.values())} cases {dict(compared)}")
    assert sum(compared.values()) >= 20 and len(compared) >= 3, compared


def test_katran_compatible_rings_are_the_rings_katrans_code_builds(katran_ring_code: ctypes.CDLL) -> None:
    """Random real sets (IPv4, IPv6, mixed; weights 0 to 65535; several sizes), V1 and V2: slot for slot."""
    rng = random.Random(31)
    compared = 0
    for trial in range(60):
        n = rng.choice((1, 2, 3, 5, 16, 100))
        addrs = {str(ipaddress.ip_address(rng.getrandbits(32) if rng.random() < 0.5 else rng.getrandbits(128)))
                 for _ in range(n)}
        backends = [maglev.Backend(i + 1, a, rng.choice((0, 1, 1, 2, 3, 10, 100, 65535)))
                    for i, a in enumerate(sorted(addrs))]
        size = rng.choice((RING, RING, 257, 13))
        for kind in katran_hash.RING_KINDS:
            want = katran_ring.ring(katran_ring_code, backends, size, kind)
            got = katran_hash.build_ring(backends, size, kind)
            assert np.array_equal(got, want), (f"trial {trial} {kind} size {size}: {int(np.sum(got != want))} slots "
                                               f"differ for {[(b.address, b.weight) for b in backends]}")
            compared += 1
    print(f"\n{compared} rings (V1 and V2) as Katran's ring code builds them")
