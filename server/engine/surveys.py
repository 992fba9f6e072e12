"""Purges and erasures read, not yet in a batch: each surveyed on the storage's reader,
off the writer, then joining the open batch.

A withdrawal reaches the rows of its user read before it (``before_seq``, fixed as
it is read), but reading them inside a group commit would hold every client for
as long. So each is surveyed on the storage's reader, at a snapshot, one at a
time in the order read (a group of distinct users at once); then it joins the open
batch, with its history line, its change-feed event and its reply, and the writer adds
only the rows the snapshot could not see (``withdrawals`` takes it from there).

Until it has joined a batch, a read that could show what it withdraws waits
with it (``defer``): the zero window holds. A withdrawal asked for in a batch
that is then refused is refused too: its ``before_seq`` counted rows that were
never committed, and an erase's leave was undone with them.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections import deque
from collections.abc import Callable
from typing import Final

from tidal.protocol import ErrorCode
from tidal.protocol.refusals import ServerError, Unavailable, said
from tidal.server.core import feed
from tidal.server.core.batch import Batch
from tidal.server.core.feed import Change
from tidal.server.core.keys import Keys
from tidal.server.core.owners import Owners
from tidal.server.core.past import ERASE, PURGE, Event, Withdrawal
from tidal.server.core.replies import NOTHING_SAVED, UNKNOWN_SAVED, Later, Refusal, Replier
from tidal.server.core.rewrites import Rewrites, Rule
from tidal.server.core.timeline import Timeline
from tidal.server.core.userrows import UserRows
from tidal.server.errors import StorageFailure
from tidal.server.storage import past_sql as storage_past
from tidal.server.storage.interface import Storage

from .asked import Asked, first_group
from .committer import Committer

log = logging.getLogger("tidal.engine")

#: a failed read at boot, looking for the rows a rule still covers: tried again after
RESUME_RETRY: Final = 1.0
#: rules whose rows one read at boot finds: the blocks are read once for them all
RESUME_AT_ONCE: Final = 1000


class Surveys:
    def __init__(
        self,
        storage: Storage,
        committer: Committer,
        rewrites: Rewrites,
        decay: Callable[[], list[tuple[int, int]]],
        clock: Callable[[], int],
        keys: Keys,
        user_rows: UserRows,
        timeline: Timeline,
        owners: Owners | None,
    ) -> None:
        self._storage = storage
        self._committer = committer
        self.rewrites = rewrites
        self._decay = decay
        self._clock = clock
        self._keys = keys
        self._user_rows = user_rows
        self._timeline = timeline
        self._owners = owners
        self._asked: deque[Asked] = deque()  # read, not yet in a batch
        #: users with a withdrawal in a batch not yet committed: done when it is
        self._joined: dict[int, asyncio.Future[None]] = {}
        self._task: asyncio.Task[None] | None = None
        #: rules loaded (at boot, or with partitions taken) whose rows are still to find
        self._unresumed: dict[int, Rule] = {}
        self._started = False

    def resume(self, rules: dict[int, Rule]) -> None:
        """Rules read from the database: their rows are to be found, once started."""
        self._unresumed.update(rules)
        if rules and self._started:
            self._go()

    def start(self) -> None:
        self._started = True
        if self._unresumed:
            self._go()

    def _go(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tidal-past")

    async def close(self) -> None:
        """Every withdrawal read has joined a batch, or been refused."""
        if self._task is not None:
            await self._task

    def ask(
        self, w: Withdrawal, conn: Replier, msgid: int | None, reply: Later, saved: str = ""
    ) -> None:
        """``saved``: what the request wrote as it was read (a leave), which a refusal
        of the withdrawal does not take back, for the refusal to say."""
        self._asked.append(Asked(w, conn, msgid, reply, self._committer.open, saved))
        self._go()

    def waiting(self) -> bool:
        """Whether a withdrawal read has not joined a batch yet."""
        return bool(self._asked)

    def defer(self, conn: Replier, request: Callable[[], None]) -> None:
        """Handle ``request`` (a read of ``conn``'s) again once the last withdrawal read has
        joined its batch. Until then ``conn`` applies nothing it sent after it: the read
        answers as of its place in the connection's order, never with a later write."""
        conn.hold(True)

        def again() -> None:
            conn.hold(False)  # it goes on after this turn of the loop: ``request`` first
            request()

        self._asked[-1].deferred.append(again)

    # -- the batches they were read in, or joined ------------------------------

    def refused(self, batches: tuple[Batch, ...], unknown: bool = False) -> None:
        """``batches`` were refused: so is every withdrawal asked for while they were open.
        What one wrote as it was read (a leave) went with its batch: not saved, or, if that
        batch (the first) had its COMMIT cut off and never settled (``unknown``), perhaps
        saved."""
        refused = "storage unavailable: the batch this request was read in was refused"
        for a in [a for a in self._asked if a.asked_in in batches]:
            self._asked.remove(a)
            if a.saved and unknown and a.asked_in is batches[0]:
                a.refuse(f"{refused}, its COMMIT cut off; {UNKNOWN_SAVED}")
            else:
                a.refuse(f"{refused}; {NOTHING_SAVED}")
        for batch in batches:
            self.settle(batch)

    def unknown(self, batch: Batch, message: str) -> None:
        """``batch``'s COMMIT was cut off and its outcome is not known yet (the path to the
        database is silent): a withdrawal read while it was open waits for no outcome but
        is refused now with ``message``; what it wrote as it was read (a leave) went with
        ``batch``, perhaps saved. It never joined a batch: an erase's keys count again."""
        for a in [a for a in self._asked if a.asked_in is batch]:
            self._asked.remove(a)
            self._unerasing(a.w)
            a.refuse(message)

    def settle(self, batch: Batch) -> None:
        for w in batch.past:
            settled = self._joined.pop(w.user_id, None)
            if settled is not None and not settled.done():
                settled.set_result(None)

    def _record(self, w: Withdrawal, batch: Batch) -> None:
        """Its line of the user's history and its event of the feed, timed as it joins
        its batch; an erase's event tells the user's id and how much went, none of their
        data."""
        w.at_ns = self._timeline.take()
        batch.history.append(Event(w.user_id, w.at_ns, ERASE if w.erase else PURGE, w))
        if w.erase:
            change = Change(feed.ERASE, w.at_ns, w.user_id, w.left_at_ns, w)
        else:
            change = Change(feed.PURGE, w.at_ns, w.user_id, withdrawal=w)
        batch.changes.append(change)

    # -- the surveys ------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._survey()
        except Exception:  # a bug: what was asked is refused, and the next ask starts afresh
            log.exception("surveying purges and erasures failed")
            while self._asked:
                self._asked.popleft().refuse(
                    "internal error finding the user's rows", ErrorCode.INTERNAL_ERROR
                )
        finally:
            self._task = None

    async def _survey(self) -> None:
        while self._asked or self._unresumed:
            if self._unresumed:
                try:
                    await self._resume()
                except StorageFailure as exc:
                    log.error("finding the rows of unfinished purges and erasures failed (%s)", exc)
                    await asyncio.sleep(RESUME_RETRY)  # a schedule, not a synchronisation
                continue
            head = self._asked[0].w.user_id
            if (ahead := self._joined.get(head)) is not None:
                await asyncio.shield(ahead)  # it must be read through that one's rule
                continue
            group = first_group(self._asked, self._joined)
            for a in group:
                a.w.rule = self.rewrites.rule(a.w.user_id)
            through = None
            if self._owners is not None:  # each commit writes its blocks: all on disk before
                through = (self._committer.inflight or self._committer.open).first_seq
            survey = functools.partial(
                storage_past.survey, ws=[a.w for a in group], decay=self._decay(),
                now_ns=self._clock(), through=through,
            )  # fmt: skip
            try:
                surveys = await self._storage.read(survey)
                batch = self._committer.writable()
            except (StorageFailure, Unavailable) as exc:
                for a in group:
                    if a in self._asked:
                        self._asked.remove(a)
                        self._unerasing(a.w)
                        self._refuse_unsurveyed(a, exc)
                continue
            for a, found in zip(group, surveys, strict=True):
                if a not in self._asked:
                    continue  # refused meanwhile, with the batch it was read in
                self._asked.remove(a)
                if self._owners is not None:
                    try:  # still served here, and fenced with the batch it joins
                        self._owners.check(a.w.user_id, batch)
                    except ServerError as exc:
                        self._unerasing(a.w)
                        if a.saved:  # a leave was saved: never "moved", which says none was
                            self._refuse_unsurveyed(a, exc)
                        else:
                            a.refuse(exc.message, exc.code)
                        continue
                a.w.survey = found
                self._joined[a.w.user_id] = asyncio.get_running_loop().create_future()
                self._record(a.w, batch)
                batch.past.append(a.w)
                batch.writes += 1
                self._committer.ack(a.conn, a.msgid, a.reply)
                a.go_on()

    def _refuse_unsurveyed(self, a: Asked, exc: Exception) -> None:
        """The user's rows could not be read (or the user is no longer served here: error
        2 all the same, since part of it may be saved). What the request wrote as it was read (a
        leave) is in the batch it was read in: the refusal says it is saved only once that
        batch has committed, and goes out with it (refused with it, if it is)."""
        if not a.saved:
            a.refuse(f"storage unavailable: {said(exc)}; nothing of this request was saved")
            return
        message = (
            f"storage unavailable: {said(exc)}; {a.saved}; the rest of this request was not"
            " saved: ask again"
        )
        c = self._committer
        if a.asked_in is c.open or a.asked_in is c.inflight:
            a.asked_in.replies.append((a.conn, a.msgid, Refusal(message)))
            c.wake()
            a.go_on()  # its reads wait for that batch, which holds its leave
        else:  # committed already
            a.refuse(message)

    def _unerasing(self, w: Withdrawal) -> None:
        """An erase refused after its batch took it in: its keys count again, down to
        what an earlier erase of the user, still deleting, forgets."""
        if w.erase:
            rule = self.rewrites.rule(w.user_id)
            if rule.erase_before:
                self._keys.erasing_since(w.user_id, rule.erase_before)
            else:
                self._keys.erased(w.user_id, w.before_seq)

    async def _resume(self) -> None:
        """At boot, or partitions taken: the rows the loaded rules still cover, to rewrite."""
        while self._unresumed:
            rules = dict(itertools.islice(self._unresumed.items(), RESUME_AT_ONCE))
            tails = self._user_rows.tails(rules)
            unwritten = functools.partial(storage_past.unwritten, rules=rules, tails=tails)
            rows = 0
            for user, (erase, purge) in (await self._storage.read(unwritten)).items():
                if erase:
                    self.rewrites.resume(user, True, erase)
                if purge or not erase:
                    self.rewrites.resume(user, False, purge)
                if self._unresumed.get(user) == rules[user]:  # else adopted anew meanwhile
                    del self._unresumed[user]
                rows += len(erase) + len(purge)
            log.info("%d users: %d rows of purges or erasures still to rewrite", len(rules), rows)
            self._committer.wake()  # an idle writer starts on them: no request may come
