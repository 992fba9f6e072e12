"""Consumer groups in the commit cycle: each group reads the feed into its window, and
what it sends is decided as the writer takes a batch, written in that batch (the event's
count, durable), and pushed once it commits, before the batch's replies.

A group that has read to the feed's end takes each batch's own events as the writer
takes the batch, and sends them in it: the live path costs no commit of its own. One
behind reads pages of the events table, a page a commit, into the room its window has;
the page that reaches the end takes its batch's events too, and the group is live from
then. A page that finds events deleted before the group read them (``--event-retention``)
records the range lost: the group's consumers are closed with an error naming it, and
every subscribe to the group is refused with it until ``group_reset``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import msgpack

from tidal.protocol import ErrorCode
from tidal.server.core import feed
from tidal.server.core.batch import Batch
from tidal.server.core.feed import Change, FeedRead
from tidal.server.core.group_batch import GroupPage, GroupWrites, Sent, Undone
from tidal.server.core.group_parts import DEAD, OPTOUTS, Consumer, Entry
from tidal.server.core.groups import Group
from tidal.server.group_metrics import Figures
from tidal.server.storage import events, groups_sql
from tidal.server.storage.sqlbulk import Dialect, Plan

from .committer import Committer
from .cycle import Participant
from .group_consumer import HEARTBEAT, lost_message, push
from .group_figures import figures
from .publisher import Feed

log = logging.getLogger("tidal.groups")


def built(loaded: list[groups_sql.Loaded]) -> dict[str, Group]:
    """The groups as the database holds them (``groups_sql.load``)."""
    groups = {}
    for spec, cursor, lost, kept, recorded in loaded:
        group = Group(spec, cursor, lost, recorded=recorded)
        for entry in kept:
            if entry.state == DEAD:
                group.dead[entry.id] = entry
                group.dead_users[entry.user] = group.dead_users.get(entry.user, 0) + 1
            else:
                entry.revived = True
                group.revived[entry.id] = entry
        groups[spec.name] = group
    return groups


class Groups(Participant):
    def __init__(
        self,
        loaded: list[groups_sql.Loaded],
        feed: Feed,
        committer: Committer,
        clock: Callable[[], int],
        heartbeat: float = 5.0,
        *,
        live: bool = True,
    ) -> None:
        self._feed = feed
        self._committer = committer
        self._clock = clock
        self.groups = built(loaded)
        #: a group at the feed's end takes each batch's events as the writer takes it (one
        #: node); cluster mode's as the log applies them, ids given (``group_lead``)
        self._live = live
        self._reading: set[Group] = set()  # a page under way
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0
        self._heartbeat = heartbeat
        self._beat: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._beat = asyncio.get_running_loop().call_later(self._heartbeat, self._tick)
        self.due()

    def stop(self) -> None:
        for timer in (self._timer, self._beat):
            if timer is not None:
                timer.cancel()
        self._timer = self._beat = None

    def _tick(self) -> None:
        """The feed's heartbeat, to each consumer: a quiet group told from a dead link."""
        self._beat = asyncio.get_running_loop().call_later(self._heartbeat, self._tick)
        beat = HEARTBEAT + msgpack.packb({"last_id": self._feed.last_id})
        for group in self.groups.values():
            for consumer in group.consumers.values():
                consumer.conn.push(beat)

    def figures(self) -> list[Figures]:
        """For the metrics, from their own thread."""
        return figures(list(self.groups.values()), self._feed.last_id, self._clock())

    def due(self) -> None:
        """Something may be sent, or read: the next batch makes a pass."""
        if self.groups:
            self._committer.open.group_writes()
            self._committer.wake()

    # -- the cycle -------------------------------------------------------------

    def prepare(self, batch: Batch) -> None:
        if not self.groups or (batch.groups is None and not batch.changes):
            if batch.groups is not None:  # the last group was dropped: what is left of it
                batch.groups.freeze()
            return  # a batch of signals: nothing new for a group (``due`` marks one that has)
        now = self._clock()
        head = self._feed.last_id  # committed: one batch commits at a time
        w = batch.group_writes()
        for group in self.groups.values():
            if group not in self._reading:
                if group.read_to == head and self._live:
                    self._take_live(w, group, batch.changes)
                elif group.read_to < head and group.room() > 0:
                    tail = list(batch.changes) if self._live else []  # ids given: taken so
                    read = FeedRead(group.read_to)
                    page = GroupPage(group, read, head, group.epoch, tail)
                    w.pages.append(page)
                    self._reading.add(group)
            for entry, first_ns, sent_ns in group.assign(now):
                w.sent.append(Sent(group, entry, entry.deliveries - 1, first_ns, sent_ns))
                w.record(group, entry, entry.revived)
            cursor = group.cursor()
            if cursor != group.saved:  # acknowledged, dead-lettered or passed over
                w.cursors[group.name] = (max(group.saved, 0), cursor)
                group.saved = cursor
        w.freeze()
        self._schedule(now)

    def _take_live(self, w: GroupWrites, group: Group, changes: list[Change]) -> None:
        if not changes:
            return
        before = group.read_to
        taken = []
        for change in changes:
            if group.room() <= 0:
                break  # the rest is read from the table, as the window empties
            group.take(Entry(change.id, change.kind, change.user_id, change.at_ns, b""))
            taken.append(change.id)
        w.taken.append((group, before, taken, group.epoch))

    def reads(self, batch: Batch) -> Plan[None]:
        if batch.groups is not None:
            for page in batch.groups.pages:
                yield from events.read(page.read)

    def writes(self, batch: Batch) -> bool:
        return (batch.groups is not None and batch.groups.writes()) or any(
            change.kind in OPTOUTS for change in batch.changes
        )

    def plan(self, batch: Batch, d: Dialect) -> Plan[None]:
        yield from groups_sql.optouts(batch)
        if batch.groups is not None:
            yield from groups_sql.write(batch.groups)

    def committed(self, batch: Batch, found: Any) -> None:
        w = batch.groups
        if w is None:
            return
        data = {change.id: change.data for change in batch.changes}
        for group, _, ids, _ in w.taken:
            for i in ids:
                entry = group.find(i) or group.dead.get(i)  # its consumer may have gone since
                if entry is not None:
                    entry.data = data[i]
        push(w.sent)
        more = False
        for page in w.pages:
            self._reading.discard(page.group)
            if self.groups.get(page.group.name) is page.group and page.epoch == page.group.epoch:
                more = self._paged(page) or more
        if more:
            self.due()

    def failed(self, batch: Batch, later: Batch, unknown: bool) -> None:
        w = batch.groups
        if w is None:
            return
        for sent in reversed(w.sent):
            sent.group.unsend(sent.entry, sent.deliveries, sent.first_ns, sent.sent_ns)
        for group, before, ids, epoch in w.taken:
            if group.epoch == epoch:
                group.untake(ids, before)
        for page in w.pages:
            self._reading.discard(page.group)
        for group in self.groups.values():
            group.saved = -1  # its cursor is recorded again
        self.due()

    # -- pushing and reading ------------------------------------------------------

    def _paged(self, page: GroupPage) -> bool:
        """A page read for ``page.group``: True if there is more to read or send."""
        group, read = page.group, page.read
        oldest = page.head + 1 if read.oldest is None else read.oldest
        if group.read_to + 1 < oldest:
            self._lose(group, (group.read_to + 1, oldest - 1))
            group.read_to = oldest - 1
        took = 0
        for event_id, kind, blob in read.rows:
            if event_id <= group.read_to:
                continue
            if group.room() <= 0 or event_id > page.head:
                return True
            event = msgpack.unpackb(blob)
            group.take(Entry(event_id, kind, event.get("user_id"), event["at_ns"], blob))
            took += 1
        if len(read.rows) >= feed.PAGE or group.read_to < page.head:
            return True
        for change in page.tail:  # the page reached its batch: that batch's events follow
            if group.room() <= 0:
                return True
            group.take(Entry(change.id, change.kind, change.user_id, change.at_ns, change.data))
            took += 1
        return took > 0 or group.read_to < self._feed.last_id

    def _lose(self, group: Group, lost: tuple[int, int]) -> None:
        first, last = lost
        if group.lost is not None:
            first = min(first, group.lost[0])
        group.lost = (first, last)
        self._committer.open.group_writes().lost[group.name] = group.lost
        message = lost_message(group.name, group.lost)
        log.error("%s", message)
        ending = msgpack.packb([2, "error", [int(ErrorCode.INVALID_PARAMS), message]])
        for consumer in list(group.consumers.values()):
            self.leave(group, consumer)
            consumer.conn.end(ending)

    # -- consumers ------------------------------------------------------------------

    def leave(self, group: Group, consumer: Consumer) -> None:
        """``consumer`` unsubscribed, or its connection ended: the others take its events."""
        if group.consumers.get(consumer.conn) is not consumer:
            return
        if consumer.conn.listener is not None:
            consumer.conn.listener = None
        self.killed(self._committer.open, group, group.leave(consumer, self._clock()))
        self.due()

    def killed(self, batch: Batch, group: Group, dead: list[Entry]) -> None:
        """Dead letters made now: stored with their data, pending again if refused."""
        if not dead:
            return
        w = batch.group_writes()
        for entry in dead:
            w.record(group, entry, True)
        batch.undo.append(Undone.each(group.unkill, dead))

    def expire(self) -> None:
        """Events out past their ``ack_wait``, sent again, or dead letters."""
        self._timer = None
        now = self._clock()
        for group in self.groups.values():
            again, dead = group.expired(now)
            self.killed(self._committer.open, group, dead)
            if again or dead:
                log.info(
                    "group %r: %d events sent again, %d dead letters after ack_wait",
                    group.name,
                    len(again),
                    len(dead),
                )
        self.due()

    def _schedule(self, now: int) -> None:
        """The timer, at the first ``ack_wait`` to pass or the first nack delay to end."""
        times = [t for g in self.groups.values() if (t := g.next_expiry()) is not None]
        times += [
            e.not_before
            for g in self.groups.values()
            for e in g.ready.values()
            if e.not_before > now
        ]
        if not times:
            return
        at = min(times)
        if self._timer is not None and self._timer_at <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = at
        self._timer = asyncio.get_running_loop().call_later(max(0.0, (at - now) / 1e9), self.expire)
