"""names.py: unique names for what a test makes on this shared machine (labs, namespaces, instances)."""

from __future__ import annotations

import secrets

# The prefixes in use, one per kind of thing a suite builds, so a stray leftover says who made it.
CONFORMANCE = "cf"  # the `lab` fixture's labs
LAB_SUITE = "lbt"  # labs built by suites/lab
VM = "vmt"  # namespaces holding a test VM's tap


def unique_name(prefix: str, nbytes: int = 3, sep: str = "-") -> str:
    """`<prefix><sep>` and 2*nbytes random hex digits: unique enough for one machine's tests, short
    enough that `<name>-<node>` and interface names stay within 15 characters::

        unique_name("cf")  # 'cf-3fa9c1'
    """
    return f"{prefix}{sep}{secrets.token_hex(nbytes)}"
