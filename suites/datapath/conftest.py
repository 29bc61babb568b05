"""conftest.py: fixtures for the datapath packet tables: loaded balancer and decap (suites/datapath/rig.py).

Test runs execute on the caller's CPU and the session tables are per CPU, so every module runs
pinned to one CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from balancer.datapath import Datapath, Decap
from lab.harness import pinned_cpu

from . import packets as P
from .rig import (
    BALANCER_OBJ,
    DECAP_OBJ,
    RING_SIZE,
    BalancerFactory,
    ProgramPool,
    RunBalancer,
    require_datapath,
    standard_world,
)

# How the tables' balancers are loaded unless a test says otherwise (small maps: writes are instant).
LOAD_ARGS: dict[str, object] = {"max_vips": 16, "max_reals": 64, "ring_size": RING_SIZE, "lru_size": 1024,
                                "fallback_size": 1024}


@pytest.fixture(autouse=True, scope="module")
def _pinned() -> Iterator[int]:
    """Every datapath module runs on one CPU (lab.harness.pinned_cpu, as the plugin's one_cpu)."""
    with pinned_cpu() as cpu:
        yield cpu


@pytest.fixture(scope="session")
def _program_pool() -> Iterator[ProgramPool]:
    """Loaded balancers and decaps kept for the session, one list per set of load arguments (rig.ProgramPool)."""
    pool = ProgramPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def balancer_factory(_program_pool: ProgramPool) -> Iterator[BalancerFactory]:
    """Name: balancer_factory. Scope: function. Depends: root, build/bpf/balancer.o.

    Balancers in the state of a fresh load, configured unless told otherwise:
        b = balancer_factory(udp_timeout_s=0.000001)
        b.vip(P.VIP4, 80, "tcp", 0, P.REALS4)
        assert b.run(P.TCP4_SYN).verdict == "XDP_TX"
    A program loaded earlier in the session with the same load arguments is taken back with every
    map emptied (rig.ProgramPool): the kernel's verifier takes seconds per load and has nothing
    new to say the second time. `fresh=True` loads one from nothing, as before.
    """
    require_datapath()
    taken: list[Datapath] = []

    def make(configure: bool = True, world: bool | Callable[[RunBalancer], None] = True, fresh: bool = False,
             **load_args: object) -> RunBalancer:
        """`world`: True for standard_world, False for none, or a function that programs another."""
        args = {**LOAD_ARGS, **load_args}
        dp = _program_pool.take(Datapath.load, str(BALANCER_OBJ), args, fresh=fresh)
        taken.append(dp)
        b = RunBalancer(dp)
        if configure:
            b.settings()
        if world:
            (standard_world if world is True else world)(b)  # type: ignore[operator]
        return b

    yield make
    for dp in taken:
        _program_pool.give_back(dp)


@pytest.fixture(scope="module")
def run_balancer(_program_pool: ProgramPool) -> Iterator[RunBalancer]:
    """Name: run_balancer. Scope: module. Depends: root, build/bpf/balancer.o.

    One configured balancer program driven by test runs, with the standard VIPs, shared by a module's
    table rows (not the plugin's `balancer`, which is lbctl loaded in a lab); from the session's pool,
    in the state of a fresh load, like balancer_factory's:
        out = run_balancer.run(P.TCP4_SYN)
        assert out.reason == "TX_ENCAP"
    """
    require_datapath()
    dp = _program_pool.take(Datapath.load, str(BALANCER_OBJ), LOAD_ARGS)
    try:
        b = RunBalancer(dp)
        b.settings()
        standard_world(b)
        yield b
    finally:
        _program_pool.give_back(dp)


@pytest.fixture
def decap(_program_pool: ProgramPool) -> Iterator[Decap]:
    """Name: decap. Scope: function. Depends: root, build/bpf/decap.o.

    The real-server decap program, owning every real address of packets.py, in the state of a fresh
    load (from the session's pool, as balancer_factory's):
        verdict, out = decap.run_xdp(bytes(frame))
    """
    require_datapath()
    d = _program_pool.take(Decap.load, str(DECAP_OBJ), {"gue_port": P.GUE_PORT})
    try:
        for addr in P.REALS4 + P.REALS6:
            d.add_local(addr)
        yield d
    finally:
        _program_pool.give_back(d)
