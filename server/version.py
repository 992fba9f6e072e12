"""tidal's version, read from the installed package's metadata: written once, in pyproject."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("tidal")
except PackageNotFoundError:  # pragma: no cover - run from a tree that was never installed
    VERSION = "unknown"
