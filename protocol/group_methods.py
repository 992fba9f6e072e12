"""The consumer groups' methods: part of the method table (``methods``), kept apart for
the table's length. A group shares the change feed's work among its consumers, each
event to one, a user's events in order, each acknowledged once applied
(PROTOCOL.md, "Consumer groups")."""

from __future__ import annotations

from typing import Final

from . import group_schemas as g
from . import schemas as s
from .method import Method, Param

_GROUP: Final = Param("group", s.NAME, "the group's name")

GROUPS: Final[tuple[Method, ...]] = (
    Method(
        "group_create",
        "Makes a consumer group, durable: from an event id or the feed's end, with how"
        " long a delivery waits for its ack and how often it is tried.",
        (
            Param("name", s.NAME, "the group's name"),
            Param(
                "options",
                g.GROUP_OPTIONS,
                "from, ack_wait, max_deliveries, order (wait|skip), events",
                {},
            ),
        ),
        s.obj({"name": {"type": "string"}, "cursor": s.POSITION}, ("name", "cursor")),
        "the group",
        writes=True,
        route="groups",
    ),
    Method(
        "group_drop",
        "Drops a group: its consumers are closed, its cursor, pending events and dead"
        " letters forgotten (the receipts of opt-outs it acknowledged stay).",
        (Param("name", s.NAME, "the group's name"),),
        {"const": True},
        "dropped",
        writes=True,
        route="groups",
    ),
    Method(
        "group_reset",
        "Moves a group's cursor (from an event id, or the feed's end) and clears a loss it"
        " was told of: what it had out is forgotten, its dead letters kept.",
        (
            Param("name", s.NAME, "the group's name"),
            Param("options", g.RESET_OPTIONS, "from: an event id or 'end'", {}),
        ),
        s.obj({"cursor": s.POSITION}, ("cursor",)),
        "the cursor",
        writes=True,
        route="groups",
    ),
    Method(
        "groups",
        "Each group: its cursor and lag, pending and dead letters, consumers and settings.",
        (),
        s.array(g.GROUP),
        "groups",
        route="groups",
        examples=(([], []),),
    ),
    Method(
        "ack",
        "Acknowledges events delivered to this connection, applied: answered once durable.",
        (Param("ids", g.EVENT_IDS, "the events' ids"),),
        s.obj({"acked": s.COUNT, "cursor": s.POSITION}, ("acked", "cursor")),
        "acknowledged",
        writes=True,
        route="groups",
    ),
    Method(
        "nack",
        "Gives back events delivered to this connection: sent again (after delay), or"
        " straight to the dead letters (dead), with a reason.",
        (
            Param("ids", g.EVENT_IDS, "the events' ids"),
            Param("options", g.NACK_OPTIONS, "delay, dead, reason", {}),
        ),
        s.obj({"nacked": s.COUNT, "dead": s.COUNT}, ("nacked", "dead")),
        "given back",
        writes=True,
        route="groups",
    ),
    Method(
        "dead_letters",
        "A page of a group's dead letters, in id order, with the last reason given.",
        (_GROUP, Param("page", g.DEAD_PAGE, "after: an event id; limit", {})),
        s.obj(
            {"dead_letters": s.array(g.DEAD_LETTER), "more": s.nullable(g.EVENT_ID)},
            ("dead_letters", "more"),
        ),
        "dead letters",
        route="groups",
    ),
    Method(
        "redeliver",
        "Sends dead letters back to the group's consumers, their counts started afresh.",
        (_GROUP, Param("ids", g.EVENT_IDS, "the dead letters' ids")),
        s.obj({"redelivered": s.COUNT}, ("redelivered",)),
        "sent back",
        writes=True,
        route="groups",
    ),
    Method(
        "receipt",
        "The user's latest leave, purge and erase, and each group's word on them:"
        " acknowledged, pending, dead_letter, lost or skipped.",
        (Param("user_id", s.USER_ID, "the user"),),
        g.RECEIPT,
        "receipt",
        route="groups",
        examples=(([42], {"user_id": 42, "optouts": []}),),
    ),
    Method(
        "unconfirmed",
        "A page of users whose latest opt-out a group (one, or any) has not acknowledged.",
        (Param("options", g.UNCONFIRMED_OPTIONS, "group, older_than, after, limit", {}),),
        g.UNCONFIRMED,
        "unconfirmed",
        route="groups",
        examples=(([{}], {"users": [], "more": None}),),
    ),
)
