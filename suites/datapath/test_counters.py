"""test_counters.py: per-VIP, per-real and per-reason counters (packets and bytes)."""

from __future__ import annotations

from . import packets as P
from .frames import decode_encap
from .rig import BalancerFactory


def test_vip_and_real_counters_count_packets_and_bytes(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory()
    frames = [P.tcp_to(P.VIP4, sport=48000 + i, flags="S") for i in range(10)]
    per_real: dict[str, tuple[int, int]] = {}
    for f in frames:
        real = str(decode_encap(b.run(f).out, P.GUE_PORT).outer.dst)
        n, nbytes = per_real.get(real, (0, 0))
        per_real[real] = (n + 1, nbytes + len(bytes(f)))
    assert b.dp.vip_stats(0) == (10, sum(len(bytes(f)) for f in frames))
    for real, expected in per_real.items():
        assert b.dp.real_stats(b.real_id(real)) == expected
    assert b.dp.vip_stats(1) == (0, 0), "other VIPs untouched"


def test_reason_counters_count_frame_bytes(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory()
    b.run(P.TCP4_NOT_VIP)
    b.run(P.TCP4_NOT_VIP)
    b.run(P.IP4_OPTIONS_TO_VIP)
    counters = b.dp.reason_counters()
    assert counters["PASS_NOT_VIP"] == (2, 2 * len(bytes(P.TCP4_NOT_VIP)))
    assert counters["DROP_IP_OPTIONS"] == (1, len(bytes(P.IP4_OPTIONS_TO_VIP)))
    assert sum(p for p, _ in counters.values()) == 3


def test_drops_do_not_touch_vip_counters(balancer_factory: BalancerFactory) -> None:
    b = balancer_factory()
    b.run(P.sized_tcp_to(P.VIP4, P.MTU, df=False))
    assert b.dp.vip_stats(0) == (0, 0)
