"""Wiring of the suites: the l4lab plugin (lab.pytest_plugin: labs, balancers, hardware mode, --lab-keep)
and the encap modes every lab test runs over.

    pytestmark = pytest.mark.topology("default")

    def test_dsr(lab, balancer, encap):
        lab.run("client", ["curl", ...])
"""

from __future__ import annotations

import ctypes
import os

import pytest

from balancer.encaps import SAME_FAMILY, EncapCase, by_id
from lab.dut import katran, katran_ring


@pytest.fixture(params=SAME_FAMILY)
def encap(request: pytest.FixtureRequest) -> EncapCase:
    """Name: encap. Scope: function. Depends: -.

    Each case of balancer/encaps.py whose reals are reached in the VIP's family, in turn: a str equal
    to its id (the test id: ip4-ipip, ip4-gue1, ip4-gue0, ip6-ip6ip6, ip6-gue1) with the case's facts.
    `@pytest.mark.parametrize("encap", [IP4_IPIP], indirect=True)` picks cases::

        def test_x(balancer, encap):
            assert balancer.encap_id == encap and encap.overhead >= 20
    """
    case: EncapCase = by_id(request.param)  # indirect parametrize may pass the id as a plain str
    return case


@pytest.fixture(scope="session")
def katran_checkout() -> katran.Checkout:
    """Name: katran_checkout. Scope: session. Depends: $L4LAB_KATRAN_SRC.

    The user's Katran checkout (its BPF program and its ring code are built from it), or a skip that
    says how to get one::

        def test_x(katran_checkout):
            obj = katran.build(katran_checkout, "ipip")
    """
    if not os.environ.get(katran.ENV):
        pytest.skip(f"{katran.ENV} is not set, so Katran's own code cannot be asked: {katran.HOW_TO_GET}")
    return katran.Checkout.find(None)


@pytest.fixture(scope="session")
def katran_ring_code(katran_checkout: katran.Checkout, tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """Name: katran_ring_code. Scope: session. Depends: katran_checkout, clang++.

    Katran's control-plane ring builder compiled from the checkout (lab/dut/katran_ring.py)::

        ring = katran_ring.ring(katran_ring_code, backends, 65537, "v2")
    """
    return katran_ring.build(katran_checkout, tmp_path_factory.mktemp("katran-ring"))
