"""tidal's version, read from the installed package's metadata (written once, in pyproject),
and how it was built: compiled or pure Python."""

from __future__ import annotations

import functools
import importlib.util
from importlib.metadata import PackageNotFoundError, version

try:
    VERSION = version("tidal")
except PackageNotFoundError:  # pragma: no cover - run from a tree that was never installed
    VERSION = "unknown"


@functools.cache
def compiled() -> bool:
    """Whether the hot modules run compiled, as setup.py builds them where a C compiler is
    found (mypyc), rather than as pure Python: told by where one of them was loaded from."""
    spec = importlib.util.find_spec("tidal.server.core.tallies")
    origin = spec.origin if spec is not None else None
    return origin is not None and not origin.endswith(".py")


def build() -> str:
    return "compiled" if compiled() else "pure Python"
