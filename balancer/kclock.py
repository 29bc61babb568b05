"""kclock.py: the kernel's tick (HZ), for the datapath's idle clock of UDP sessions.

The balancer reads session idle times from jiffies, which the verifier inlines as one load, instead
of calling bpf_ktime_get_coarse_ns() (bpf/include/session.h). It needs nanoseconds per jiffy and
the jiffies counter's value at boot, INITIAL_JIFFIES = (unsigned int)(-300 * HZ) in
include/linux/jiffies.h, so that (jiffies - INITIAL_JIFFIES) x ns-per-jiffy is the coarse monotonic
clock to within a tick or so. HZ is a build option, found here:

1. CONFIG_HZ in the kernel's config, /proc/config.gz or /boot/config-<release>;
2. else /proc/timer_list, which shows jiffies and the monotonic clock read together: the one HZ
   among the kernel's choices for which jiffies since boot match the clock.

When neither tells, tick() returns None and the datapath keeps the helper call (correct, slower).
"""

from __future__ import annotations

import gzip
import os
import re
from dataclasses import dataclass
from pathlib import Path

HZ_CHOICES = (100, 250, 300, 1000)  # kernel/Kconfig.hz
BOOT_OFFSET_S = 300                 # INITIAL_JIFFIES: jiffies wrap 5 minutes after boot on 32-bit
MATCH_WITHIN_S = 5.0                # jiffies since boot against the clock: a tolerance, not a bound


@dataclass(frozen=True)
class Tick:
    hz: int
    source: str  # where HZ was read

    @property
    def ns_per_jiffy(self) -> int:
        return 1_000_000_000 // self.hz

    @property
    def jiffies_at_boot(self) -> int:
        return initial_jiffies(self.hz)


def initial_jiffies(hz: int) -> int:
    """INITIAL_JIFFIES for this HZ: -300 * HZ as an unsigned 32-bit value, widened."""
    return (-BOOT_OFFSET_S * hz) & 0xFFFFFFFF


def hz_from_config(text: str) -> int | None:
    found = re.search(r"^CONFIG_HZ=(\d+)$", text, re.MULTILINE)
    return int(found.group(1)) if found else None


def hz_from_timer_list(text: str) -> int | None:
    """HZ from /proc/timer_list's first `now at N nsecs` and `jiffies: J` lines."""
    now = re.search(r"^now at (\d+) nsecs", text, re.MULTILINE)
    jiffies = re.search(r"^jiffies: (\d+)", text, re.MULTILINE)
    if not now or not jiffies:
        return None
    clock_s = int(now.group(1)) / 1e9
    fits = [hz for hz in HZ_CHOICES
            if abs((int(jiffies.group(1)) - initial_jiffies(hz)) / hz - clock_s) < MATCH_WITHIN_S]
    return fits[0] if len(fits) == 1 else None


def _read(path: Path) -> str | None:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", errors="replace") as f:
                return f.read()
        return path.read_text(errors="replace")
    except OSError:
        return None


def tick(release: str | None = None) -> Tick | None:
    """This kernel's HZ and where it was found, or None."""
    release = release or os.uname().release
    for path in (Path("/proc/config.gz"), Path(f"/boot/config-{release}")):
        text = _read(path)
        hz = hz_from_config(text) if text else None
        if hz:
            return Tick(hz, str(path))
    text = _read(Path("/proc/timer_list"))
    hz = hz_from_timer_list(text) if text else None
    return Tick(hz, "/proc/timer_list") if hz else None


def rodata() -> dict[str, int]:
    """The balancer's .rodata settings for its idle clock (bpf/include/maps.h); zeros when unknown."""
    t = tick()
    return {"cfg_jiffy_ns": t.ns_per_jiffy if t else 0, "cfg_jiffies_at_boot": t.jiffies_at_boot if t else 0}
