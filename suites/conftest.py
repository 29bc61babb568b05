"""Wiring of the suites: the l4lab plugin (lab.pytest_plugin: labs, balancers, hardware mode, --lab-keep)
and the encap modes every lab test runs over.

    pytestmark = pytest.mark.topology("default")

    def test_dsr(lab, balancer, encap):
        lab.run("client", ["curl", ...])
"""

from __future__ import annotations

import pytest

from balancer.encaps import SAME_FAMILY, EncapCase, by_id


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
