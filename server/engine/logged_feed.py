"""Cluster mode's change feed: events come from the commit log, every node's, in log
order, their ids given in the transactions (``replica``), and are pushed as they are
applied, not as this node's batches commit. The newest are kept in memory, for a replay's
last step to live; a ``from`` past what this node applied is judged again once the log
is read to its end.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from tidal.server.core import feed
from tidal.server.core.batch import Batch
from tidal.server.core.feed import Change
from tidal.server.core.replies import Replier

from .committer import Committer
from .publisher import Feed
from .subscriber import Subscription

#: the newest events kept in memory, for a replay's last step to live
RECENT: Final = 10_000


class LoggedFeed(Feed):
    def __init__(
        self,
        last_id: int,
        committer: Committer,
        clock: Callable[[], int],
        *,
        heartbeat: float = 5.0,
        retention: float = 0.0,
    ) -> None:
        super().__init__(last_id, committer, clock, heartbeat=heartbeat, retention=retention)
        self.recent: deque[Change] = deque(maxlen=RECENT)
        #: ``synced_subscribe``, once the log was read to its end (``replica.route``)
        self.resync: Callable[[Replier, int | None, list[Any]], None] | None = None
        #: the consumer groups', if this node serves them (``group_lead``)
        self.taken: Callable[[list[Change]], None] | None = None

    def prepare(self, batch: Batch) -> None:
        """Its events take their ids in its transaction, from the commit log's row."""

    def _publish(self, batch: Batch) -> None:
        """Pushed as applied (``applied``), in log order."""

    def _resynced(self, conn: Replier, msgid: int | None, args: list[Any]) -> bool:
        """``from`` may be an event read from another node that this one has not applied
        yet: judged against the log's end, not this node's."""
        if self.resync is None:
            return False
        self.resync(conn, msgid, args)
        return True

    def _seen(self, rows: list[feed.EventRow]) -> tuple[list[feed.EventRow], bool]:
        """The table may hold events of other nodes' commits this node has not applied:
        they reach the subscriber live, as they are applied, in log order."""
        if not rows or rows[-1][0] <= self.last_id:
            return rows, len(rows) < feed.PAGE
        return rows[: bisect.bisect(rows, self.last_id, key=lambda row: row[0])], True

    def _went_through(self, sub: Subscription, rows: list[feed.EventRow], head: int) -> None:
        if rows:
            sub.position = rows[-1][0]
        if not self._catch_up(sub):
            self.read_on(sub)

    def applied(self, changes: list[Change]) -> None:
        """A commit log record's events, this node's or another's, in log
        order: to every live subscriber."""
        self.last_id = changes[-1].id
        self.recent.extend(changes)
        self._push(changes)
        if self.taken is not None:
            self.taken(changes)

    def _catch_up(self, sub: Subscription) -> bool:
        """A replay past its last page, live once sent what was applied since
        that page was read (the page saw what had committed; records applied meanwhile,
        by the follower or with this batch, pushed only to subscribers live then). False
        if those are no longer all among the recent events: another page, then."""
        missed = [c for c in self.recent if c.id > sub.position]
        if sub.position < self.last_id and (not missed or missed[0].id != sub.position + 1):
            return False
        if missed:
            self._push(missed, [sub])
        sub.position = self.last_id
        sub.live = True
        return True
