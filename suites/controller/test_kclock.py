"""test_kclock.py: the kernel's HZ and jiffies at boot, as balancer/kclock.py finds them for the datapath."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from balancer import kclock


@pytest.mark.parametrize(("hz", "initial"), [(100, 4294937296), (250, 4294892296), (300, 4294877296),
                                             (1000, 4294667296)])
def test_initial_jiffies_is_minus_300_seconds_in_32_bits(hz: int, initial: int) -> None:
    assert kclock.initial_jiffies(hz) == initial


def test_hz_from_a_kernel_config() -> None:
    text = "# CONFIG_HZ_100 is not set\nCONFIG_HZ_250=y\nCONFIG_HZ=250\nCONFIG_SCHED_HRTICK=y\n"
    assert kclock.hz_from_config(text) == 250
    assert kclock.hz_from_config("CONFIG_HZ_250=y\n") is None


def test_hz_from_timer_list_is_the_one_that_fits_the_clock() -> None:
    # 2852.78 s after boot at HZ 250: jiffies = INITIAL_JIFFIES + 713195
    text = "Timer List Version: v0.9\nHRTIMER_MAX_CLOCK_BASES: 8\nnow at 2852780857292 nsecs\n\n" \
           "cpu: 0\njiffies: 4295605491\n"
    assert kclock.hz_from_timer_list(text) == 250
    assert kclock.hz_from_timer_list("now at 5 nsecs\n") is None
    # a counter that fits no HZ: no answer rather than a guess
    assert kclock.hz_from_timer_list("now at 2852780857292 nsecs\njiffies: 17\n") is None


def test_this_kernels_tick_agrees_with_its_timer_list() -> None:
    tick = kclock.tick()
    text = Path("/proc/timer_list").read_text() if Path("/proc/timer_list").exists() else ""
    if tick is None or not text:
        pytest.skip("no HZ found on this kernel, or no /proc/timer_list to hold it against")
    now = int(re.search(r"^now at (\d+) nsecs", text, re.MULTILINE).group(1))  # type: ignore[union-attr]
    jiffies = int(re.search(r"^jiffies: (\d+)", text, re.MULTILINE).group(1))  # type: ignore[union-attr]
    assert tick.hz in kclock.HZ_CHOICES
    since_boot_ns = (jiffies - tick.jiffies_at_boot) * tick.ns_per_jiffy
    assert abs(since_boot_ns - now) < 1_000_000_000, (tick, jiffies, now)
    assert kclock.rodata() == {"cfg_jiffy_ns": tick.ns_per_jiffy, "cfg_jiffies_at_boot": tick.jiffies_at_boot}
