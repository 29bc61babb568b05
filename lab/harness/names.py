"""names.py: unique names for what a test makes on this shared machine (labs, namespaces, instances)."""

from __future__ import annotations

import secrets

# The prefixes in use, one per kind of thing a suite builds, so a stray leftover says who made it.
CONFORMANCE = "cf"  # the `lab` fixture's labs
LAB_SUITE = "lbt"  # labs built by suites/lab
VM = "vmt"  # namespaces holding a test VM's tap


_MADE: set[str] = set()


def unique_name(prefix: str, nbytes: int = 3, sep: str = "-") -> str:
    """`<prefix><sep>` and 2*nbytes random hex digits: unique enough for one machine's tests, short
    enough that `<name>-<node>` and interface names stay within 15 characters. The name is
    remembered, so that the session's leak check looks only at what this process named::

        unique_name("cf")  # 'cf-3fa9c1'
    """
    name = f"{prefix}{sep}{secrets.token_hex(nbytes)}"
    _MADE.add(name)
    return name


def made_here(entry: str) -> bool:
    """Whether `entry` (a lab, instance or pin directory name) is, or is derived from, a name this
    process made (`<name>` or `<name>-<anything>`)."""
    return any(entry == name or entry.startswith(name + "-") for name in _MADE)
