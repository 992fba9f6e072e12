"""The change feed: each committed event pushed to every live subscriber before the replies
of the batch that committed it, and replayed from the events table from any id kept.

Live: once a batch has committed, its events go to every live subscriber's transport,
and only then its replies (``Committer._deliver``), so that whoever reads the ack of a
leave finds every connected subscriber already sent it. Replay: a subscriber with
``from`` reads pages of the table through the writer, each before its batch's writes,
so that a page holds exactly what committed before that batch. The page that comes
back short is the last, and that batch's own events are then pushed to it live:
nothing between replay and live is missed or sent twice.

A subscriber that does not keep up is told ``lagging`` and closed: writers never wait
for it, and what is queued for it stays bounded. Retention never deletes an event a
replay still has to read, and a replay whose reader stops reading is closed so too
(``Subscription.stalled``): it holds retention back for seconds, not for ever.
"""

from __future__ import annotations

import asyncio
import bisect
import logging
from collections import deque
from collections.abc import Callable
from typing import Any, Final

import msgpack

from tidal.protocol import ErrorCode, notification_head
from tidal.protocol.refusals import InvalidParams
from tidal.server.core import feed
from tidal.server.core.batch import Batch
from tidal.server.core.feed import Change, FeedRead
from tidal.server.core.replies import Replier
from tidal.server.storage import events
from tidal.server.storage.sqlbulk import Dialect, Plan

from .committer import Committer
from .cycle import Participant
from .subscriber import Subscription

log = logging.getLogger("tidal.feed")

EVENT: Final = notification_head("event")
_HEARTBEAT: Final = notification_head("heartbeat")
_LAGGING: Final = notification_head("lagging")
#: between retention passes once caught up: a tenth of the retention, within these bounds
PASS_MIN_SECONDS: Final = 1.0
PASS_MAX_SECONDS: Final = 60.0
#: cluster mode: the newest events kept in memory, for a replay's last step to live
RECENT: Final = 10_000


