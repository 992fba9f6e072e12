"""A blocking client for code without an event loop: scripts, WSGI apps, notebooks.

Same methods, same errors, same reconnect-and-retry rules as ``Client``; one
call at a time per client (a lock makes one client safe to share between
threads, at the price of no pipelining: use the asyncio client for that).
"""

from __future__ import annotations

import functools
import ssl as ssl_module
import threading
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from . import requests
from .addresses import Addresses, Hosts
from .blocking import Link
from .client import DEFAULT_TIMEOUT, RECONNECT_ATTEMPTS, RECONNECT_FIRST_DELAY, RETRIES
from .errors import (
    CallTimeout,
    ConnectFailed,
    ConnectionLost,
    Unavailable,
)
from .feed import Cursor
from .requests import Call
from .subscription import DEAD_AFTER
from .sync_subscription import SyncSubscription
from .types import (
    Counts,
    Event,
    LeftUsers,
    Membership,
    Scalar,
    Signal,
    SignalAck,
    Top,
    Withdrawn,
)


class SyncClient:
    """``with SyncClient("127.0.0.1", 7411) as tidal: tidal.leave(42)``"""

    def __init__(
        self,
        host: Hosts = "127.0.0.1",
        port: int = 7411,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        token: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
        auto_keys: bool = False,
        reconnect: int = RECONNECT_ATTEMPTS,
    ) -> None:
        self._timeout = timeout
        self._auto_keys = auto_keys
        self._reconnect_attempts = reconnect
        self._lock = threading.Lock()
        self._new_link = functools.partial(Link, Addresses(host, port), timeout, token, ssl)
        self._link = self._new_link()
        self._closed = False
        with self._lock:
            self._link.dial()

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._link.drop()

    @property
    def is_connected(self) -> bool:
        return self._link.sock is not None

    def _connected(self) -> None:
        link = self._link
        if link.sock is not None:
            if link.still_open(link.sock):
                return
            link.drop()
        if self._closed:
            raise ConnectionLost("the client is closed")
        delay = RECONNECT_FIRST_DELAY
        failure: Exception = ConnectionLost("no reconnect attempts allowed")
        for _ in range(self._reconnect_attempts):
            try:
                link.dial()
                return
            except (OSError, CallTimeout) as exc:
                failure = exc
            time.sleep(delay)  # backoff: this client blocks by design
            delay *= 2
        raise ConnectFailed(f"could not reconnect: {failure}")

    # -- calls ---------------------------------------------------------------

    def call(self, method: str, *params: Any, timeout: float | None = None) -> Any:
        """Send one request and wait for its reply; ``timeout`` defaults to the client's."""
        with self._lock:
            self._connected()
            return self._link.roundtrip(method, list(params), timeout or self._timeout)

    def _send(self, call: Call) -> Any:
        """Send a built call, and again as ``requests.Retries`` says."""
        retries = requests.Retries(call, RETRIES, self._reconnect_attempts, RECONNECT_FIRST_DELAY)
        while True:
            try:
                return self.call(call.method, *call.params)
            except (ConnectionLost, Unavailable) as exc:
                delay = retries.after(exc, self._closed)
                if delay is None:
                    raise
                if isinstance(exc, Unavailable) and exc.standby:
                    with self._lock:
                        self._link.drop()  # the next call dials the one that serves
                if delay:
                    time.sleep(delay)  # backoff: this client blocks by design

    def ping(self) -> str:
        result: str = self._send(requests.read("ping"))
        return result

    def signal(
        self,
        user_id: int,
        entity: str,
        kind: str,
        weight: float = 1.0,
        *,
        communities: Iterable[str] | None = None,
        attrs: Mapping[str, Scalar] | None = None,
        key: str | None = None,
        at_ns: int | None = None,
    ) -> SignalAck:
        key = requests.key_for(key, self._auto_keys)
        call = requests.signal(user_id, entity, kind, weight, communities, attrs, key, at_ns)
        return SignalAck.from_wire(self._send(call))

    def signal_batch(self, signals: Iterable[Signal]) -> list[SignalAck]:
        call = requests.signal_batch(signals, self._auto_keys)
        return SignalAck.from_compact(self._send(call), len(call.params[0]))

    def leave(self, user_id: int, *, purge: bool = False) -> Membership:
        """With ``purge``, the user's past leaves the cohorts and communities in the same
        step: no read sees them Left with it still counted (``purge`` says how much went)."""
        return Membership.from_wire(self._send(requests.leave(user_id, purge)))

    def rejoin(self, user_id: int) -> Membership:
        return Membership.from_wire(self._send(requests.of_user("rejoin", user_id)))

    def purge(self, user_id: int) -> Withdrawn:
        """Withdraw the user's signals so far from every cohort and community (the ledger
        keeps counting them); their status does not change."""
        return Withdrawn.from_wire(self._send(requests.of_user("purge", user_id)))

    def erase(self, user_id: int) -> Withdrawn:
        """Delete the user's ledger rows and all they added, forget their idempotency
        keys, and leave them Left, so that a stale client's later signals are gated."""
        return Withdrawn.from_wire(self._send(requests.of_user("erase", user_id)))

    def history(self, user_id: int, limit: int = 100, after_ns: int = 0) -> list[Event]:
        """The user's leaves, rejoins, purges and erasures after ``after_ns``, oldest first."""
        lines = self._send(requests.history(user_id, limit, after_ns))
        return [Event.from_wire(line) for line in lines]

    def left_users(self, after: int | None = None, limit: int = 1000) -> LeftUsers:
        """One page of Left users in user_id order, past ``after``."""
        return LeftUsers.from_wire(self._send(requests.left_users(after, limit)))

    def status(self, user_id: int) -> Membership:
        return Membership.from_wire(self._send(requests.status(user_id)))

    def define_cohort(self, name: str, predicate: dict[str, Any]) -> bool:
        return bool(self._send(Call("define_cohort", [name, predicate])))

    def drop_cohort(self, name: str) -> bool:
        return bool(self._send(Call("drop_cohort", [name])))

    def cohorts(self) -> dict[str, dict[str, Any]]:
        """Every cohort, read in pages that each fit a message."""
        return self._pages("cohorts", None, requests.read("cohorts", {}))

    def counts(self, entity: str, window: str | None = None) -> Counts:
        """An entity's aggregates, all of them: a busy entity's are read in pages. With
        ``window`` ("1h", "24h", "7d", "30d"), only signals whose event time is in it."""
        page = None if window is None else {"window": window}
        return Counts.from_wire(
            self._pages("counts", entity, requests.counts(entity, window), page)
        )

    def top(
        self,
        layer: str,
        name: str | None,
        kind: str,
        *,
        by: str = "count",
        window: str | None = None,
        half_life: str | None = None,
        limit: int = 10,
        after: bytes | None = None,
    ) -> Top:
        """The ``limit`` entities with the highest score in one layer ("ledger",
        "cohort", "community"; ``name`` the cohort's or community's, None for the
        ledger): by "count", "weight" or "trend" (decayed by ``half_life``). More than
        one page's worth is read a page at a time; ``after`` reads on from a ``next``."""
        options = {"by": by, "window": window, "half_life": half_life, "after": after}
        pages = requests.TopPages(layer, name, kind, options, limit)
        call: Call | None = pages.call()
        while call is not None:
            call = pages.took(self._send(call))
        return Top.from_wire(pages.entities, pages.next, pages.as_of_ns)

    def _pages(
        self, method: str, first: Any, call: Call | None, page: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        into: dict[str, Any] = {}
        while call is not None:
            call = requests.next_page(method, first, self._send(call), into, page)
        return into

    def subscribe(
        self,
        from_id: int | None = None,
        events: Iterable[str] | None = None,
        *,
        dead_after: float | None = DEAD_AFTER,
    ) -> SyncSubscription:
        """The change feed, as a blocking iterator on a socket of its own; the same as
        ``Client.subscribe``."""
        return SyncSubscription(
            self._new_link,
            Cursor(from_id, events),
            timeout=self._timeout,
            reconnect=self._reconnect_attempts,
            first_delay=RECONNECT_FIRST_DELAY,
            dead_after=dead_after,
        )

    def stats(self) -> dict[str, Any]:
        result: dict[str, Any] = self._send(requests.read("stats"))
        return result

    def health(self) -> dict[str, Any]:
        """``{"status": "ok" | "starting" | "failing", "storage": ..., "error"?: ...}``"""
        result: dict[str, Any] = self._send(requests.read("health"))
        return result
