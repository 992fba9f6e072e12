"""The shapes of tidal's values, as JSON Schema (draft 7, as OpenRPC 1.4 has it): what the
method table (``methods``) says each parameter and result is, and what ``rpc.discover``
hands to other languages.

MessagePack maps onto JSON Schema as JSON does, with two marks of its own:

- a string may arrive as a MessagePack str or as a bin holding UTF-8;
- a value that is a bin (opaque bytes: a ``top`` cursor, a compact ack's bits) is a string
  with ``contentEncoding: base64`` and ``x-msgpack: bin``: it travels as a bin, and is
  written in base64 wherever it must be text (JSON, a command line).

Byte bounds of UTF-8 text cannot be said in JSON Schema, which counts characters: a
string's ``maxLength`` is its byte bound (no text has more characters than bytes), so the
schema is a pre-filter, and its description states the rule the server applies.
"""

from __future__ import annotations

from typing import Any, Final, TypeAlias

from .limits import (
    ATTR_VALUE_MAX_BYTES,
    ENTITY_MAX_BYTES,
    FEED_EVENTS,
    INT64_MAX,
    KEY_MAX_BYTES,
    KIND_MAX_BYTES,
    MAX_ATTRS,
    MAX_BATCH,
    MAX_COMMUNITIES,
    MAX_PREDICATE_VALUES,
    NAME_MAX_BYTES,
    USER_ID_MAX,
    WEIGHT_MAX,
)

Schema: TypeAlias = dict[str, Any]

#: the windows a read counts over
WINDOWS: Final = ("all", "1h", "24h", "7d", "30d")
#: other names a window is given by: the same window
WINDOW_ALIASES: Final = {"1d": "24h"}
#: the layers ``top`` ranks
LAYERS: Final = ("ledger", "cohort", "community")
#: what ``top`` ranks by
RANK_BY: Final = ("count", "weight", "trend")


def text(most: int, what: str) -> Schema:
    return {
        "type": "string",
        "minLength": 1,
        "maxLength": most,
        "description": f"{what}: 1..{most} bytes of UTF-8, without the NUL character",
    }


def nullable(schema: Schema) -> Schema:
    return {"oneOf": [{"type": "null"}, schema]}


def obj(properties: dict[str, Schema], required: tuple[str, ...] = (), **more: Any) -> Schema:
    """A map of these keys only (those in ``required`` always there)."""
    return {
        "type": "object",
        "properties": properties,
        "required": list(required),
        "additionalProperties": False,
        **more,
    }


def array(items: Schema, least: int = 0, most: int | None = None) -> Schema:
    out: Schema = {"type": "array", "items": items, "minItems": least}
    if most is not None:
        out["maxItems"] = most
    return out


