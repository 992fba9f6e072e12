"""Validation at the edge, of the requests for a page (``counts``, ``cohorts``,
``catalog``): where a page starts and how long it is. The rules of ``params``, for
pages.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from tidal.protocol.limits import KIND_MAX_BYTES, NAME_MAX_BYTES
from tidal.protocol.refusals import InvalidParams
from tidal.protocol.schemas import LAYERS

from .params import describe, options, string, text

#: where a page of ``counts`` starts: after this aggregate (layer, key, kind)
Cursor: TypeAlias = tuple[int, int | str, str]


def page(value: object, method: str, keys: tuple[str, ...], most: int) -> dict[str, Any]:
    """A page request ``{"after": ..., "limit": n}``: the keys it holds, checked for shape
    here and for meaning by the method."""
    out = options(value, "page", method, keys)
    limit = out.get("limit")
    if "limit" in out and (type(limit) is not int or not 1 <= limit <= most):
        raise InvalidParams(f"page.limit: must be an integer in 1..{most}")
    return out


def layer(value: object, where: str) -> int:
    """A layer by name ("ledger", "cohort", "community"): its number."""
    value = string(value)
    if type(value) is not str or value not in LAYERS:
        raise InvalidParams(
            f"{where}: must be 'ledger', 'cohort' or 'community', got {describe(value)}"
        )
    return LAYERS.index(value)


def catalog_page(value: object) -> tuple[str | None, int]:
    """``catalog``'s page: (after, limit), limit 1..1000, 100 when not given."""
    page = options(value, "page", "catalog", ("after", "limit"))
    limit = page.get("limit", 100)
    if type(limit) is not int or not 1 <= limit <= 1000:
        raise InvalidParams(f"page.limit: must be an integer in 1..1000, got {describe(limit)}")
    after = page.get("after")
    return (None if after is None else text(after, "page.after", NAME_MAX_BYTES)), limit


def cursor(value: object) -> Cursor:
    """The ``more`` of a previous ``counts`` reply, given back."""
    where = "page.after"
    if type(value) is not list or len(value) != 3 or type(value[0]) is not int:
        raise InvalidParams(f"{where}: must be the 'more' of a previous counts reply")
    if value[0] not in (0, 1, 2):
        raise InvalidParams(f"{where}: must be the 'more' of a previous counts reply")
    layer, key, kind = value
    if layer == 1:
        if type(key) is not int or not 0 <= key < 2**63:  # a cohort id
            raise InvalidParams(f"{where}: must be the 'more' of a previous counts reply")
    else:
        key = text(key, f"{where}[1]", NAME_MAX_BYTES) if key != "" else ""
    return (layer, key, text(kind, f"{where}[2]", KIND_MAX_BYTES))
