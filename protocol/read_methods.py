"""The methods that only read: part of the method table (``methods``), which lists
them after the writes; kept apart for the table's length.
"""

from __future__ import annotations

from typing import Final

from . import read_schemas as r
from . import schemas as s
from .method import Method, Param

#: the param of every method about one user
USER: Final = Param("user_id", s.USER_ID, "the user")

READS: Final[tuple[Method, ...]] = (
    Method(
        "status",
        "Whether the user is Active or Left, and since when.",
        (USER,),
        s.MEMBERSHIP,
        "membership",
        route="user",
        examples=(([42], {"user_id": 42, "status": "active", "left_at_ns": None}),),
    ),
    Method(
        "cohorts",
        "The cohorts and their predicates; with page, a page of them.",
        (Param("page", r.COHORTS_PAGE, "after: a cohort name; limit", None),),
        {
            "oneOf": [
                r.COHORT_LIST,
                s.obj(
                    {"cohorts": r.COHORT_LIST, "more": s.nullable({"type": "string"})},
                    ("cohorts", "more"),
                ),
            ]
        },
        "cohorts",
        route="log",
    ),
    Method(
        "counts",
        "An entity's aggregates by kind: the ledger's, each cohort's and community's.",
        (
            Param("entity", s.ENTITY, "the entity"),
            Param("page", r.COUNTS_PAGE, "window, after, limit", None),
        ),
        r.AGGREGATES,
        "aggregates",
        route="log",
        examples=((["song-none"], {"ledger": {}, "cohorts": {}, "communities": {}}),),
    ),
    Method(
        "stats",
        "The server's figures: signals, users left, ledger rows, memory, ...",
        (),
        s.MAP,
        "figures",
    ),
    Method(
        "health",
        "Whether the server can do its job: ok, starting, standby or failing.",
        (),
        s.obj(
            {
                "status": {"enum": ["ok", "starting", "standby", "failing"]},
                "storage": {"type": "string"},
                "memory": {"enum": ["ok", "full"]},
                "serving": {"type": "string"},
                "error": {"type": "string"},
            },
            ("status", "storage"),
        ),
        "health",
        while_starting=True,
    ),
    Method(
        "history",
        "The user's leaves, rejoins, purges and erasures, oldest first.",
        (
            USER,
            Param("limit", r.HISTORY_LIMIT, "lines at most", 100),
            Param("after_ns", s.NS, "lines after this time", 0),
        ),
        s.array(r.HISTORY_LINE),
        "events",
        route="user",
        examples=(([42, 100, 0], []),),
    ),
    Method(
        "top",
        "The entities with the highest score in one aggregate: by count, weight or trend.",
        (
            Param("layer", r.LAYER, "ledger, cohort or community"),
            Param("name", s.nullable(s.NAME), "the cohort or community; nil for the ledger"),
            Param("kind", s.KIND, "the kind ranked"),
            Param("options", r.TOP_OPTIONS, "by, window, half_life, limit, after", {}),
        ),
        r.TOP,
        "ranking",
        route="log",
    ),
    Method(
        "catalog",
        "What is stored, a page at a time in name order: the ledger's kinds, the cohorts or"
        " the communities, each with its aggregates and the signals they count.",
        (
            Param("layer", r.LAYER, "ledger (its kinds), cohort or community"),
            Param("page", r.CATALOG_PAGE, "after: the next of the page before; limit", {}),
        ),
        r.CATALOG,
        "catalog",
        route="log",
        examples=((["community"], {"items": [], "next": None}),),
    ),
    Method(
        "left_users",
        "The Left users in user_id order, a page at a time.",
        (
            Param("after", r.AFTER_USER, "the next of the previous page", None),
            Param("limit", r.LEFT_LIMIT, "users at most", 1000),
        ),
        r.LEFT_USERS,
        "left users",
        examples=(([None, 1000], {"users": [], "next": None}),),
    ),
    Method(
        "count_left",
        "How many users are Left: every user's, on every node, as committed.",
        (),
        s.COUNT,
        "Left users",
        examples=(([], 0),),
    ),
    Method(
        "rpc.discover",
        "This server's OpenRPC document: every method, its params and result.",
        (),
        s.obj(
            {"openrpc": {"type": "string"}, "info": s.MAP, "methods": s.array(s.MAP)},
            ("openrpc", "info", "methods"),
            additionalProperties=True,
        ),
        "OpenRPC document",
        while_starting=True,
    ),
)
