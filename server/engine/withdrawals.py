"""Purges and erasures, off the writer: surveyed beside it, then taking effect in one commit.

A withdrawal reaches the rows of its user read before it (``before_seq``, fixed as
it is read), but reading them inside a group commit would hold every client for
as long. So each is surveyed on the storage's reader, at a snapshot, one at a
time in the order read; then it joins the open batch, with its history line,
its change-feed event and its reply, and the writer adds only the rows the
snapshot could not see. Its rows are rewritten over the commits after
(``core.rewrites``).

Until it has joined a batch, a read that could show what it withdraws waits
with it (``defer``): the zero window holds. A withdrawal asked for in a batch
that is then refused is refused too: its ``before_seq`` counted rows that were
never committed, and an erase's leave was undone with them.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
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
from tidal.server.core.rewrites import Rewrite, Rewrites, Rewritten, Rule
from tidal.server.core.timeline import Timeline
from tidal.server.core.userrows import UserRows
from tidal.server.errors import StorageFailure
from tidal.server.logs import Throttle
from tidal.server.storage import past_sql as storage_past
from tidal.server.storage.interface import Storage

from .committer import Committer

log = logging.getLogger("tidal.engine")
#: a line per purge or erase as it takes effect, at most one a second of each kind: a
#: clean-up erasing 95,000 users wrote 130,000 lines (each one's own record stays: its
#: user's ``history``, and the change feed)
_withdrawals = Throttle(log, interval=1.0)

#: a failed read at boot, looking for the rows a rule still covers: tried again after
RESUME_RETRY: Final = 1.0
#: withdrawals one survey reads together: the blocks of ``ledger_users`` are read once
SURVEY_GROUP: Final = 100


@dataclass(slots=True, eq=False)
class Asked:
    """A withdrawal read, not yet in a batch: what it adds to the batch it joins, and the
    reads that wait for it."""

    w: Withdrawal
    conn: Replier
    msgid: int | None
    reply: Later
    asked_in: Batch  # the open batch when it was read
    saved: str  # what was written as it was read, kept if the withdrawal is refused
    deferred: list[Callable[[], None]] = field(default_factory=list)


class Past:
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
        owners: Owners | None = None,
    ) -> None:
        self._storage = storage
        self._committer = committer
        self.rewrites = rewrites
        self._decay = decay
        self._clock = clock
        self._keys = keys
        self._user_rows = user_rows
        self._timeline = timeline
        self._asked: deque[Asked] = deque()  # read, not yet in a batch
        #: users with a withdrawal in a batch not yet committed: done when it is
        self._joined: dict[int, asyncio.Future[None]] = {}
        self._owners = owners
        self._task: asyncio.Task[None] | None = None
        #: rules loaded (at boot, or with partitions taken) whose rows are still to find
        self._unresumed: dict[int, Rule] = {}
        self._loaded(rewrites.rules)

    def start(self) -> None:
        if self._unresumed:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tidal-past")

    def adopt(self, ours: Callable[[int], bool], rules: dict[int, Rule]) -> None:
        """Cluster mode: partitions taken over, with the rules of their users' withdrawals
        not all rewritten yet; this node finds their rows and goes on rewriting them."""
        for user in [u for u in self.rewrites.rules if ours(u)]:
            self.rewrites.drop(user)  # of an earlier time this node served them
        self.rewrites.rules.update(rules)
        self._loaded(rules)
        if rules and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tidal-past")

    def _loaded(self, rules: dict[int, Rule]) -> None:
        """Rules read from the database: their rows are to be found, and an erase's keys
        are forgotten from its ``erase_before`` down while its rows are not all deleted."""
        self._unresumed.update(rules)
        for user, rule in rules.items():
            if rule.erase_before:
                self._keys.erasing_since(user, rule.erase_before)

    def chunk(self, batch: Batch) -> Rewrite | None:
        """The next chunk of rows to rewrite, with ``batch``. Cluster mode: of a user this
        node still serves, fenced with the batch; a user another node serves now is left
        to that one, which loaded the rule as it took the partition."""
        withdrawing = {w.user_id for w in batch.past}
        if self._owners is None:
            return self.rewrites.chunk(withdrawing)
        while (chunk := self.rewrites.chunk(withdrawing)) is not None:
            part = self._owners.part(chunk.user)
            epoch = self._owners.owned.get(part)
            if epoch is not None:
                batch.parts[part] = epoch
                return chunk
            self.rewrites.drop(chunk.user)
        return None

    async def close(self) -> None:
        """Every withdrawal read has joined a batch, or been refused."""
        if self._task is not None:
            await self._task

    # -- requests ------------------------------------------------------------

    def ask(
        self, w: Withdrawal, conn: Replier, msgid: int | None, reply: Later, saved: str = ""
    ) -> None:
        """``saved``: what the request wrote as it was read (a leave), which a refusal
        of the withdrawal does not take back, for the refusal to say."""
        self._asked.append(Asked(w, conn, msgid, reply, self._committer.open, saved))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="tidal-past")

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

    # -- around each commit (called by the engine) -----------------------------

    def committed(self, batch: Batch, rewritten: Rewritten | None) -> None:
        """``batch`` is durable: its withdrawals have taken effect, its chunk is rewritten
        (``rewritten``: what the writer found rewriting it)."""
        for w in batch.past:
            _withdrawals(w.erase, logging.INFO, "%s", w)
            if w.seqs:
                self.rewrites.took_effect(w.user_id, w.erase, w.before_seq, w.seqs)
            if w.erase and not self.rewrites.rule(w.user_id).erase_before:
                # nothing of the user's is left to delete: their keys went with their rows.
                # While an earlier erase's rows are still being deleted, their keys stay
                # forgotten until its last chunk (``rewrite.last``)
                self._keys.erased(w.user_id, w.before_seq)
        rewrite = batch.rewrite
        if rewrite is not None and rewritten is not None:
            self._keys.forget(rewritten.keys)
            if rewrite.erase:
                self._user_rows.deleted(rewrite.seqs)  # the blocks blanked in its commit
            if rewrite.last:
                erased = self.rewrites.rule(rewrite.user).erase_before
                self._keys.erased(rewrite.user, erased)
            job = self.rewrites.committed(rewrite, rewritten.seconds)
            if job is not None and job.seqs:
                log.info(
                    "user %d: %d rows %s in %d commits, the longest %.1f ms",
                    job.user, len(job.seqs), "deleted" if job.erase else "unforwarded",
                    job.commits, job.longest * 1e3,
                )  # fmt: skip
        self._settle(batch)

    def failed(self, batches: tuple[Batch, ...], unknown: bool = False) -> None:
        """``batches`` were refused: so is every withdrawal asked for while they were open.
        What one wrote as it was read (a leave) went with its batch: not saved, or, if that
        batch (the first) had its COMMIT cut off and never settled (``unknown``), perhaps
        saved."""
        refused = "storage unavailable: the batch this request was read in was refused"
        for a in [a for a in self._asked if a.asked_in in batches]:
            self._asked.remove(a)
            if a.saved and unknown and a.asked_in is batches[0]:
                self._refuse(a, f"{refused}, its COMMIT cut off; {UNKNOWN_SAVED}")
            else:
                self._refuse(a, f"{refused}; {NOTHING_SAVED}")
        for batch in batches:
            self._settle(batch)

    def unknown(self, batch: Batch, message: str) -> None:
        """``batch``'s COMMIT was cut off and its outcome is not known yet (the path to the
        database is silent): a withdrawal read while it was open waits for no outcome but
        is refused now with ``message``; what it wrote as it was read (a leave) went with
        ``batch``, perhaps saved. It never joined a batch: an erase's keys count again."""
        for a in [a for a in self._asked if a.asked_in is batch]:
            self._asked.remove(a)
            self._unerasing(a.w)
            self._refuse(a, message)

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

    def _settle(self, batch: Batch) -> None:
        for w in batch.past:
            settled = self._joined.pop(w.user_id, None)
            if settled is not None and not settled.done():
                settled.set_result(None)

    # -- the surveys ------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._survey()
        except Exception:  # a bug: what was asked is refused, and the next ask starts afresh
            log.exception("surveying purges and erasures failed")
            while self._asked:
                self._refuse(
                    self._asked.popleft(), "internal error finding the user's rows",
                    ErrorCode.INTERNAL_ERROR,
                )  # fmt: skip
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
            group = self._group()
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
                            self._refuse(a, exc.message, exc.code)
                        continue
                a.w.survey = found
                self._joined[a.w.user_id] = asyncio.get_running_loop().create_future()
                self._record(a.w, batch)
                batch.past.append(a.w)
                batch.writes += 1
                self._committer.ack(a.conn, a.msgid, a.reply)
                self._go_on(a)

    def _refuse_unsurveyed(self, a: Asked, exc: Exception) -> None:
        """The user's rows could not be read (or the user is no longer served here: error
        2 all the same, since part of it may be saved). What the request wrote as it was read (a
        leave) is in the batch it was read in: the refusal says it is saved only once that
        batch has committed, and goes out with it (refused with it, if it is)."""
        if not a.saved:
            self._refuse(a, f"storage unavailable: {said(exc)}; nothing of this request was saved")
            return
        message = (
            f"storage unavailable: {said(exc)}; {a.saved}; the rest of this request was not"
            " saved: ask again"
        )
        c = self._committer
        if a.asked_in is c.open or a.asked_in is c.inflight:
            a.asked_in.replies.append((a.conn, a.msgid, Refusal(message)))
            c.wake()
            self._go_on(a)  # its reads wait for that batch, which holds its leave
        else:  # committed already
            self._refuse(a, message)

    def _unerasing(self, w: Withdrawal) -> None:
        """An erase refused after its batch took it in: its keys count again, down to
        what an earlier erase of the user, still deleting, forgets."""
        if w.erase:
            rule = self.rewrites.rule(w.user_id)
            if rule.erase_before:
                self._keys.erasing_since(w.user_id, rule.erase_before)
            else:
                self._keys.erased(w.user_id, w.before_seq)

    def _group(self) -> list[Asked]:
        """The withdrawals read first, up to ``SURVEY_GROUP`` of them, that one survey may
        read together: of distinct users, none with a withdrawal not yet committed."""
        group: list[Asked] = []
        users: set[int] = set()
        for a in self._asked:
            user = a.w.user_id
            if user in users or user in self._joined or len(group) == SURVEY_GROUP:
                break  # in order: a later one joins no batch before this one
            users.add(user)
            group.append(a)
        return group

    async def _resume(self) -> None:
        """At boot, or partitions taken: the rows the loaded rules still cover, to rewrite."""
        while self._unresumed:
            user, rule = next(iter(self._unresumed.items()))
            tail = self._user_rows.recent(user, 1 << 64)  # every seq
            unwritten = functools.partial(
                storage_past.unwritten, user_id=user, rule=rule, tail=tail
            )
            erase, purge = await self._storage.read(unwritten)
            if erase:
                self.rewrites.resume(user, True, erase)
            if purge or not erase:
                self.rewrites.resume(user, False, purge)
            if self._unresumed.get(user) == rule:  # else adopted anew meanwhile
                del self._unresumed[user]
            log.info(
                "user %d: %d rows of a purge or erase still to rewrite",
                user,
                len(erase) + len(purge),
            )

    def _refuse(self, a: Asked, message: str, code: int = ErrorCode.UNAVAILABLE) -> None:
        a.conn.reply_error(a.msgid, code, message)
        a.conn.flush()
        self._go_on(a)

    @staticmethod
    def _go_on(a: Asked) -> None:
        """``a`` is answered, or its answer is placed: what its connection sent after it
        (held by ``defer``) goes on. Every way out of ``_asked`` ends here: else that
        connection would apply nothing more, for ever."""
        for request in a.deferred:
            request()
