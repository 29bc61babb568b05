"""Conformance: the checks every DUT is graded on, and l4lab's extras; the DUT's pytest pieces are a plugin.

    @pytest.mark.needs(Capability.CONSISTENT_HASHING)
    def test_x(dut, dut_encap):
        dut.configure(dut_encap)

The `dut` fixtures, the `needs` marker, --dut and the four verdicts are lab/dut/pytest_plugin.py
(loaded by lab.pytest_plugin). A test here either takes `dut` or `dut_fleet` (a check: a row of
`l4lab conform`'s matrix, for every DUT) or says with `needs` which of l4lab's internals it uses
(an extra: run against l4lab only). One that does neither stops the collection: it would grade
l4lab while claiming nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lab.dut.pytest_plugin import graded
from lab.lbconf import real_addresses
from lab.nodes.tcp_services import Services

from ._echo import binds, kill_connections

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    unfit = [item.nodeid for item in items if item.path.is_relative_to(HERE) and not graded(item)]
    if unfit:
        raise pytest.UsageError("a conformance test must take `dut` (a check) or name the l4lab internals it "
                                "needs with @pytest.mark.needs (an extra; suites/conformance/conftest.py): "
                                + "; ".join(unfit[:5]))


@pytest.fixture(scope="module")
def echo_services(lab: Any) -> Iterator[Services]:
    """Name: echo_services. Scope: module. Depends: lab.

    The line echo on every real, on ECHO_PORT of every VIP address, pinned to CPU 0 (Katran's and
    l4lab's per-CPU state: veth runs XDP on the sender's CPU)::

        def test_x(echo_services): ChurnClient(lab, "client", vip, ECHO_PORT, ...)
    """
    with Services(lab, sorted(real_addresses(lab.topology, 4)), "echo", binds(lab), cpu=0) as services:
        yield services


@pytest.fixture
def echoes(lab: Any, echo_services: Services) -> Iterator[Services]:
    """Name: echoes. Scope: function. Depends: lab, echo_services.

    The echo, with no connection left from an earlier test on any real, before and after::

        def test_x(echoes): ...
    """
    kill_connections(lab)
    try:
        yield echo_services
    finally:
        kill_connections(lab)
