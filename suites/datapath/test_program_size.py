"""test_program_size.py: the balancer stays cheaper to verify than Katran's (issue 11's size target).

Verified instructions (bpf_prog_info.verified_insns) grow with every path the verifier walks, so a
small change inlined into a branchy function can double them (it did: 60k to 122k in two commits).
The budget is Katran's IPIP build, measured here by `l4lab bench --katran` (lab/bench/katran.py).
"""

from __future__ import annotations

import pytest

from lab.bench.proginfo import program_insns

from .rig import BalancerFactory

KATRAN_IPIP_VERIFIED = 107_965  # Katran's balancer_ingress, IPIP build, kernel 6.18 (issue 11)


@pytest.mark.parametrize("program", ["balancer_xdp", "balancer_xdp_frags"])
def test_the_verifier_walks_fewer_instructions_than_for_katran(balancer_factory: BalancerFactory,
                                                               program: str) -> None:
    b = balancer_factory(world=False)
    xlated, verified = program_insns(b.dp.programs[program])
    print(f"{program}: {verified} verified instructions ({xlated} xlated), Katran's IPIP build {KATRAN_IPIP_VERIFIED}")
    assert 0 < verified <= KATRAN_IPIP_VERIFIED
