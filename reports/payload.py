"""What every result kind's payload shares: the kinds, the field rules the validator applies, the encap and
frame-size types, and picking the results of one payload class."""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from balancer import encaps

if TYPE_CHECKING:
    from reports.schema import Result


#: Encapsulation ids, named outer to inner: the one name of a case everywhere (DESIGN decision 11),
#: read from the catalogue (balancer/encaps.py: pure data, loads no BPF).
ENCAP_IDS: tuple[str, ...] = encaps.IDS
EncapId = encaps.EncapId


#: The frame sizes a benchmark reports, in bytes of Ethernet frame without FCS, plus the IMIX mix.
FRAME_SIZES: tuple[int | str, ...] = (64, 128, 256, 512, 1024, 1280, 1518, "imix")
FrameSize = int | Literal["imix"]


#: Mean frame of the simple IMIX the generators send (lab/bench/gen/base.py IMIX: 28 × 64, 16 × 570 and
#: 4 × 1518 bytes per 48 frames), for rates in Gb/s; suites/reports checks it against lab/bench/gen/base.py.
IMIX_MEAN_FRAME_BYTES = (28 * 64 + 16 * 570 + 4 * 1518) / 48


class Kind(enum.StrEnum):
    """What a result measures; selects the payload class."""

    CONFORMANCE = "conformance"
    BENCH = "bench"
    RSS = "rss"
    PMTU = "pmtu"
    CHURN = "churn"
    FAILOVER = "failover"
    DEMO = "demo"
    CORPUS = "corpus"
    FUZZ = "fuzz"


# Field checks, attached as dataclass field metadata {"check": ...}: return a problem or None.
Check = Callable[[Any], "str | None"]


def at_least(low: float) -> Check:
    def check(value: Any) -> str | None:
        return None if value >= low else f"must be ≥ {low} but got {value!r}"

    return check


def between(low: float, high: float) -> Check:
    def check(value: Any) -> str | None:
        return None if low <= value <= high else f"must be {low}..{high} but got {value!r}"

    return check


def non_empty(value: Any) -> str | None:
    return None if len(value) > 0 else "must not be empty"


def is_frame_size(value: Any) -> str | None:
    if value == "imix" or 64 <= value <= 9018:
        return None
    return f'must be a frame size 64..9018 bytes or "imix" but got {value!r}'


def rule(check: Check) -> dict[str, Check]:
    """Field metadata that makes the validator apply ``check`` to the parsed value."""
    return {"check": check}


P = TypeVar("P")


def of_kind(results: list[Result], payload_class: type[P]) -> list[tuple[Result, P]]:
    """The results whose payload is a ``payload_class``, each with its payload typed."""
    return [(r, r.payload) for r in results if isinstance(r.payload, payload_class)]
