"""Consumer groups in cluster mode: one node serves them all, the one serving partition 0
(``core.owners.LEAD``), from what is committed.

- It takes them with the partition: once its epoch is bumped, the node that held it
  commits nothing more, and the groups are read as boot reads them (``cluster.node``).
- Each group reads every node's events in log order: as the log applies them when it
  has read to their place, else a page of the events table at a time, as on one node.
  What it sends is decided, recorded and pushed by this node's batches, as on one node.
- Every batch with a group's writes is fenced by partition 0's epoch, the one the groups
  were taken at: a node that lost the partition while writing for them commits nothing.
- It lets them go with the partition: its consumers are ended with ``moved``, naming the
  node that serves them now, where they subscribe again and are sent what they had out.
"""

from __future__ import annotations

from collections.abc import Callable

import msgpack

from tidal.protocol import ErrorCode
from tidal.protocol.refusals import ServerError
from tidal.server.core.batch import Batch
from tidal.server.core.feed import Change
from tidal.server.core.group_parts import Entry
from tidal.server.core.owners import LEAD, Owners
from tidal.server.storage import groups_sql

from .committer import Committer
from .consumers import Groups, built
from .logged_feed import LoggedFeed


class LeadGroups(Groups):
    def __init__(
        self,
        feed: LoggedFeed,
        committer: Committer,
        clock: Callable[[], int],
        heartbeat: float,
        owners: Owners,
    ) -> None:
        super().__init__([], feed, committer, clock, heartbeat, live=False)
        self._owners = owners
        self._epoch = 0  # partition 0's, as the groups were taken at
        feed.taken = self.applied

    def adopt(self, loaded: list[groups_sql.Loaded]) -> None:
        """Partition 0 taken (``owners.owned`` has it): its groups, as committed."""
        self.depose()
        self._epoch = self._owners.owned[LEAD]
        self.groups = built(loaded)
        self.due()

    def follow(self) -> None:
        """What is owned changed: the groups go if partition 0 did."""
        if self.groups and LEAD not in self._owners.owned:
            self.depose()

    def depose(self) -> None:
        """Partition 0 is another node's, or soon: this node's consumers are sent there."""
        groups, self.groups = self.groups, {}
        self._reading.clear()
        open_batch = self._committer.open
        if open_batch.groups is not None:  # written for them before: at their epoch
            open_batch.parts.setdefault(LEAD, self._epoch)
        if not groups:
            return
        try:
            self._owners.check_lead()  # raises: where the groups are served now
            error = [int(ErrorCode.UNAVAILABLE), "starting: the groups are read again; retry"]
        except ServerError as exc:
            error = [int(exc.code), exc.message]
        ending = msgpack.packb([2, "error", error])
        for group in groups.values():
            for consumer in list(group.consumers.values()):
                consumer.conn.listener = None
                consumer.conn.end(ending)

    def prepare(self, batch: Batch) -> None:
        self.follow()
        super().prepare(batch)
        if batch.groups is not None:
            batch.parts.setdefault(LEAD, self._epoch)

    def _tick(self) -> None:
        self.follow()
        super()._tick()

    def applied(self, changes: list[Change]) -> None:
        """A log record's events, any node's, in log order: taken by each group that has
        read to them (sent by the next batch), in the room its window has."""
        took = False
        for group in self.groups.values():
            if group in self._reading or group.read_to != changes[0].id - 1:
                continue  # reading a page, or behind: it reads these from the table
            for change in changes:
                if group.room() <= 0:
                    break
                group.take(Entry(change.id, change.kind, change.user_id, change.at_ns,
                                 change.data))  # fmt: skip
                took = True
        if took:
            self.due()
