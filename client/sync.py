"""A blocking client for code without an event loop: scripts, WSGI apps, notebooks.

Same methods, same errors, same reconnect-and-retry rules as ``Client``; one
call at a time per client (a lock makes one client safe to share between
threads, at the price of no pipelining: use the asyncio client for that).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable
from typing import Any, Unpack

from . import requests
from .addresses import Addresses, Hosts
from .blocking import Link
from .client import RECONNECT_ATTEMPTS, RECONNECT_FIRST_DELAY, RETRIES
from .connecting import Connecting, ConnectOptions
from .errors import (
    CallTimeout,
    ConnectFailed,
    ConnectionLost,
    Unavailable,
)
from .faces import Commands, SyncFace
from .feed import Cursor
from .plans import Options
from .requests import Call
from .subscription import DEAD_AFTER
from .sync_consumer import SyncConsumer, sync_consumer
from .sync_subscription import SyncSubscription


class SyncClient(SyncFace, Commands):
    """``with SyncClient("127.0.0.1", 7411) as tidal: tidal.leave(42)``"""

    def __init__(
        self,
        host: Hosts = "127.0.0.1",
        port: int = 7411,
        *,
        reconnect: int = RECONNECT_ATTEMPTS,
        **options: Unpack[ConnectOptions],
    ) -> None:
        """``options``: ``ConnectOptions``; ``reconnect`` as ``Client.connect`` takes it."""
        c = Connecting(**options)
        self._timeout = c.timeout
        self.options = Options(c.auto_keys)
        self._reconnect_attempts = reconnect
        self._lock = threading.Lock()
        self._new_link = functools.partial(Link, Addresses(host, port), c.timeout, c.token, c.ssl)
        self._link = self._new_link()
        self._closed = False
        with self._lock:
            self._link.dial()

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

    def consume(
        self,
        group: str,
        events: Iterable[str] | None = None,
        *,
        dead_after: float | None = DEAD_AFTER,
    ) -> SyncConsumer:
        """A consumer group's share of the feed, as a blocking iterator of ``Delivery``
        objects (``d.ack()`` once applied); the same as ``Client.consume``."""
        return sync_consumer(self._new_link, group, events, timeout=self._timeout,
                             reconnect=self._reconnect_attempts, dead_after=dead_after)  # fmt: skip

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
