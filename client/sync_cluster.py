"""``ClusterClient``'s blocking twin: each request about a user to the node serving the
user's partition, the others to any node; ``moved`` followed by the same rules
(``routing.Router.after``). A split ``signal_batch`` sends its parts one after another,
each one durable unit on its node."""

from __future__ import annotations

import contextlib
import ssl as ssl_module
import threading
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any, TypeVar

from .addresses import Hosts
from .client import DEFAULT_TIMEOUT
from .cluster import NODE_RECONNECTS, PartlyApplied
from .errors import ConnectionLost, TidalError
from .routing import Router, address
from .sync import SyncClient
from .types import Counts, Event, LeftUsers, Membership, Signal, SignalAck, Top, Withdrawn

T = TypeVar("T")


class SyncClusterClient:
    """``with SyncClusterClient("h1:7411,h2:7411") as tidal: tidal.leave(42)``"""

    def __init__(
        self,
        host: Hosts = "127.0.0.1",
        port: int = 7411,
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        token: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
        auto_keys: bool = False,
    ) -> None:
        self._options: dict[str, Any] = {
            "timeout": timeout, "token": token, "ssl": ssl, "auto_keys": auto_keys,
        }  # fmt: skip
        self._any = SyncClient(host, port, **self._options)
        self._nodes: dict[str, SyncClient] = {}
        self._lock = threading.Lock()
        try:
            self.router = Router(self._any.call("partition_map"))
        except BaseException:
            self._any.close()
            raise

    def __enter__(self) -> SyncClusterClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        for client in [self._any, *self._nodes.values()]:
            client.close()

    def refresh(self) -> None:
        self.router = Router(self._any.call("partition_map"))

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
        attempt = 0
        while True:
            owner = self.router.owner(user_id)
            sent = False
            try:
                client = self.node(owner)
                sent = True
                return call(client)
            except (TidalError, OSError) as exc:
                if not self._next(exc, user_id, attempt, owner, sent):
                    raise
            attempt += 1

    def _next(
        self, exc: BaseException, user_id: int | None, attempt: int, owner: str | None, sent: bool
    ) -> bool:
        """The step ``Router.after`` says, taken; False: the caller raises ``exc``."""
        step = self.router.after(exc, user_id, attempt, sent=sent)
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

    # -- one user's requests: to its node -----------------------------------

    def signal(
        self, user_id: int, entity: str, kind: str, weight: float = 1.0, **options: Any
    ) -> SignalAck:
        return self.routed(user_id, lambda c: c.signal(user_id, entity, kind, weight, **options))

    def leave(self, user_id: int, *, purge: bool = False) -> Membership:
        return self.routed(user_id, lambda c: c.leave(user_id, purge=purge))

    def rejoin(self, user_id: int) -> Membership:
        return self.routed(user_id, lambda c: c.rejoin(user_id))

    def status(self, user_id: int) -> Membership:
        return self.routed(user_id, lambda c: c.status(user_id))

    def purge(self, user_id: int) -> Withdrawn:
        return self.routed(user_id, lambda c: c.purge(user_id))

    def erase(self, user_id: int) -> Withdrawn:
        return self.routed(user_id, lambda c: c.erase(user_id))

    def history(self, user_id: int, limit: int = 100, after_ns: int = 0) -> list[Event]:
        return self.routed(user_id, lambda c: c.history(user_id, limit, after_ns))

    def signal_batch(self, signals: Iterable[Signal]) -> list[SignalAck]:
        """One ``signal_batch`` per node, one after another; ``PartlyApplied`` if a part
        failed after another was acknowledged."""
        items = list(signals)
        acks: list[SignalAck | None] = [None] * len(items)
        pending = [(ix, 0) for ix in self.router.split([s.user_id for s in items]).values()]
        while pending:
            indexes, attempt = pending.pop()
            split = self.router.split([items[i].user_id for i in indexes])
            if len(split) > 1:  # the map changed since: one part per node again
                pending += [([indexes[j] for j in ix], attempt) for ix in split.values()]
                continue
            owner = self.router.owner(items[indexes[0]].user_id)
            sent = False
            try:
                client = self.node(owner)
                sent = True
                acked = client.signal_batch([items[i] for i in indexes])
            except (TidalError, OSError) as exc:
                if self._next(exc, None, attempt, owner, sent):
                    pending.append((indexes, attempt + 1))
                    continue
                if all(ack is None for ack in acks):
                    raise
                raise PartlyApplied(acks, exc) from exc
            for i, ack in zip(indexes, acked, strict=True):
                acks[i] = ack
        return [ack for ack in acks if ack is not None]

    # -- the rest: any node --------------------------------------------------

    def call(self, method: str, *params: Any) -> Any:
        return self._any.call(method, *params)

    def counts(self, entity: str, window: str | None = None) -> Counts:
        return self._any.counts(entity, window)

    def top(self, layer: str, name: str | None, kind: str, **options: Any) -> Top:
        return self._any.top(layer, name, kind, **options)

    def cohorts(self) -> dict[str, dict[str, Any]]:
        return self._any.cohorts()

    def define_cohort(self, name: str, predicate: dict[str, Any]) -> bool:
        return self._any.define_cohort(name, predicate)

    def drop_cohort(self, name: str) -> bool:
        return self._any.drop_cohort(name)

    def left_users(self, after: int | None = None, limit: int = 1000) -> LeftUsers:
        return self._any.left_users(after, limit)

    def health(self) -> dict[str, Any]:
        return self._any.health()
