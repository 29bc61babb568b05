"""Fixtures of the lab suite: unique lab names that are always cleaned up, and a shared default lab."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from lab import netns, topology
from lab.harness import unique_name
from lab.state import LabState
from suites.lab.probes import bpf_available, remove_lab


@pytest.fixture
def lab_name() -> Iterator[str]:
    """A unique lab name (`lbt-` and six hex digits); whatever lab has it is removed afterwards.

    Name: lab_name
    Scope: function
    Depends: -

        def test_up(lab_name):
            netns.build(topology.load("default"), lab_name)
            assert probes.leftovers(lab_name)
    """
    name = unique_name("lbt")
    try:
        yield name
    finally:
        remove_lab(name)


@pytest.fixture
def lab_factory() -> Iterator[list[str]]:
    """A list to append further unique lab names to; every lab named in it is removed afterwards.

    Name: lab_factory
    Scope: function
    Depends: -

        def test_two(lab_factory):
            lab_factory.append(name := unique_name("lbt"))
            netns.build(topology.load("default"), name)
    """
    names: list[str] = []
    try:
        yield names
    finally:
        for name in names:
            remove_lab(name)


@pytest.fixture(scope="module")
def default_lab() -> Iterator[LabState]:
    """The default topology built once for a module (with BPF programs when they are available).

    Name: default_lab
    Scope: module
    Depends: -

        def test_reach(default_lab):
            ns = f"{default_lab.name}-client"
            assert probes.ping(ns, "203.0.113.18") is not None
    """
    if os.geteuid() != 0:
        pytest.skip("the lab needs root")
    name = unique_name("lbt")
    try:
        yield netns.build(topology.load("default"), name, programs=bpf_available() is None)
    finally:
        remove_lab(name)
