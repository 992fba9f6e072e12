"""Cluster mode, sans-I/O: which node serves a user, from a ``partition_map`` answer.

The rule is the server's (``tidal.protocol.partitions``); a node's ``moved`` error
corrects one partition at a time until the next full map is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, NamedTuple

from tidal.protocol.methods import BY_NAME, Route
from tidal.protocol.partitions import GROUPS as GROUPS
from tidal.protocol.partitions import HASH, partition

from .errors import ConnectFailed, ConnectionLost, InvalidArgument, Moved, Unavailable

#: a request follows ``moved`` (or waits out a partition between owners) this many times
#: before the error is the caller's
MOVES: Final = 8
#: seconds between tries while a partition is between owners, times the try's number
BETWEEN_OWNERS: Final = 0.1


def route(method: str) -> Route:
    """How cluster mode routes ``method`` (the method table's word; ``any`` for a method
    it does not declare, which any node refuses alike)."""
    known = BY_NAME.get(method)
    return "any" if known is None else known.route


def first_user(params: Sequence[Any]) -> int | None:
    """A raw ``signal_batch``'s first signal's user, if its params have that shape."""
    items = params[0] if params else None
    if type(items) is list and items and type(items[0]) is list and items[0]:
        user = items[0][0]
        return user if type(user) is int else None
    return None


class Step(NamedTuple):
    """What a routing client does after a failed try, before the next."""

    wait: float  # seconds first
    refresh: bool  # read the partition map again
    drop: bool  # close the client of the node tried: it is gone


def address(text: str) -> tuple[str, int]:
    """``host:port`` as a node advertises it; IPv6 hosts in brackets."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise InvalidArgument(f"a node's address: host:port, got {text!r}")
    return host.strip("[]"), int(port)


class Router:
    def __init__(self, wire: dict[str, Any]) -> None:
        if wire.get("hash") != HASH:
            raise InvalidArgument(
                f"partition_map: the cluster hashes users with {wire.get('hash')!r}; this"
                f" client knows {HASH!r}"
            )
        self.cluster: str | None = wire.get("cluster")
        self.partitions: int = wire["partitions"]
        self.owners: list[str | None] = [owner for owner, _ in wire["owners"]]
        self.epochs: list[int] = [epoch for _, epoch in wire["owners"]]

    @property
    def clustered(self) -> bool:
        """False for a server not in cluster mode: it serves every user itself."""
        return self.cluster is not None

    def part(self, user_id: int) -> int:
        """The partition of ``user_id``."""
        return partition(user_id, self.partitions)

    def serving(self, part: int) -> str | None:
        """The node serving partition ``part``, or None when none is known (then: any
        node). The consumer groups are ``GROUPS``' node's."""
        return self.owners[part] if self.clustered else None

    def owner(self, user_id: int) -> str | None:
        """The node serving ``user_id``, or None when none is known (then: any node)."""
        return self.serving(self.part(user_id))

    def moved(self, part: int, owner: str | None) -> None:
        """A node said partition ``part`` is served by ``owner`` (None: by no node yet)."""
        if self.clustered:
            self.owners[part] = owner

    def after(
        self, exc: BaseException, part: int | None, attempt: int, *, sent: bool
    ) -> Step | None:
        """The next step after ``exc`` on try ``attempt`` for partition ``part`` (None: a
        part of a batch, whose users may be several), or None: the caller gets ``exc``. ``sent``:
        the request went out (a connection lost after that is the caller's: what became
        of the request is unknown; keyed signals are safe to send again)."""
        last = attempt + 1 >= MOVES
        pace = BETWEEN_OWNERS * (attempt + 1)
        if isinstance(exc, Moved):
            if last:
                return None
            if exc.address is None or part is None:  # no owner yet, or a batch's
                return Step(pace if exc.address is None else 0.0, True, False)
            self.moved(part, exc.address)
            return Step(0.0, False, False)
        if isinstance(exc, Unavailable):  # nothing applied: a partition loading, cohorts
            passing = exc.starting or exc.retry  # changed under the request's signals
            return Step(pace, False, False) if passing and not last else None
        if isinstance(exc, (ConnectionLost, OSError)):
            # a node's client that cannot reconnect has sent nothing: the node is gone
            unsent = not sent or isinstance(exc, ConnectFailed)
            return Step(pace, True, True) if unsent and not last else None
        return None

    def split(self, user_ids: Sequence[int]) -> dict[str | None, list[int]]:
        """The indexes of ``user_ids``, by the node serving each, in their order."""
        groups: dict[str | None, list[int]] = {}
        for i, user_id in enumerate(user_ids):
            groups.setdefault(self.owner(user_id), []).append(i)
        return groups
