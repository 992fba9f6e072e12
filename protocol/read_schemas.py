"""The shapes of what the reads take and answer (``read_methods``), as JSON Schema: the
rest of ``schemas``, whose docstring says how MessagePack maps onto it.
"""

from __future__ import annotations

from typing import Final

from .limits import COUNTS_LIMIT, INT64_MAX, MAX_HISTORY, MAX_LEFT_USERS
from .schemas import (
    BIN,
    COUNT,
    KIND,
    LAYERS,
    NAME,
    NS,
    PREDICATE,
    RANK_BY,
    USER_ID,
    WINDOW_ALIASES,
    WINDOWS,
    Schema,
    array,
    nullable,
    obj,
)

HISTORY_LINE: Final[Schema] = obj(
    {
        "event": {"enum": ["leave", "rejoin", "purge", "erase"]},
        "at_ns": NS,
        "signals": nullable(COUNT),
    },
    ("event", "at_ns", "signals"),
)
LEFT_USERS: Final[Schema] = obj(
    {"users": array(array({"type": "integer", "minimum": 0}, 2, 2)), "next": nullable(USER_ID)},
    ("users", "next"),
)
#: where a ``counts`` page ends (its ``more``), given back as the next one's ``after``:
#: [layer, key, kind], the ledger's key "", a cohort's its id, a community's its name
SLOT_CURSOR: Final[Schema] = {
    "oneOf": [
        {
            "type": "array",
            "items": [{"enum": [0, 2]}, {"anyOf": [{"const": ""}, NAME]}, KIND],
            "minItems": 3,
            "maxItems": 3,
        },
        {
            "type": "array",
            "items": [{"const": 1}, {"type": "integer", "minimum": 0, "maximum": INT64_MAX}, KIND],
            "minItems": 3,
            "maxItems": 3,
        },
    ],
    "description": "[layer, key, kind]: a counts reply's more",
}
TALLY: Final[Schema] = obj({"count": COUNT, "weight": {"type": "number"}}, ("count", "weight"))
BY_KIND: Final[Schema] = {"type": "object", "additionalProperties": TALLY}
BY_NAME: Final[Schema] = {"type": "object", "additionalProperties": BY_KIND}
AGGREGATES: Final[Schema] = obj(
    {
        "ledger": BY_KIND,
        "cohorts": BY_NAME,
        "communities": BY_NAME,
        "more": SLOT_CURSOR,
    },
    ("ledger", "cohorts", "communities"),
)
COUNTS_PAGE: Final[Schema] = {
    **obj(
        {
            "window": {"enum": [*WINDOWS, *WINDOW_ALIASES]},
            "after": SLOT_CURSOR,
            "limit": {
                "type": "integer",
                "minimum": 1,
                "maximum": COUNTS_LIMIT,
                "description": "at most what a reply fits: this at the default"
                " --max-message-size, (size - 1024) / 256 at another",
            },
        }
    ),
    "description": "window, and the page (after: a reply's more; limit: aggregates a page)",
}
COHORTS_PAGE: Final[Schema] = obj(
    {"after": NAME, "limit": {"type": "integer", "minimum": 1, "maximum": 1000}}
)
COHORT_LIST: Final[Schema] = {"type": "object", "additionalProperties": PREDICATE}
TOP_OPTIONS: Final[Schema] = obj(
    {
        "by": {"enum": list(RANK_BY)},
        "window": {"enum": [*WINDOWS, *WINDOW_ALIASES]},
        "half_life": {"type": "string", "description": "like 30m, 6h, 1d: one the server keeps"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
        "after": {**BIN, "description": "the next of the previous page"},
    }
)
TOP: Final[Schema] = obj(
    {
        "entities": array(
            obj(
                {
                    "entity": {"type": "string"},
                    "count": COUNT,
                    "weight": {"type": "number"},
                    "score": {"type": "number"},
                },
                ("entity", "count", "weight", "score"),
            )
        ),
        "next": nullable(BIN),
        "as_of_ns": NS,
    },
    ("entities", "next", "as_of_ns"),
)
#: the layers, by name, as ``top`` and ``catalog`` take them
LAYER: Final[Schema] = {"enum": list(LAYERS)}
CATALOG_PAGE: Final[Schema] = obj(
    {
        "after": {**NAME, "description": "the next of the previous page"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
    }
)
CATALOG: Final[Schema] = obj(
    {
        "items": array(
            obj(
                {"name": {"type": "string"}, "aggregates": COUNT, "count": COUNT},
                ("name", "aggregates", "count"),
            )
        ),
        "next": nullable({"type": "string"}),
    },
    ("items", "next"),
)
HISTORY_LIMIT: Final[Schema] = {"type": "integer", "minimum": 1, "maximum": MAX_HISTORY}
LEFT_LIMIT: Final[Schema] = {"type": "integer", "minimum": 1, "maximum": MAX_LEFT_USERS}
AFTER_USER: Final[Schema] = nullable(USER_ID)
