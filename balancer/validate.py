"""validate.py: the checks every file format of l4lab shares — one reader for decoded TOML and JSON.

Four formats are read from decoded documents: the controller's TOML config (balancer/config.py),
lab topologies (lab/topology.py), target files (lab/remote/target.py) and results (reports/schema.py).
Each wraps a :class:`Reader` built with its own error factory, so each keeps its message form
(``lb.toml: vips[2].port must be 1..65535 but got 0``) while the checks themselves — a bool is
not an integer, a number must be finite, a key path reads ``vips[2].reals[0].address`` — are
written once, here. The module imports only the standard library: lab/ and reports/ use it
without the datapath's dependencies.

    r = Reader(lambda path, value, expected: MyError(f"{path} must be {expected} but got {value!r}"))
    port = r.integer(raw.get("port"), join("vips[0]", "port"), 1, 65535)
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

__all__ = ["Fail", "Reader", "Unknown", "join", "MAC_EXAMPLE"]

# (key path, value found, what was expected, phrased to follow "must be") -> the format's error
Fail = Callable[[str, object, str], Exception]
# (key path of the unknown key, its value, the known keys) -> the format's error
Unknown = Callable[[str, object, Sequence[str]], Exception]

MAC_EXAMPLE: Final = "02:00:00:00:00:01"
_MAC = re.compile(r"[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){5}")


def join(path: str, key: str) -> str:
    """The path of ``key`` inside ``path``: ``vips[2]`` + ``port`` = ``vips[2].port``; ``[0]`` appends."""
    if not key:
        return path
    if not path or key.startswith("["):
        return path + key
    return f"{path}.{key}"


def _absent_keys(fail: Fail) -> Unknown:
    def unknown(path: str, value: object, known: Sequence[str]) -> Exception:
        return fail(path, value, "absent (known keys: " + ", ".join(known) + ")")

    return unknown


class Reader:
    """Typed checks on values taken from a decoded document; every failure is ``fail(path, value, expected)``.

    Each check returns the value (converted where that is its job: an address, a network) or
    raises the format's error. ``expected`` overrides the default phrase, so a format keeps the
    wording its tests compare.
    """

    def __init__(self, fail: Fail, unknown: Unknown | None = None) -> None:
        self.fail = fail
        self._unknown = unknown or _absent_keys(fail)

    # -- shapes ---------------------------------------------------------------------------------

    def table(self, value: object, path: str, expected: str = "a table") -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(path, value, expected)
        return dict(value)

    def array(self, value: object, path: str, expected: str = "an array") -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(path, value, expected)
        return value

    def known_keys(self, raw: Mapping[str, Any], known: Sequence[str], path: str) -> None:
        """Refuse the first key of ``raw`` that is not in ``known`` (a misspelt key is an error)."""
        for key in raw:
            if key not in known:
                raise self._unknown(join(path, key), raw[key], known)

    # -- scalars --------------------------------------------------------------------------------

    def string(self, value: object, path: str, *, choices: Sequence[str] = (), empty: bool = True,
               expected: str = "") -> str:
        """A string (not empty unless ``empty``), one of ``choices`` when given (``one of 'a', 'b'``)."""
        if not expected:
            expected = "one of " + ", ".join(repr(c) for c in choices) if choices else \
                "a string" if empty else "a non-empty string"
        if not isinstance(value, str) or (choices and value not in choices) or (not empty and not value):
            raise self.fail(path, value, expected)
        return value

    def boolean(self, value: object, path: str, expected: str = "true or false") -> bool:
        if not isinstance(value, bool):
            raise self.fail(path, value, expected)
        return value

    def integer(self, value: object, path: str, lo: int | None = None, hi: int | None = None, *,
                expected: str = "", range_expected: str = "") -> int:
        """An integer (never a bool) in lo..hi; ``range_expected`` phrases a wrong value of the right type."""
        bounds = f" {lo}..{hi}" if lo is not None and hi is not None else ""
        expected = expected or f"an integer{bounds}"
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.fail(path, value, expected)
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise self.fail(path, value, range_expected or expected)
        return value

    def number(self, value: object, path: str, lo: float = -math.inf, hi: float = math.inf, *,
               expected: str = "a number", finite: str = "") -> float:
        """A finite int or float (never a bool) in lo..hi, as a float; ``finite`` phrases inf and nan."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(path, value, expected)
        if not math.isfinite(value):
            raise self.fail(path, value, finite or expected)
        if not lo <= value <= hi:
            raise self.fail(path, value, expected)
        return float(value)

    # -- addresses ------------------------------------------------------------------------------

    def address(self, value: object, path: str, expected: str = "an IPv4 or IPv6 address"
                ) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        if not isinstance(value, str):
            raise self.fail(path, value, expected)
        try:
            return ipaddress.ip_address(value)
        except ValueError as e:
            raise self.fail(path, value, expected) from e

    def network(self, value: object, path: str, *, version: int | None = None, strict: bool = True,
                expected: str = "a network like '198.51.100.128/25' with no host bits set"
                ) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
        """A prefix (of IP ``version`` when given); ``strict``: host bits set are an error too."""
        if not isinstance(value, str):
            raise self.fail(path, value, expected)
        try:
            net = ipaddress.ip_network(value, strict=strict)
        except ValueError as e:
            raise self.fail(path, value, expected) from e
        if version is not None and net.version != version:
            raise self.fail(path, value, expected)
        return net

    def interface(self, value: object, path: str,
                  expected: str = "an address with prefix length like '192.0.2.1/28'"
                  ) -> ipaddress.IPv4Interface | ipaddress.IPv6Interface:
        if not isinstance(value, str) or "/" not in value:
            raise self.fail(path, value, expected)
        try:
            return ipaddress.ip_interface(value)
        except ValueError as e:
            raise self.fail(path, value, expected) from e

    def mac(self, value: object, path: str, expected: str = f'a MAC address such as "{MAC_EXAMPLE}"') -> str:
        """Six colon-separated hex bytes, returned lower-case."""
        if not isinstance(value, str) or not _MAC.fullmatch(value):
            raise self.fail(path, value, expected)
        return value.lower()
