"""What each method sends, shared by the asyncio client and the blocking one."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from tidal.protocol.limits import USER_ID_MAX

from .errors import ConnectFailed, ConnectionLost, InvalidArgument, Unavailable
from .types import Scalar, Signal, _context


class Retries:
    """When a failed call is sent again; both clients follow it. A repeatable call survives
    dropped connections (a few: a reconnect can land on a server that is still going
    down, and be reset); any call is asked again, with backoff, while the server says it
    is starting or a standby (it applied nothing)."""

    def __init__(self, call: Call, lost: int, starting: int, first_delay: float) -> None:
        self._repeatable = call.repeatable
        self._lost, self._starting = lost, starting
        self._delay = first_delay

    def after(self, exc: Exception, closed: bool) -> float | None:
        """Seconds to wait before sending again, or None: give up, raise ``exc``."""
        if isinstance(exc, ConnectFailed):
            return None  # reconnecting already tried, with backoff
        if isinstance(exc, ConnectionLost):
            self._lost -= 1
            return 0.0 if self._repeatable and not closed and self._lost > 0 else None
        passing = (
            exc.starting or exc.standby or exc.retry if isinstance(exc, Unavailable) else False
        )
        if passing and self._starting > 0:
            self._starting -= 1
            delay, self._delay = self._delay, self._delay * 2
            return delay
        return None


class Call(NamedTuple):
    method: str
    params: list[Any]
    #: safe to send again after a dropped connection: the server counts it once
    repeatable: bool = False


def key_for(key: str | None, auto_keys: bool) -> str | None:
    return key if key is not None or not auto_keys else uuid.uuid4().hex


def signal(
    user_id: int,
    entity: str,
    kind: str,
    weight: float,
    communities: Iterable[str] | None,
    attrs: Mapping[str, Scalar] | None,
    key: str | None,
    at_ns: int | None = None,
) -> Call:
    params: list[Any] = [checked_user_id(user_id), entity, kind, weight]
    context = _context(list(communities) if communities else None, attrs, key, at_ns)
    if context:
        params.append(context)
    return Call("signal", params, key is not None)


def signal_batch(signals: Iterable[Signal], auto_keys: bool) -> Call:
    items = []
    keyed = True
    for item in signals:
        checked_user_id(item.user_id)
        key = key_for(item.key, auto_keys)
        keyed = keyed and key is not None
        items.append(item._replace(key=key).wire())
    # repeatable when every item is; the compact ack saves the server a map per signal
    return Call("signal_batch", [items, {"ack": "compact"}], keyed)


def of_user(method: str, user_id: int) -> Call:
    return Call(method, [checked_user_id(user_id)])


def leave(user_id: int, purge: bool) -> Call:
    params: list[Any] = [checked_user_id(user_id)]
    if purge:
        params.append({"purge": True})
    return Call("leave", params)


def history(user_id: int, limit: int, after_ns: int) -> Call:
    return read("history", checked_user_id(user_id), limit, after_ns)


def left_users(after: int | None, limit: int) -> Call:
    return read("left_users", None if after is None else checked_user_id(after), limit)


def status(user_id: int) -> Call:
    return read("status", checked_user_id(user_id))


def read(method: str, *params: Any) -> Call:
    """A read changes nothing: after a dropped connection it is simply asked again."""
    return Call(method, list(params), True)


def next_page(
    method: str,
    first: Any,
    result: dict[str, Any],
    into: dict[str, Any],
    page: dict[str, Any] | None = None,
) -> Call | None:
    """Merge one page of ``counts`` or ``cohorts`` into ``into``; the call for the next
    page, or None after the last. Pages are read one after another: together they are
    not one snapshot if writes land in between."""
    if method == "cohorts":
        into.update(result["cohorts"])
        more = result["more"]
    else:
        for layer in ("ledger", "cohorts", "communities"):
            mine = into.setdefault(layer, {})
            for name, value in result[layer].items():
                if layer == "ledger":
                    mine[name] = value
                else:
                    mine.setdefault(name, {}).update(value)  # a name's kinds may span pages
        more = result.get("more")
    if more is None:
        return None
    page = {**(page or {}), "after": more}
    return read(method, page) if first is None else read(method, first, page)


def counts(entity: str, window: str | None) -> Call:
    return read("counts", entity) if window is None else read("counts", entity, {"window": window})


#: the most entities one ``top`` reply holds; the clients read more a page at a time
TOP_PAGE = 1000


class TopPages:
    """A ``top`` of any ``limit``, read a page at a time with ``after``. Pages are read one
    after another: together they are not one snapshot if writes land in between."""

    def __init__(self, layer: str, name: str | None, kind: str, options: dict[str, Any],
                 limit: int) -> None:  # fmt: skip
        if type(limit) is not int or limit < 1:
            raise InvalidArgument(f"limit: must be an integer of 1 or more, got {limit!r}")
        self._head = [layer, name, kind]
        self._options = {k: v for k, v in options.items() if v is not None}
        self._limit = limit
        self.entities: list[dict[str, Any]] = []
        self.next: bytes | None = None
        self.as_of_ns = 0

    def call(self) -> Call:
        options = {**self._options, "limit": min(self._limit - len(self.entities), TOP_PAGE)}
        return read("top", *self._head, options)

    def took(self, page: dict[str, Any]) -> Call | None:
        """One page in; the call for the next, or None when done."""
        self.entities += page["entities"]
        self.next = page["next"]
        self.as_of_ns = self.as_of_ns or page["as_of_ns"]
        if self.next is None or len(self.entities) >= self._limit:
            return None
        self._options["after"] = self.next
        return self.call()


def checked_user_id(value: int) -> int:
    """Refuse here what MessagePack could not carry, before anything is sent."""
    if type(value) is not int or not 0 <= value <= USER_ID_MAX:
        raise InvalidArgument(f"user_id: must be an integer in 0..2**64-1, got {value!r}")
    return value
