"""``ClusterClient``'s blocking twin: each request about a user to the node serving the
user's partition, the others to any node; ``moved`` followed by the same rules
(``routing.Router.after``). A split ``signal_batch`` sends its parts one after another,
each one durable unit on its node."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, Unpack

from . import routing
from .addresses import Hosts
from .blocking import Link
from .cluster import NODE_RECONNECTS, whole
from .connecting import Connecting, ConnectOptions
from .errors import ConnectionLost, TidalError
from .faces import Commands, SyncFace
from .plans import Options
from .requests import Call
from .routing import GROUPS, Router, address, route
from .subscription import DEAD_AFTER
from .sync import SyncClient
from .sync_consumer import SyncConsumer, sync_consumer
from .types import SignalAck

T = TypeVar("T")


class SyncClusterClient(SyncFace, Commands):
    """``with SyncClusterClient("h1:7411,h2:7411") as tidal: tidal.leave(42)``"""

    def __init__(
        self,
        host: Hosts = "127.0.0.1",
        port: int = 7411,
        **options: Unpack[ConnectOptions],
    ) -> None:
        """``options``: ``ConnectOptions``, the same for every node's connection."""
        c = Connecting(**options)
        self._options = c.options()
        self.options = Options(c.auto_keys)
        self._any = SyncClient(host, port, **self._options)
        self._nodes: dict[str, SyncClient] = {}
        self._lock = threading.Lock()
        try:
            self.router = Router(self._any.call("partition_map"))
        except BaseException:
            self._any.close()
            raise

    def close(self) -> None:
        for client in [self._any, *self._nodes.values()]:
            client.close()

    def refresh(self) -> None:
        self.router = Router(self._any.call("partition_map"))

    def consume(
        self, group: str, events: Iterable[str] | None = None, *,
        dead_after: float | None = DEAD_AFTER,
    ) -> SyncConsumer:  # fmt: skip
        """``ClusterClient.consume``, blocking: on the node serving the consumer groups,
        found from the partition map read again at each reconnect."""

        def link() -> Link:
            with contextlib.suppress(TidalError, OSError):
                self.refresh()
            return self.node(self.router.serving(GROUPS))._new_link()

        one = self._any
        return sync_consumer(link, group, events, timeout=one._timeout,
                             reconnect=one._reconnect_attempts, dead_after=dead_after)  # fmt: skip

    def node(self, owner: str | None) -> SyncClient:
        if owner is None:
            return self._any
        with self._lock:
            client = self._nodes.get(owner)
            if client is None:
                host, port = address(owner)
                client = SyncClient(host, port, reconnect=NODE_RECONNECTS, **self._options)
                self._nodes[owner] = client
            return client

    def routed(self, user_id: int, call: Callable[[SyncClient], T]) -> T:
        """``call`` on the node serving ``user_id``, following ``moved``."""
        return self.at(self.router.part(user_id), call)

    def at(self, part: int, call: Callable[[SyncClient], T]) -> T:
        """``call`` on the node serving partition ``part``, following ``moved``."""
        attempt = 0
        while True:
            owner = self.router.serving(part)
            sent = False
            try:
                client = self.node(owner)
                sent = True
                return call(client)
            except (TidalError, OSError) as exc:
                if not self._next(exc, part, attempt, owner, sent):
                    raise
            attempt += 1

    def _next(
        self, exc: BaseException, part: int | None, attempt: int, owner: str | None, sent: bool
    ) -> bool:
        """The step ``Router.after`` says, taken; False: the caller raises ``exc``."""
        step = self.router.after(exc, part, attempt, sent=sent)
        if step is None:
            if isinstance(exc, ConnectionLost):
                self._drop(owner, refresh=True)
            return False
        time.sleep(step.wait)  # backoff: this client blocks by design
        self._drop(owner if step.drop else None, refresh=step.refresh)
        return True

    def _drop(self, owner: str | None, *, refresh: bool) -> None:
        with self._lock:
            client = self._nodes.pop(owner, None) if owner is not None else None
        if client is not None:
            client.close()
        if refresh:
            with contextlib.suppress(TidalError, OSError):  # the next call tries again
                self.refresh()

    # -- each call: to the node of its user, or to any node -----------------

    def _send(self, call: Call) -> Any:
        """``call`` where the method table routes it (``protocol.methods``)."""
        if call.method == "signal_batch":
            return self._batch(call)
        where = route(call.method)
        if where == "user":
            user_id: int = call.params[0]
            return self.routed(user_id, lambda c: c._send(call))
        if where == "groups":
            return self.at(GROUPS, lambda c: c._send(call))
        return self._any._send(call)

    def call(self, method: str, *params: Any) -> Any:
        """One request as given, where the method table routes it; the raw result (a
        ``signal_batch`` goes whole to the node of its first signal's user)."""
        if method == "signal_batch":
            first = routing.first_user(params)
            if first is not None:
                return self.routed(first, lambda c: c.call(method, *params))
            return self._any.call(method, *params)
        return self._send(Call(method, list(params)))

    def _batch(self, call: Call) -> list[SignalAck]:
        """One ``signal_batch`` per node, one after another; ``PartlyApplied`` if a part
        failed after another was acknowledged."""
        items, options = call.params
        acks: list[SignalAck | None] = [None] * len(items)
        pending = [(ix, 0) for ix in self.router.split([item[0] for item in items]).values()]
        while pending:
            indexes, attempt = pending.pop()
            split = self.router.split([items[i][0] for i in indexes])
            if len(split) > 1:  # the map changed since: one part per node again
                pending += [([indexes[j] for j in ix], attempt) for ix in split.values()]
                continue
            owner = self.router.owner(items[indexes[0]][0])
            sent = False
            try:
                client = self.node(owner)
                sent = True
                one = Call("signal_batch", [[items[i] for i in indexes], options], call.repeatable)
                acked = SignalAck.from_compact(client._send(one), len(indexes))
            except (TidalError, OSError) as exc:
                if self._next(exc, None, attempt, owner, sent):
                    pending.append((indexes, attempt + 1))
                    continue
                return whole(acks, [exc])
            for i, ack in zip(indexes, acked, strict=True):
                acks[i] = ack
        return whole(acks, [])
