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
for it, and what is queued for it stays bounded; a replay whose reader stops reading is
closed so too (``Subscription.stalled``). No subscriber holds retention back
(``event_retention``): a replay whose next events were deleted under it is ended with
the same error as a ``from`` too old, naming the oldest kept.
"""

from __future__ import annotations

import asyncio
import logging
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
        self.retention = retention  # seconds; 0 keeps every event (``event_retention``)
        self._subs: dict[Replier, Subscription] = {}
        self._pages: dict[FeedRead, Subscription] = {}  # pages the writer is to read
        self._stalled: set[Subscription] = set()  # replays whose page failed: read again
        self._beat: asyncio.TimerHandle | None = None
        self.sent = 0  # events written to subscribers since boot
        self.lagged = 0  # subscribers closed for lagging since boot

    def __len__(self) -> int:
        return len(self._subs)

    def start(self) -> None:
        self._beat = asyncio.get_running_loop().call_later(self._heartbeat, self._tick)

    def stop(self) -> None:
        if self._beat is not None:
            self._beat.cancel()
            self._beat = None

    # -- the requests -----------------------------------------------------

    def subscribe(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        self._subscribe(conn, msgid, args, synced=False)

    def synced_subscribe(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        """Cluster mode: a subscribe read once the log was read to its end."""
        self._subscribe(conn, msgid, args, synced=True)

    def _subscribe(self, conn: Replier, msgid: int | None, args: list[Any], synced: bool) -> None:
        after, names, _ = args[0]  # checked and parsed at the edge (``core.edge``)
        if conn in self._subs:
            raise InvalidParams("subscribe: this connection is subscribed already; unsubscribe")
        if after is not None and after > self.last_id:
            if not synced and self._resynced(conn, msgid, args):
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

    def _resynced(self, conn: Replier, msgid: int | None, args: list[Any]) -> bool:
        """A ``from`` past the last event: whether it is judged again later (cluster mode)."""
        return False

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
        """The batch's events take their ids, now that it is next to commit."""
        for change in batch.changes:
            change.id = self._next_id
            self._next_id += 1

    def reads(self, batch: Batch) -> Plan[None]:
        """The pages subscribers replay: what committed before this batch."""
        for page in batch.feed_reads:
            yield from events.read(page)

    def plan(self, batch: Batch, d: Dialect) -> Plan[None]:
        """The batch's events."""
        yield from events.write(batch)

    def committed(self, batch: Batch, found: None) -> None:
        """Before the batch's replies: its pages to their subscribers, then its events."""
        head = self.last_id  # the last event committed before this batch: what its pages saw
        for page in batch.feed_reads:
            sub = self._pages.pop(page, None)
            if sub is not None:
                self._replayed(sub, page, head)
        self._publish(batch)
        if self._stalled:  # a commit went through: the replays whose page failed go on
            stalled, self._stalled = self._stalled, set()
            for sub in stalled:
                self.read_on(sub)

    def _publish(self, batch: Batch) -> None:
        if batch.changes:
            self.last_id = batch.changes[-1].id
            self._push(batch.changes)

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
        rows, last_page = self._seen(page.rows)
        kinds = sub.kinds
        mine = [(i, EVENT + data) for i, kind, data in rows if kinds is None or kind in kinds]
        if mine:
            conn.push(b"".join(data for _, data in mine))
            sub.last_sent = mine[-1][0]
            self.sent += len(mine)
        if last_page:
            self._went_through(sub, rows, head)
            return
        sub.position = rows[-1][0]
        if conn.blocked():
            sub.waiting = True  # paced by the reader: the next page once it has room
        else:
            self.read_on(sub)

    def _seen(self, rows: list[feed.EventRow]) -> tuple[list[feed.EventRow], bool]:
        """A page's rows to send, and whether it is the last."""
        return rows, len(rows) < feed.PAGE

    def _went_through(self, sub: Subscription, rows: list[feed.EventRow], head: int) -> None:
        """``sub``'s replay read its last page: it has every event committed before this
        batch, whose own are pushed to it live."""
        sub.position = head
        sub.live = True

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
        else:  # retention deleted what the replay was to read next
            log.warning("replay for %s ended: %s", getattr(sub.conn, "peer", "?"), message)
            sub.conn.end(msgpack.packb([2, "error", [int(ErrorCode.INVALID_PARAMS), message]]))

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
