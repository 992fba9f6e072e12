"""Which node serves each user: on one node, this one (``Router``); in cluster mode,
which partitions this node serves, and who serves the others (``Owners``, swapped in at
start).

One sequencer per user: a request about a user is applied only by the node that owns
the user's partition, at the epoch it took it with. The check is here, once, beside
the gate: a dict lookup, no I/O. ``tidal.server.cluster`` changes what is owned; the
database's epochs fence every transaction (``plans``), so a node that lost a partition
without knowing it commits nothing for it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any, Final, NoReturn

from tidal.protocol.partitions import GROUPS, HASH, partition
from tidal.protocol.refusals import Moved, Unavailable

from .batch import Batch

#: the partition whose node serves every consumer group (and retires the ledger's rows)
LEAD: Final = GROUPS


class Router:
    """Every request about a user passes ``check`` before it is applied. One node serves
    every user: nothing is refused."""

    def check(self, user_id: int, batch: Batch | None = None) -> None:
        """Refuses a request about ``user_id`` unless this node serves it; a write passes
        its ``batch``."""

    def check_all(self, user_ids: Iterable[int], batch: Batch | None = None) -> None:
        """``check`` for each of ``user_ids`` (a ``signal_batch``'s)."""

    def check_lead(self, batch: Batch | None = None) -> None:
        """Refuses a consumer group's request unless this node serves them (in cluster
        mode, partition 0's node does); a write passes its ``batch``."""

    def lost(self, parts: Iterable[int]) -> None:
        """A commit found ``parts`` taken by another node: served here no more."""

    def wire(self) -> dict[str, Any]:
        """``partition_map``'s answer."""
        one = {"cluster": None, "node": None, "partitions": 1, "hash": HASH}
        return {**one, "owners": [[None, 0]]}


class Owners(Router):
    def __init__(self, cluster: str, node: str, partitions: int) -> None:
        self.cluster = cluster
        self.node = node  # this node's address, as it advertises it
        self.partitions = partitions
        #: partitions this node serves -> the epoch it took each at
        self.owned: dict[int, int] = {}
        #: partitions taken and still loading here: requests for them are asked to retry
        self.loading: set[int] = set()
        #: partitions being handed to another node: requests for them are moved
        self.leaving: set[int] = set()
        #: every partition's (node address or None, epoch), as last read from the database
        self.map: list[tuple[str | None, int]] = [(None, 0)] * partitions
        #: ``time.monotonic()`` until which what is owned was confirmed: no other node can
        #: have taken it before (``cluster``). A node paused past it serves nothing, reads
        #: included, until it has read the table again.
        self.valid_until = 0.0

    def part(self, user_id: int) -> int:
        return partition(user_id, self.partitions)

    def check(self, user_id: int, batch: Batch | None = None) -> None:
        """Refuses a request about ``user_id`` unless this node serves its partition; a
        write (``batch``) notes the partition's epoch, which its transaction checks. On
        every signal: ``check_all``'s rule for one user, without its loop."""
        part = partition(user_id, self.partitions)
        epoch = self.owned.get(part)
        if epoch is None:
            self.refuse(user_id, part)
        if time.monotonic() > self.valid_until:
            self._unconfirmed(part, f"user {user_id}")
        if batch is not None:
            batch.parts[part] = epoch

    def check_all(self, user_ids: Iterable[int], batch: Batch | None = None) -> None:
        """``check`` for each of ``user_ids`` (a ``signal_batch``'s), the lease read once."""
        parts = self.partitions
        owned = self.owned
        confirmed = time.monotonic() <= self.valid_until
        for user_id in user_ids:
            part = partition(user_id, parts)
            epoch = owned.get(part)
            if epoch is None:
                self.refuse(user_id, part)
            if not confirmed:
                self._unconfirmed(part, f"user {user_id}")
            if batch is not None:
                batch.parts[part] = epoch

    def check_lead(self, batch: Batch | None = None) -> None:
        """Consumer groups are served by partition 0's node, fenced by its epoch: a node
        that lost it commits nothing more for a group (``engine.consumers``)."""
        epoch = self.owned.get(LEAD)
        if epoch is None:
            self._refuse(LEAD, "consumer groups are served by partition 0's node", "the groups")
        if time.monotonic() > self.valid_until:
            self._unconfirmed(LEAD, "consumer groups")
        if batch is not None:
            batch.parts[LEAD] = epoch

    def lost(self, parts: Iterable[int]) -> None:
        for part in parts:
            self.owned.pop(part, None)

    @staticmethod
    def _unconfirmed(part: int, what: str) -> NoReturn:
        raise Unavailable(
            f"starting: this node is confirming that it still serves partition {part}"
            f" ({what}); retry"
        )

    def refuse(self, user_id: int, part: int) -> NoReturn:
        self._refuse(part, f"user {user_id} is in partition {part}", f"user {user_id}")

    def _refuse(self, part: int, where: str, what: str) -> NoReturn:
        """``moved`` naming the node that serves ``part``, or ``starting`` while it loads
        here; ``where`` and ``what`` say what was asked for."""
        if part in self.loading:
            raise Unavailable(f"starting: partition {part} ({what}) is loading on this node; retry")
        address = self.map[part][0]
        if address == self.node:  # leaving, or lost: the next owner is not known yet
            address = None
        raise Moved(f"moved: {where}, served by {address or 'unknown'}")

    def wire(self) -> dict[str, Any]:
        """``partition_map``'s answer."""
        owners: list[list[Any]] = []
        for part, (address, epoch) in enumerate(self.map):
            if part in self.owned:
                address, epoch = self.node, self.owned[part]
            elif address == self.node:
                address = None
            owners.append([address, epoch])
        return {
            "cluster": self.cluster,
            "node": self.node,
            "partitions": self.partitions,
            "hash": HASH,
            "owners": owners,
        }
