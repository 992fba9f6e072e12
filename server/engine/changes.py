"""The writes that change who and what counts, rather than add a signal: leave,
rejoin, purge, erase, and defining or dropping a cohort.

Each is applied at once, like a signal, and recorded in the open batch with a
line of the user's history and an event of the change feed; its reply waits for
the commit. A purge or erase reaches the user's rows read before it; it is
surveyed first, and joins a batch, with its line and event, once it has been
(``engine.withdrawals``).
"""

from __future__ import annotations

from typing import Any

from tidal.server.core import feed
from tidal.server.core.asks import CohortAsk
from tidal.server.core.batch import Batch
from tidal.server.core.feed import Change
from tidal.server.core.members import Membership
from tidal.server.core.past import LEAVE, REJOIN, Event, Withdrawal
from tidal.server.core.replies import NOTHING_SAVED, UNKNOWN_SAVED, Later, Replier
from tidal.server.core.timeline import Timeline

from .shape import EngineState


class Changes:
    def __init__(self, engine: EngineState, timeline: Timeline) -> None:
        self._e = engine
        self._timeline = timeline

    def leave(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        user_id, purge = args  # checked and parsed at the edge (``core.edge``), as below
        batch = self._e.committer.writable()
        self._e.router.check(user_id, batch)
        membership = self._e.members.leave(batch, user_id, self._timeline.now())
        at = membership.left_at_ns
        assert at is not None  # a leave has its time
        self._line(batch, user_id, LEAVE, at)
        batch.changes.append(Change(feed.LEAVE, at, user_id, at))
        if not purge:
            self._e.committer.ack(conn, msgid, membership.wire())
            return
        # the leave is committed at once, with its event; the purge, with an event of its
        # own (a filter on "purge" sees it), takes effect a commit or two later, and the
        # reply goes with it (refused if the leave's batch is)
        w = Withdrawal(user_id, self._e.next_seq(), erase=False)
        saved = "the leave is saved (the user is Left)"
        self._e.past.surveys.ask(w, conn, msgid, Outcome(w, membership, saved, batch), saved)

    def rejoin(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        user_id: int = args[0]
        batch = self._e.committer.writable()
        self._e.router.check(user_id, batch)
        membership = self._e.members.rejoin(batch, user_id)
        if membership is not None:
            at = self._timeline.now()
            self._line(batch, user_id, REJOIN, at)
            batch.changes.append(Change(feed.REJOIN, at, user_id, membership.left_at_ns))
            self._e.committer.ack(conn, msgid, membership.wire())
        else:  # already active: nothing was written
            self._e.committer.answer(conn, msgid, self._e.members.status(user_id).wire())

    def purge(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        user_id: int = args[0]
        self._e.committer.writable()  # refused now, if writes are
        self._e.router.check(user_id)  # checked again as it joins its batch (``surveys``)
        w = Withdrawal(user_id, self._e.next_seq(), erase=False)
        self._e.past.surveys.ask(w, conn, msgid, Outcome(w))

    def erase(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        """Right to erasure: the rows go, with all they added; the user stays Left, so
        that a stale client's later signals are gated (kept as the ledger's only)."""
        user_id: int = args[0]
        batch = self._e.committer.writable()
        self._e.router.check(user_id, batch)
        w = Withdrawal(user_id, self._e.next_seq(), erase=True)
        self._e.keys.erasing(batch, user_id, w.before_seq)
        saved = ""
        if not self._e.members.is_left(user_id):
            left = self._e.members.leave(batch, user_id, self._timeline.now()).left_at_ns
            assert left is not None  # a leave has its time
            self._timeline.saw(left)
            saved = "the user is Left, as the erase was read"
        w.left_at_ns = self._e.members.status(user_id).left_at_ns
        self._e.past.surveys.ask(w, conn, msgid, Outcome(w, None, saved, batch), saved)

    def _line(self, batch: Batch, user_id: int, event: int, at_ns: int) -> None:
        """A line of the user's history, written with the change it records."""
        self._timeline.saw(at_ns)
        batch.history.append(Event(user_id, at_ns, event))

    def _feed_event(self, batch: Batch, change: Change) -> None:
        """An event that is no line of a user's history, timed as the events are."""
        change.at_ns = self._timeline.take()
        batch.changes.append(change)

    def define_cohort(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        name, predicate = args
        batch = self._e.committer.writable()
        if self._e.owners is not None:
            self._ask(conn, msgid, batch, name, predicate)
        elif self._e.cohorts.define(batch, name, predicate):
            self._feed_event(batch, Change(feed.DEFINE_COHORT, 0, name=name, predicate=predicate))
            self._e.committer.ack(conn, msgid, True)
        else:  # the same cohort again: its counts go on
            self._e.committer.answer(conn, msgid, True)

    def drop_cohort(self, conn: Replier, msgid: int | None, args: list[Any]) -> None:
        name: str = args[0]
        batch = self._e.committer.writable()
        if self._e.owners is not None:
            self._ask(conn, msgid, batch, name, None)
        elif self._e.cohorts.drop(batch, name):
            self._feed_event(batch, Change(feed.DROP_COHORT, 0, name=name))
            self._e.committer.ack(conn, msgid, True)
        else:
            self._e.committer.answer(conn, msgid, False)

    def _ask(
        self, conn: Replier, msgid: int | None, batch: Batch, name: str, predicate: Any
    ) -> None:
        """Cluster mode, read once the log was read to its end (``replica.synced``): on
        every node once committed, through the log (``core.log``)."""
        kind = feed.DROP_COHORT if predicate is None else feed.DEFINE_COHORT
        ask = CohortAsk(name, predicate, Change(kind, 0, name=name, predicate=predicate))
        if self._e.cohorts.ask(batch, ask):
            self._feed_event(batch, ask.event)
            batch.asks.append(ask)
            self._e.committer.ack(conn, msgid, ask)
        else:
            self._e.committer.answer(conn, msgid, ask.result)


class Outcome(Later):
    """The reply to a purge, an erase or a leave with purge: known once committed."""

    __slots__ = ("asked_in", "membership", "saved", "withdrawal")
    is_read = False

    def __init__(self, withdrawal: Withdrawal, membership: Membership | None = None,
                 saved: str = "", asked_in: Batch | None = None) -> None:  # fmt: skip
        self.withdrawal = withdrawal
        self.membership = membership
        self.saved = saved  # what the request wrote as it was read: a leave
        self.asked_in = asked_in  # ... in this batch

    def refused(self, message: str, batches: tuple[Any, ...]) -> str:
        """The batch it joined is refused, after the one its leave is in was taken: the
        leave stays (or may: that one's outcome is unknown) and the refusal says so."""
        asked_in = self.asked_in
        if not self.saved or asked_in is None or any(b is asked_in for b in batches):
            return message
        head = message.removesuffix(NOTHING_SAVED)
        if asked_in.committed:
            tail = f"{self.saved}; the rest of this request was not saved: ask again"
        else:  # that batch's COMMIT was cut off, its outcome still to settle
            tail = f"{UNKNOWN_SAVED} ({self.saved} if the commit before holds; the rest was not)"
        return head + tail if head != message else f"{message} ({tail})"

    def answer(self) -> dict[str, Any]:
        w = self.withdrawal
        if self.membership is not None:
            return {**self.membership.wire(), "purged": w.signals}
        done = "erased" if w.erase else "purged"
        return {"user_id": w.user_id, done: w.signals, "at_ns": w.at_ns}
