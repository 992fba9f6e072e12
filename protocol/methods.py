"""tidal's methods, each declared once, as data: the method table.

The server builds its dispatch, its arity checks and its cluster routing from it; the
CLI its ``tidal call`` checks and help; ``openrpc`` the document that ``rpc.discover``
serves to clients in any language. A method not here does not exist on the wire.
"""

from __future__ import annotations

from typing import Final

from . import schemas as s
from .group_methods import GROUPS
from .method import REQUIRED as REQUIRED
from .method import Method as Method
from .method import Param as Param
from .method import Route as Route
from .read_methods import READS
from .read_methods import USER as _USER

TABLE: Final[tuple[Method, ...]] = (
    Method(
        "auth",
        "Proves the connection's token; its first request when the server has one.",
        (Param("token", {"type": "string"}, "the server's --token"),),
        {"const": True},
        "authenticated",
        while_starting=True,
        examples=(([""], True),),
    ),
    Method(
        "ping",
        "Answers pong: the server reads and answers.",
        (),
        {"const": "pong"},
        "pong",
        while_starting=True,
        examples=(([], "pong"),),
    ),
    Method(
        "signal",
        "Records a signal in the ledger and, for an Active user, in every cohort it matches"
        " and community it names.",
        (
            _USER,
            Param("entity", s.ENTITY, "what the user acted on"),
            Param("kind", s.KIND, "what the user did: view, like, ..."),
            Param("weight", s.WEIGHT, "what it adds to weight sums", 1.0),
            Param("context", s.CONTEXT, "communities, attrs, id (idempotency), at_ns", {}),
        ),
        s.ACK,
        "acknowledgement",
        writes=True,
        route="user",
        examples=(
            (
                [42, "song-17", "view", 1.0, {"communities": ["jazz"]}],
                {"seq": 1, "forwarded": True},
            ),
        ),
    ),
    Method(
        "signal_batch",
        "Records 1..10,000 signals as one unit: all valid and committed together, or none.",
        (
            Param("signals", s.array(s.SIGNAL_ITEM, *s.BOUNDED_BATCH), "the signals"),
            Param(
                "options",
                s.obj({"ack": {"enum": ["full", "compact"]}}),
                "ack: full (a map per signal) or compact (one map)",
                {},
            ),
        ),
        {"oneOf": [s.array(s.ACK), s.COMPACT_ACK]},
        "acknowledgements",
        writes=True,
        route="user",
        examples=(
            (
                [[[42, "song-17", "view"], [7, "song-17", "like", 2.0]]],
                [{"seq": 2, "forwarded": True}, {"seq": 3, "forwarded": True}],
            ),
        ),
    ),
    Method(
        "partition_map",
        "Which node serves each partition of users (cluster mode).",
        (),
        s.PARTITION_MAP,
        "partition map",
        examples=(
            (
                [],
                {
                    "cluster": None,
                    "node": None,
                    "partitions": 1,
                    "hash": "fmix64",
                    "owners": [[None, 0]],
                },
            ),
        ),
    ),
    Method(
        "leave",
        "From now on the user's signals reach the ledger only; with purge, their past is"
        " withdrawn too.",
        (_USER, Param("options", s.LEAVE_OPTIONS, "purge: bool", {})),
        s.MEMBERSHIP,
        "membership",
        writes=True,
        route="user",
    ),
    Method(
        "rejoin",
        "The user's signals reach cohorts and communities again.",
        (_USER,),
        s.MEMBERSHIP,
        "membership",
        writes=True,
        route="user",
    ),
    Method(
        "purge",
        "Withdraws the user's past signals from every cohort and community aggregate.",
        (_USER,),
        s.PURGED,
        "purged",
        writes=True,
        route="user",
    ),
    Method(
        "erase",
        "Deletes the user's ledger rows and all they added, and leaves the user Left.",
        (_USER,),
        s.ERASED,
        "erased",
        writes=True,
        route="user",
    ),
    Method(
        "define_cohort",
        "Defines or replaces a cohort: the signals its predicate matches.",
        (Param("name", s.NAME, "the cohort"), Param("predicate", s.PREDICATE, "the rule")),
        {"const": True},
        "defined",
        writes=True,
        route="log",
        examples=((["germany", {"country": "DE"}], True),),
    ),
    Method(
        "drop_cohort",
        "Drops a cohort: true if it existed.",
        (Param("name", s.NAME, "the cohort"),),
        {"type": "boolean"},
        "existed",
        writes=True,
        route="log",
        examples=((["germany"], True),),
    ),
    Method(
        "subscribe",
        "Sends this connection the change feed's events, from an id or from now; with"
        " group, the share of a consumer group's events this connection is to acknowledge.",
        (
            Param(
                "options",
                s.SUBSCRIBE_OPTIONS,
                "from: an event id; events: their names; group: a consumer group",
                {},
            ),
        ),
        s.obj(
            {"last_id": s.POSITION, "group": {"type": "string"}, "cursor": s.POSITION},
            ("last_id",),
        ),
        "subscribed",
        route="log",
    ),
    Method(
        "unsubscribe",
        "Stops this connection's events: false if it had none.",
        (),
        {"type": "boolean"},
        "was subscribed",
        examples=(([], False),),
    ),
    *READS,
    *GROUPS,
)

BY_NAME: Final[dict[str, Method]] = {m.name: m for m in TABLE}
#: the names alone, for whatever must know them without the rest (metrics label only these)
METHODS: Final = frozenset(BY_NAME)
