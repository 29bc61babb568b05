"""test_encaps.py: the encap catalogue (balancer/encaps.py) holds the facts its users read from it."""

from __future__ import annotations

import copy
import json
import pickle
import subprocess
import sys
from typing import get_args

import pytest

from balancer import _abi, config, encaps

# Bytes each stack adds, written out from the RFCs' header sizes: the catalogue computes them.
OVERHEADS = {
    "ip4-ipip": 20,     # IPv4
    "ip4-gue1": 28,     # IPv4 + UDP
    "ip4-gue0": 32,     # IPv4 + UDP + GUE variant 0 header
    "ip6-ip6ip6": 40,   # IPv6
    "ip6-gue1": 48,     # IPv6 + UDP
    "ip6-ip4ip6": 40,   # IPv6
}


@pytest.mark.parametrize("case", encaps.CASES)
def test_overhead_is_the_sum_of_the_outer_headers(case: encaps.EncapCase) -> None:
    assert case.overhead == OVERHEADS[case]


def test_ids_follow_one_rule_outer_stack_first() -> None:
    inner_names = {(4, 4): "ipip", (6, 6): "ip6ip6", (4, 6): "ip4ip6"}  # (VIP, outer) -> Linux's tunnel name
    for case in encaps.CASES:
        carried = case.config_name if case.gue else inner_names[(case.vip_family, case.outer_family)]
        assert case == f"ip{case.outer_family}-{carried}", case
    assert "ip4-ip4ip6" not in encaps.IDS, "4in6 is named outer first: ip6-ip4ip6"


def test_the_literal_type_lists_the_catalogue() -> None:
    assert get_args(encaps.EncapId) == encaps.IDS
    assert len(set(encaps.IDS)) == len(encaps.IDS)


def test_modes_are_the_abi_enum_and_the_config_names() -> None:
    assert {c.mode for c in encaps.CASES} == set(_abi.Encap), "every datapath mode has a case"
    assert get_args(encaps.ModeName) == tuple(m.name.lower() for m in _abi.Encap)
    assert {c.config_name for c in encaps.CASES} == set(get_args(config.EncapName))
    assert all(encaps.mode_of(c.config_name) is c.mode for c in encaps.CASES)
    assert all(_abi.Family(c.vip_family) and _abi.Family(c.outer_family) for c in encaps.CASES)
    with pytest.raises(ValueError, match="unknown encap 'vxlan': expected one of ipip, gue1, gue0"):
        encaps.mode_of("vxlan")


def test_a_case_is_its_id_everywhere() -> None:
    case = encaps.IP4_GUE0
    assert case == "ip4-gue0" and {"ip4-gue0": 1}[case] == 1 and f"{case} {case!r}" == "ip4-gue0 'ip4-gue0'"
    assert json.dumps({case: case}) == '{"ip4-gue0": "ip4-gue0"}'
    assert copy.deepcopy(case) is case and pickle.loads(pickle.dumps(case)) is case
    assert encaps.by_id("ip4-gue0") is case and type(case.id) is str
    with pytest.raises(AttributeError, match="read-only"):
        case.mode = _abi.Encap.IPIP  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown encap id 'ip4-ip4ip6': expected one of ip4-ipip, "):
        encaps.by_id("ip4-ip4ip6")


def test_same_family_is_every_case_but_4in6() -> None:
    same = tuple(c for c in encaps.CASES if c != encaps.IP6_IP4IP6)
    assert same == encaps.SAME_FAMILY


def test_importing_the_catalogue_loads_no_libbpf() -> None:
    code = "import sys, balancer.encaps; print(sorted(m for m in sys.modules if m.startswith('balancer')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['balancer', 'balancer._abi', 'balancer.encaps']"
