"""The consumer groups' methods, written once for every face (``plans``): made, dropped,
moved, listed; their dead letters; and the receipts of users' opt-outs. A group's
events are consumed with ``Client.consume`` (``groupfeed``), whose deliveries ack."""

from __future__ import annotations

from typing import Any

from . import requests
from .plans import Options, Plan
from .requests import Call


def group_create(
    o: Options,
    name: str,
    *,
    from_id: int | str = "end",
    ack_wait: float | str = 30.0,
    max_deliveries: int = 5,
    order: str = "wait",
    events: list[str] | None = None,
) -> Plan[dict[str, Any]]:
    """A durable consumer group, reading from ``from_id`` (an event id, 0 for every event
    kept, or "end"); an event not acknowledged within ``ack_wait`` is sent again, and after
    ``max_deliveries`` is a dead letter; ``order`` "wait" holds a user's later events
    behind their dead letter, "skip" sends them past it. Returns ``{name, cursor}``."""
    options: dict[str, Any] = {"from": from_id, "ack_wait": ack_wait,
                               "max_deliveries": max_deliveries, "order": order}  # fmt: skip
    if events is not None:
        options["events"] = events
    result: dict[str, Any] = yield Call("group_create", [name, options])
    return result


def group_drop(o: Options, name: str) -> Plan[bool]:
    return bool((yield Call("group_drop", [name])))


def group_reset(o: Options, name: str, from_id: int | str = "end") -> Plan[int]:
    """Moves the group's cursor (and clears a loss it was told of); returns the cursor."""
    return int((yield Call("group_reset", [name, {"from": from_id}]))["cursor"])


def groups(o: Options) -> Plan[list[dict[str, Any]]]:
    """Each group: cursor, lag, pending, dead letters, consumers and settings."""
    result: list[dict[str, Any]] = yield requests.read("groups")
    return result


def dead_letters(o: Options, group: str, after: int = 0, limit: int = 100) -> Plan[dict[str, Any]]:
    """A page of the group's dead letters (``more``: the next page's ``after``)."""
    page = {"after": after, "limit": limit}
    result: dict[str, Any] = yield requests.read("dead_letters", group, page)
    return result


def redeliver(o: Options, group: str, ids: list[int]) -> Plan[int]:
    return int((yield Call("redeliver", [group, ids]))["redelivered"])


def receipt(o: Options, user_id: int) -> Plan[dict[str, Any]]:
    """The user's latest leave, purge and erase, and each group's word on them."""
    result: dict[str, Any] = yield requests.read("receipt", user_id)
    return result


def unconfirmed(
    o: Options,
    group: str | None = None,
    *,
    older_than: float | str = 0,
    after: int | None = None,
    limit: int = 100,
) -> Plan[dict[str, Any]]:
    """A page of users whose latest opt-out ``group`` (or any group) has not acknowledged,
    older than ``older_than``; ``more``: the next page's ``after``."""
    options: dict[str, Any] = {"older_than": older_than, "limit": limit}
    if group is not None:
        options["group"] = group
    if after is not None:
        options["after"] = after
    result: dict[str, Any] = yield requests.read("unconfirmed", options)
    return result
