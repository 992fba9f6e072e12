"""One subscriber of the change feed: where it is, what it takes, and whether it keeps up.

The rule for lagging lives here, once: a subscriber is judged, whenever something is
ready for it, by what is still unsent from before (what was just made is no slow
reader), against the bounds in ``protocol.limits``. A replay queues at most a page, so it
is judged by time instead: one whose next page has waited for room through
``STALL_BEATS`` heartbeats, its reader taking nothing, lags too; else it would hold
retention back for ever.
"""

from __future__ import annotations

from typing import Final, Protocol

from tidal.protocol.limits import FEED_MAX_QUEUED_BYTES, FEED_MAX_QUEUED_EVENTS
from tidal.server.core.replies import Replier

#: heartbeats a replay's next page may wait for its reader to take anything: 10-15 s at
#: the default ``--feed-heartbeat`` of 5 s
STALL_BEATS: Final = 3


class Owner(Protocol):
    """The feed, as its subscribers call back to it."""

    def read_on(self, sub: Subscription) -> None: ...

    def drop(self, sub: Subscription) -> None: ...

    def lagging(self, sub: Subscription) -> None: ...


class Subscription:
    __slots__ = (
        "conn", "kinds", "last_sent", "live", "msgid", "owner", "position", "queued", "stalls",
        "waiting",
    )  # fmt: skip

    def __init__(
        self, conn: Replier, kinds: frozenset[int] | None, position: int, owner: Owner
    ) -> None:
        self.conn = conn
        self.kinds = kinds  # None: every event
        self.position = position  # every event up to this id is sent, or filtered out
        self.last_sent = position  # the last event written to it (``lagging`` says)
        self.live = False  # caught up: pushed each batch's events as it commits
        #: the ``subscribe`` still unanswered: its reply waits for the first page
        self.msgid: int | None = None
        self.queued = 0  # events written since its transport last had room
        self.waiting = False  # the next page waits for its transport to drain
        self.stalls = 0  # heartbeats it has waited so, its reader taking nothing
        self.owner = owner

    def behind(self) -> bool:
        """More than the bound is still unsent from before: it does not keep up."""
        return self.queued > FEED_MAX_QUEUED_EVENTS or self.conn.unsent() > FEED_MAX_QUEUED_BYTES

    def stalled(self) -> bool:
        """At a heartbeat: a replay whose reader has taken nothing for ``STALL_BEATS``."""
        if not self.waiting:
            return False
        self.stalls += 1
        return self.stalls >= STALL_BEATS

    def send(self, data: bytes, events: int, last: int) -> int:
        """``events`` written at once, or none (it lagged, and is closed): how many went."""
        if self.behind():
            self.owner.lagging(self)
            return 0
        conn = self.conn
        conn.push(data)
        self.last_sent = last
        self.queued = self.queued + events if conn.blocked() else 0
        return events

    # -- the Listener its connection tells --------------------------------

    def writable(self) -> None:
        self.queued = 0
        self.stalls = 0
        if self.waiting:
            self.waiting = False
            self.owner.read_on(self)

    def lost(self) -> None:
        self.owner.drop(self)