class Feed(Participant):
    def __init__(
        self,
        last_id: int,
        committer: Committer,
        clock: Callable[[], int],
        *,
        heartbeat: float = 5.0,
        retention: float = 0.0,
    ) -> None:
        self.last_id = last_id  # the last event committed
        self._next_id = last_id + 1  # the id the next batch's first event takes
        self._committer = committer
        self._clock = clock
        self._heartbeat = heartbeat
        self.retention = retention  # seconds; 0 keeps every event
        self._subs: dict[Replier, Subscription] = {}
        self._pages: dict[FeedRead, Subscription] = {}  # pages the writer is to read
        self._stalled: set[Subscription] = set()  # replays whose page failed: read again
        self._beat: asyncio.TimerHandle | None = None
        self._retire: asyncio.TimerHandle | None = None
        self.sent = 0  # events written to subscribers since boot
        self.lagged = 0  # subscribers closed for lagging since boot
        self.retired = 0  # events deleted by retention since boot
        #: set once a retention pass finds less than a full chunk to delete
        self.caught_up = asyncio.Event()
        #: cluster mode: events come from the commit log, every node's, their ids given in
        #: the transactions (``engine.replica``); the newest are kept for replays going live
        self.cluster = False
        self.recent: deque[Change] = deque(maxlen=RECENT)
        #: ... and ``synced_subscribe`` once the log was read to its end (``replica``)
        self.resync: Callable[[Replier, int | None, list[Any]], None] | None = None

    def __len__(self) -> int:
        return len(self._subs)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._beat = loop.call_later(self._heartbeat, self._tick)
        if self.retention > 0:
            self._retire = loop.call_later(0.0, self._retire_due)

    def stop(self) -> None:
        for timer in (self._beat, self._retire):
            if timer is not None:
                timer.cancel()
        self._beat = self._retire = None

    # -- the requests -----------------------------------------------------

    def subscribe(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        self._subscribe(conn, msgid, args, synced=False)

    def synced_subscribe(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        """Cluster mode: a subscribe read once the log was read to its end."""
        self._subscribe(conn, msgid, args, synced=True)

    def _subscribe(self, conn: Replier, msgid: int | None, args: list[Any], synced: bool) -> None:
        after, names = args[0]  # checked and parsed at the edge (``core.edge``)
        if conn in self._subs:
            raise InvalidParams("subscribe: this connection is subscribed already; unsubscribe")
        if after is not None and after > self.last_id:
            if self.resync is not None and not synced:
                # cluster mode: ``from`` may be an event read from another node that this
                # one has not applied yet: judged against the log's end, not this node's
                self.resync(conn, msgid, args)
                return
            raise InvalidParams(f"options.from: {after} is past the last event id, {self.last_id}")
        kinds = None if names is None else frozenset(feed.KINDS[name] for name in names)
        sub = Subscription(conn, kinds, self.last_id if after is None else after, self)
        self._subs[conn] = sub
        conn.listener = sub
        if sub.position == self.last_id:  # nothing to replay: live from now
            sub.live = True
            conn.reply(msgid, {"last_id": self.last_id})
            return
        if msgid is None:  # a notification: nothing to answer, its place in flight ends
            conn.reply(None, None)
        sub.msgid = msgid
        self.read_on(sub)

    def unsubscribe(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        sub = self._subs.get(conn)
        if sub is not None:
            self.drop(sub)
            if sub.msgid is not None:  # its replay had not begun: that subscribe ends now
                message = "subscribe: cancelled by unsubscribe before its replay began"
                conn.reply_error(sub.msgid, ErrorCode.INVALID_REQUEST, message)
        conn.reply(msgid, sub is not None)

    # -- around each commit ----------------------------------------------

    def prepare(self, batch: Batch) -> None:
        """The batch's events take their ids, now that it is next to commit (cluster mode:
        in its transaction, from the commit log's row)."""
        if not self.cluster:
            for change in batch.changes:
                change.id = self._next_id
                self._next_id += 1
        if batch.retire_events is not None:  # never an event a replay has still to read
            waiting = [sub.position for sub in self._subs.values() if not sub.live]
            batch.retire_events = (batch.retire_events[0], min(waiting, default=self.last_id))

    def reads(self, batch: Batch) -> Plan[None]:
        """The pages subscribers replay: what committed before this batch."""
        for page in batch.feed_reads:
            yield from events.read(page)

    def writes(self, batch: Batch) -> bool:
        return batch.retire_events is not None

    def plan(self, batch: Batch, d: Dialect) -> Plan[int]:
        """The batch's events, and retention's chunk: how many old events it deleted."""
        return (yield from events.write(batch))

    def committed(self, batch: Batch, found: int | None) -> None:
        """Before the batch's replies: its pages to their subscribers, then its events."""
        head = self.last_id  # the last event committed before this batch: what its pages saw
        for page in batch.feed_reads:
            sub = self._pages.pop(page, None)
            if sub is not None:
                self._replayed(sub, page, head)
        if batch.changes and not self.cluster:  # cluster mode: pushed as applied
            self.last_id = batch.changes[-1].id
            self._push(batch.changes)
        if batch.retire_events is not None and found is not None:
            self.retired += found
            if found >= feed.RETIRE_EVENTS:
                self.caught_up.clear()
                self._retire_due()  # more to do: the next batch takes the next chunk
            else:
                self.caught_up.set()
        if self._stalled:  # a commit went through: the replays whose page failed go on
            stalled, self._stalled = self._stalled, set()
            for sub in stalled:
                self.read_on(sub)

    def failed(self, batch: Batch, later: Batch, unknown: bool) -> None:
        """A refused batch gives its ids back; its pages are read again later (a first page
        is refused, as any read whose commit failed)."""
        if batch.changes and batch.changes[0].id:
            self._next_id = batch.changes[0].id
        for refused in (batch, later):
            for page in refused.feed_reads:
                sub = self._pages.pop(page, None)
                if sub is None:
                    continue
                if sub.msgid is not None:
                    self.drop(sub)
                    message = "storage unavailable: the events could not be read; subscribe again"
                    sub.conn.reply_error(sub.msgid, ErrorCode.UNAVAILABLE, message)
                    sub.conn.flush()
                else:
                    self._stalled.add(sub)

    # -- replay and push ---------------------------------------------------

    def read_on(self, sub: Subscription) -> None:
        """The next page of ``sub``'s replay, read with the next commit."""
        if self._subs.get(sub.conn) is not sub:
            return
        page = FeedRead(sub.position)
        self._pages[page] = sub
        self._committer.open.feed_reads.append(page)
        self._committer.wake()

    def _replayed(self, sub: Subscription, page: FeedRead, head: int) -> None:
        if self._subs.get(sub.conn) is not sub:
            return  # unsubscribed, or gone, since
        conn = sub.conn
        oldest = head + 1 if page.oldest is None else page.oldest
        if sub.position + 1 < oldest:
            self._too_old(sub, oldest)
            return
        if sub.msgid is not None:
            conn.reply(sub.msgid, {"last_id": head})
            conn.flush()
            sub.msgid = None
        rows = page.rows
        last_page = len(rows) < feed.PAGE
        if self.cluster and rows and rows[-1][0] > self.last_id:
            # the table holds events of other nodes' commits this node has not applied:
            # they reach this subscriber live, as they are applied, in log order
            rows = rows[: bisect.bisect(rows, self.last_id, key=lambda row: row[0])]
            last_page = True
        kinds = sub.kinds
        mine = [(i, EVENT + data) for i, kind, data in rows if kinds is None or kind in kinds]
        if mine:
            conn.push(b"".join(data for _, data in mine))
            sub.last_sent = mine[-1][0]
            self.sent += len(mine)
        if last_page and self.cluster:
            if rows:
                sub.position = rows[-1][0]
            if not self._catch_up(sub):
                self.read_on(sub)
            return
        if last_page:  # caught up with every event committed before this batch
            sub.position = head
            sub.live = True
            return
        sub.position = rows[-1][0]
        if conn.blocked():
            sub.waiting = True  # paced by the reader: the next page once it has room
        else:
            self.read_on(sub)

    def _too_old(self, sub: Subscription, oldest: int) -> None:
        kept = f"kept for {self.retention:g} s, --event-retention" if self.retention else "kept"
        message = (
            f"options.from: the events after {sub.position} are no longer kept ({kept}); the"
            f" oldest kept is {oldest}: rebuild from the current state, then subscribe"
            " without from (its reply's last_id is where that state stands)"
        )
        self.drop(sub)
        if sub.msgid is not None:
            sub.conn.reply_error(sub.msgid, ErrorCode.INVALID_PARAMS, message)
            sub.conn.flush()
        else:  # retention keeps what a replay needs: never expected
            log.error("replay for %s: %s", sub.conn, message)
            sub.conn.end(msgpack.packb([2, "error", [int(ErrorCode.INVALID_PARAMS), message]]))

    def applied(self, changes: list[Change]) -> None:
        """Cluster mode: a commit log record's events, this node's or another's, in log
        order: to every live subscriber."""
        self.last_id = changes[-1].id
        self.recent.extend(changes)
        self._push(changes)

    def _catch_up(self, sub: Subscription) -> bool:
        """Cluster mode: a replay past its last page, live once sent what was applied since
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

    def _push(self, changes: list[Change], subs: list[Subscription] | None = None) -> None:
        live = [sub for sub in self._subs.values() if sub.live] if subs is None else subs
        if not live:
            return
        notes = [EVENT + change.data for change in changes]
        everything = b"".join(notes)
        last = changes[-1].id
        for sub in live:
            kinds = sub.kinds
            if kinds is None:
                self.sent += sub.send(everything, len(notes), last)
            else:
                mine = [i for i, c in enumerate(changes) if c.kind in kinds]
                if mine:
                    data = b"".join(notes[i] for i in mine)
                    self.sent += sub.send(data, len(mine), changes[mine[-1]].id)
            sub.position = last

    def lagging(self, sub: Subscription) -> None:
        log.warning(
            "closing subscriber %s: lagging, %d bytes unsent (the last event sent: %d)",
            getattr(sub.conn, "peer", "?"),
            sub.conn.unsent(),
            sub.last_sent,
        )
        self.lagged += 1
        self.drop(sub)
        sub.conn.end(_LAGGING + msgpack.packb({"last_sent": sub.last_sent}))

    def drop(self, sub: Subscription) -> None:
        self._stalled.discard(sub)
        if self._subs.get(sub.conn) is sub:
            del self._subs[sub.conn]
            sub.conn.listener = None

    # -- timers -------------------------------------------------------------

    def _tick(self) -> None:
        """A heartbeat to every subscriber whose subscribe is answered, so that a quiet
        feed can be told from a dead link; and replays whose page failed, tried again."""
        self._beat = asyncio.get_running_loop().call_later(self._heartbeat, self._tick)
        beat = _HEARTBEAT + msgpack.packb({"last_id": self.last_id})
        for sub in list(self._subs.values()):
            if sub.msgid is not None:
                continue
            if sub.behind() or sub.stalled():
                self.lagging(sub)
                continue
            sub.conn.push(beat)
        if self._stalled:
            stalled, self._stalled = self._stalled, set()
            for sub in stalled:
                self.read_on(sub)

    def _retire_due(self) -> None:
        if self._retire is not None:
            self._retire.cancel()
        delay = min(PASS_MAX_SECONDS, max(PASS_MIN_SECONDS, self.retention / 10))
        self._retire = asyncio.get_running_loop().call_later(delay, self._retire_due)
        if self._committer.failed_for_good is not None:
            return
        batch = self._committer.open
        if batch.retire_events is None:
            batch.retire_events = (self._clock() - int(self.retention * 1e9), 0)
            self._committer.wake()