BIN: Final[Schema] = {"type": "string", "contentEncoding": "base64", "x-msgpack": "bin"}
NS: Final[Schema] = {
    "type": "integer",
    "minimum": 0,
    "maximum": INT64_MAX,
    "description": "nanoseconds since the Unix epoch (past 2**53: a 64-bit integer)",
}
COUNT: Final[Schema] = {"type": "integer", "minimum": 0}
#: where a reader of the feed stands: an event id, or 0 before the first
POSITION: Final[Schema] = {"type": "integer", "minimum": 0, "maximum": INT64_MAX}
USER_ID: Final[Schema] = {
    "type": "integer",
    "minimum": 0,
    "maximum": USER_ID_MAX,
    "description": "an unsigned 64-bit integer (past a signed long's range: a uint64)",
}
ENTITY: Final = text(ENTITY_MAX_BYTES, "entity")
KIND: Final = text(KIND_MAX_BYTES, "kind")
NAME: Final = text(NAME_MAX_BYTES, "name")
WEIGHT: Final[Schema] = {"type": "number", "minimum": -WEIGHT_MAX, "maximum": WEIGHT_MAX}
#: an attribute's value (a whole float is an integer to JSON Schema: one "number" holds both)
SCALAR: Final[Schema] = {
    "oneOf": [
        {"type": "string", "maxLength": ATTR_VALUE_MAX_BYTES},
        {"type": "number"},
        {"type": "boolean"},
    ]
}
ATTRS: Final[Schema] = {
    "type": "object",
    "maxProperties": MAX_ATTRS,
    "propertyNames": {"minLength": 1, "maxLength": NAME_MAX_BYTES},
    "additionalProperties": SCALAR,
}
CONTEXT: Final[Schema] = {
    **obj(
        {
            "communities": array(NAME, 0, MAX_COMMUNITIES),
            "attrs": ATTRS,
            "id": text(KEY_MAX_BYTES, "an idempotency key"),
            "at_ns": {**NS, "description": "when the signal happened; at most 5 minutes ahead"},
        }
    ),
    "type": ["object", "null"],
}
PREDICATE: Final[Schema] = {
    "type": "object",
    "maxProperties": MAX_ATTRS,
    "propertyNames": {"minLength": 1, "maxLength": NAME_MAX_BYTES},
    "additionalProperties": {
        "oneOf": [SCALAR, array(SCALAR, 1, MAX_PREDICATE_VALUES)],
    },
    "description": "attribute -> the value it must have, or an array of the values it may"
    " have; at most 1,024 values in all, 64 KiB encoded",
}
SIGNAL_ITEM: Final[Schema] = {
    "type": "array",
    "items": [USER_ID, ENTITY, KIND, WEIGHT, CONTEXT],
    "additionalItems": False,
    "minItems": 3,
    "maxItems": 5,
    "description": "[user_id, entity, kind, weight?, context?]",
}
ACK: Final[Schema] = obj({"seq": COUNT, "forwarded": {"type": "boolean"}}, ("seq", "forwarded"))
COMPACT_ACK: Final[Schema] = obj(
    {
        "first_seq": COUNT,
        "forwarded": {**BIN, "description": "bit i of byte i // 8: signal i was forwarded"},
        "repeated": array(array(COUNT, 2, 2)),
    },
    ("first_seq", "forwarded", "repeated"),
)
MEMBERSHIP: Final[Schema] = obj(
    {
        "user_id": USER_ID,
        "status": {"enum": ["active", "left"]},
        "left_at_ns": nullable(NS),
        "purged": COUNT,
    },
    ("user_id", "status", "left_at_ns"),
)
PURGED: Final[Schema] = obj(
    {"user_id": USER_ID, "purged": COUNT, "at_ns": NS}, ("user_id", "purged", "at_ns")
)
ERASED: Final[Schema] = obj(
    {"user_id": USER_ID, "erased": COUNT, "at_ns": NS}, ("user_id", "erased", "at_ns")
)
SUBSCRIBE_OPTIONS: Final[Schema] = {
    **obj(
        {
            "from": {"type": "integer", "minimum": 0, "maximum": INT64_MAX},
            "events": array({"enum": list(FEED_EVENTS)}, 1),
            "group": NAME,
        }
    ),
    "type": ["object", "null"],
}
PARTITION_MAP: Final[Schema] = obj(
    {
        "cluster": nullable({"type": "string"}),
        "node": nullable({"type": "string"}),
        "partitions": {"type": "integer", "minimum": 1},
        "hash": {"type": "string"},
        "owners": array(array({}, 2, 2)),
    },
    ("cluster", "node", "partitions", "hash", "owners"),
)
MAP: Final[Schema] = {"type": "object"}
BOUNDED_BATCH: Final = (1, MAX_BATCH)
#: ``left_users``'s ``after``: the last user of the previous page, or nil
LEAVE_OPTIONS: Final[Schema] = obj({"purge": {"type": "boolean"}})
#: an event of the change feed, as ``subscribe`` pushes it (``core.feed.Change.wire``)
FEED_EVENT: Final[Schema] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": INT64_MAX},
        "event": {"enum": list(FEED_EVENTS)},
        "at_ns": NS,
        "user_id": USER_ID,
        "left_at_ns": NS,
        "purged": COUNT,
        "erased": COUNT,
        "name": NAME,
        "predicate": {"type": "object"},
    },
    "required": ["id", "event", "at_ns"],
}
