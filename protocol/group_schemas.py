"""The shapes of the consumer groups' params and replies (``group_methods``), in the
subset of JSON Schema the table uses (``schemas``)."""

from __future__ import annotations

from typing import Final

from .limits import FEED_EVENTS, INT64_MAX
from .schemas import (
    COUNT,
    FEED_EVENT,
    MAP,
    NAME,
    NS,
    POSITION,
    USER_ID,
    Schema,
    array,
    nullable,
    obj,
)

EVENT_ID: Final[Schema] = {"type": "integer", "minimum": 1, "maximum": INT64_MAX}


def duration(least: float, most: float, pattern: str) -> Schema:
    """Seconds as a number, or text such as 30s, 5m, 250ms (the text ``pattern`` declares
    is a part of what the server reads: a number and a unit s, m, h, d or ms)."""
    return {
        "oneOf": [
            {"type": "number", "minimum": least, "maximum": most},
            {"type": "string", "pattern": pattern},
        ],
        "description": f"seconds ({least:g}..{most:g}), or text such as 30s, 5m, 250ms",
    }


#: a delivery's wait for its ack: 1 ms to a day
ACK_WAIT: Final = duration(
    0.001, 86_400, r"^([1-9][0-9]{0,3}(\.[0-9]{1,3})?(ms|s)?|[1-9][0-9]?m|([1-9]|1[0-9])h|1d)$"
)
DELAY: Final = duration(0, 86_400, r"^[0-9]{1,4}(\.[0-9]{1,3})?(ms|s)?$")
OLDER_THAN: Final = duration(0, 315_360_000, r"^[0-9]{1,3}(\.[0-9]{1,3})?(ms|s|m|h|d)?$")
START: Final[Schema] = {
    "oneOf": [{"type": "integer", "minimum": 0, "maximum": INT64_MAX}, {"const": "end"}]
}
EVENT_IDS: Final[Schema] = {
    **array(EVENT_ID, 1, 1000),
    "uniqueItems": True,
    "description": "event ids, none twice",
}
GROUP_OPTIONS: Final[Schema] = obj(
    {
        "from": START,
        "ack_wait": ACK_WAIT,
        "max_deliveries": {"type": "integer", "minimum": 1, "maximum": 1000},
        "order": {"enum": ["wait", "skip"]},
        "events": array({"enum": list(FEED_EVENTS)}, 1),
    }
)
NACK_OPTIONS: Final[Schema] = obj(
    {
        "delay": DELAY,
        "dead": {"type": "boolean"},
        "reason": {"type": "string", "maxLength": 1024},
    }
)
RESET_OPTIONS: Final[Schema] = obj({"from": START})
DEAD_PAGE: Final[Schema] = obj(
    {
        "after": {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
        "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
    }
)
UNCONFIRMED_OPTIONS: Final[Schema] = obj(
    {
        "group": NAME,
        "older_than": OLDER_THAN,
        "after": USER_ID,
        "limit": {"type": "integer", "minimum": 1, "maximum": 1000},
    }
)

CONSUMER: Final[Schema] = obj(
    {"address": {"type": "string"}, "in_flight": COUNT}, ("address", "in_flight")
)
GROUP: Final[Schema] = obj(
    {
        "name": {"type": "string"},
        "cursor": POSITION,
        "last_id": POSITION,
        "lag_events": COUNT,
        "lag_seconds": {"type": "number", "minimum": 0},
        "pending": COUNT,
        "oldest_unacked_seconds": nullable({"type": "number", "minimum": 0}),
        "dead_letters": COUNT,
        "redelivered": COUNT,
        "acknowledged": COUNT,
        "lost": nullable(array(POSITION, 2, 2)),
        "consumers": array(CONSUMER),
        "settings": MAP,
    },
    (
        "name",
        "cursor",
        "last_id",
        "lag_events",
        "lag_seconds",
        "pending",
        "oldest_unacked_seconds",
        "dead_letters",
        "lost",
        "consumers",
        "settings",
    ),
)
DEAD_LETTER: Final[Schema] = obj(
    {
        "id": EVENT_ID,
        "event": FEED_EVENT,
        "user_id": nullable(USER_ID),
        "deliveries": COUNT,
        "reason": {"type": "string"},
        "at_ns": NS,
    },
    ("id", "event", "user_id", "deliveries", "reason", "at_ns"),
)
#: a group's word on one opt-out: acknowledged (at_ns), pending (since_ns, deliveries),
#: dead_letter (at_ns, reason), lost (past retention) or skipped (group_reset passed it)
RECEIPT_STATE: Final[Schema] = obj(
    {
        "state": {"enum": ["acknowledged", "pending", "dead_letter", "lost", "skipped"]},
        "at_ns": NS,
        "since_ns": NS,
        "deliveries": COUNT,
        "reason": {"type": "string"},
    },
    ("state",),
)
RECEIPT: Final[Schema] = obj(
    {
        "user_id": USER_ID,
        "optouts": array(
            obj(
                {
                    "event": {"enum": ["leave", "purge", "erase"]},
                    "id": EVENT_ID,
                    "at_ns": NS,
                    "groups": {"type": "object", "additionalProperties": RECEIPT_STATE},
                },
                ("event", "id", "at_ns", "groups"),
            )
        ),
    },
    ("user_id", "optouts"),
)
UNCONFIRMED: Final[Schema] = obj(
    {
        "users": array(
            obj(
                {
                    "user_id": USER_ID,
                    "event": {"enum": ["leave", "purge", "erase"]},
                    "id": EVENT_ID,
                    "at_ns": NS,
                    "groups": array({"type": "string"}),
                },
                ("user_id", "event", "id", "at_ns", "groups"),
            )
        ),
        "more": nullable(USER_ID),
    },
    ("users", "more"),
)
