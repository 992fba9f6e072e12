"""Validation at the edge, of the consumer groups' requests: a group's settings, the ids
acknowledged, a nack's options, where a group starts again, a page of dead letters or of
unconfirmed opt-outs. The rules of ``params``, for groups: each message names the
argument and the rule, and nothing is changed by a request one of them refuses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from tidal.protocol.limits import FEED_EVENTS, NAME_MAX_BYTES
from tidal.protocol.refusals import InvalidParams
from tidal.server.kinds import duration

from .params import describe, options, string, text, user_id

#: ids one ack, nack or redeliver takes at most
MAX_IDS: Final = 1_000
MAX_DELIVERIES: Final = 1_000
#: the longest ack_wait and nack delay: a day
MAX_WAIT_S: Final = 86_400.0


@dataclass(frozen=True, slots=True)
class Settings:
    start: int | None  # None: the feed's end
    ack_wait_s: float = 30.0
    max_deliveries: int = 5
    wait: bool = True
    events: frozenset[str] | None = None  # their names; None: every event


def seconds(value: object, where: str, least: float = 0.0, most: float = MAX_WAIT_S) -> float:
    """A duration: seconds as a number, or text such as ``30s``, ``5m``, ``250ms``."""
    value = string(value)
    if type(value) is str:
        try:
            secs = float(value[:-2]) / 1000 if value.endswith("ms") else duration(value)
        except ValueError:
            secs = -1.0
    elif type(value) in (int, float):
        secs = float(value)  # type: ignore[arg-type]
    else:
        secs = -1.0
    if not least <= secs <= most:
        raise InvalidParams(
            f"{where}: must be a duration in {least:g}s..{most:g}s, such as 30s, 5m or 250ms, or a"
            f" number of seconds; got {describe(value) if type(value) is not str else value!r}"
        )
    return secs


def start(value: object, where: str) -> int | None:
    value = string(value)
    if value == "end":
        return None
    if type(value) is not int or not 0 <= value <= 2**63 - 1:
        raise InvalidParams(f"{where}: must be an event id (0: every event kept) or 'end'")
    return value


def group_options(value: object, where: str) -> Settings:
    """``group_create``'s options."""
    given = options(value, where, "group_create",
                    ("from", "ack_wait", "max_deliveries", "order", "events"))  # fmt: skip
    most = given.get("max_deliveries", 5)
    if type(most) is not int or not 1 <= most <= MAX_DELIVERIES:
        raise InvalidParams(
            f"{where}.max_deliveries: must be an integer in 1..{MAX_DELIVERIES}, got"
            f" {describe(most)}"
        )
    order = string(given.get("order", "wait"))
    if order not in ("wait", "skip"):
        raise InvalidParams(f"{where}.order: must be 'wait' or 'skip', got {describe(order)}")
    names = None
    if "events" in given:
        names = frozenset(event_names(given["events"], where))
    return Settings(
        start(given.get("from", "end"), f"{where}.from"),
        seconds(given.get("ack_wait", 30.0), f"{where}.ack_wait", 0.001),
        most,
        order == "wait",
        names,
    )


def event_names(value: object, where: str) -> list[str]:
    if type(value) is not list or not value:
        raise InvalidParams(f"{where}.events: must be a non-empty array of event names")
    names = [string(n) for n in value]
    for i, name in enumerate(names):
        if type(name) is not str or name not in FEED_EVENTS:
            raise InvalidParams(
                f"{where}.events[{i}]: unknown event {describe(name)}; one of"
                f" {', '.join(FEED_EVENTS)}"
            )
    return [str(n) for n in names]


def event_ids(value: object, where: str) -> list[int]:
    """1..1000 event ids, none twice."""
    if type(value) is not list or not 1 <= len(value) <= MAX_IDS:
        raise InvalidParams(f"{where}: must be an array of 1..{MAX_IDS} event ids")
    seen: set[int] = set()
    for i, item in enumerate(value):
        if type(item) is not int or not 1 <= item <= 2**63 - 1:
            raise InvalidParams(f"{where}[{i}]: must be an event id, got {describe(item)}")
        if item in seen:
            raise InvalidParams(f"{where}[{i}]: event {item} is given twice")
        seen.add(item)
    return list(value)


def nack_options(value: object, where: str) -> tuple[float, bool, str]:
    """(delay s, dead, reason)."""
    given = options(value, where, "nack", ("delay", "dead", "reason"))
    dead = given.get("dead", False)
    if type(dead) is not bool:
        raise InvalidParams(f"{where}.dead: must be true or false, got {describe(dead)}")
    reason = given.get("reason")
    reason = "" if reason in (None, "", b"") else text(reason, f"{where}.reason", 1024)
    return seconds(given.get("delay", 0), f"{where}.delay"), dead, reason


def reset_options(value: object, where: str) -> int | None:
    given = options(value, where, "group_reset", ("from",))
    return start(given.get("from", "end"), f"{where}.from")


def dead_page(value: object, where: str) -> tuple[int, int]:
    """``dead_letters``' page: (after id, limit 1..1000, 100 by default)."""
    given = options(value, where, "dead_letters", ("after", "limit"))
    after = given.get("after", 0)
    if type(after) is not int or after < 0:
        raise InvalidParams(f"{where}.after: must be an event id, got {describe(after)}")
    return after, limit(given, where)


def limit(given: dict[str, Any], where: str) -> int:
    most = given.get("limit", 100)
    if type(most) is not int or not 1 <= most <= 1000:
        raise InvalidParams(f"{where}.limit: must be an integer in 1..1000, got {describe(most)}")
    return most


def unconfirmed_options(value: object, where: str) -> tuple[str | None, float, int | None, int]:
    """(group or None for every group, older than s, after user, limit)."""
    given = options(value, where, "unconfirmed", ("group", "older_than", "after", "limit"))
    group = given.get("group")
    name = None if group is None else text(group, f"{where}.group", NAME_MAX_BYTES)
    older = seconds(given.get("older_than", 0), f"{where}.older_than", 0.0, 3650 * 86_400.0)
    after = given.get("after")
    return (
        name,
        older,
        None if after is None else user_id(after, f"{where}.after"),
        limit(given, where),
    )
