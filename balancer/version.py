"""version.py: the version both commands print (`lbctl --version`, `l4lab --version`)."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    """The installed l4lab distribution's version ("unknown" when run from a tree never installed)."""
    try:
        return metadata.version("l4lab")
    except metadata.PackageNotFoundError:
        return "unknown"
