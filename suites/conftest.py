"""Wiring of the suites: the l4lab plugin (lab.pytest_plugin: labs, balancers, hardware mode, --lab-keep)
and the encap modes every lab test runs over.

    pytestmark = pytest.mark.topology("default")

    def test_dsr(lab, balancer, encap):
        lab.run("client", ["curl", ...])
"""

from __future__ import annotations

import pytest

ENCAP_IDS = ("ip4-ipip", "ip4-gue1", "ip4-gue0", "ip6-ip6ip6", "ip6-gue1")


@pytest.fixture(params=ENCAP_IDS)
def encap(request: pytest.FixtureRequest) -> str:
    """Name: encap. Scope: function. Depends: -.

    Each encap id in turn (outer stack to inner): ip4-ipip, ip4-gue1, ip4-gue0, ip6-ip6ip6, ip6-gue1::

        def test_x(balancer, encap):
            assert balancer.encap_id == encap
    """
    return str(request.param)
