"""Purges and erasures as they take effect, and their rows rewritten over the commits
after (``core.rewrites``): the rules, kept in memory and loaded at boot, and what each
commit's withdrawals and chunk change in memory once durable.

Before a withdrawal takes effect it is read and surveyed off the writer (``surveys``);
this is what happens from its commit on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from tidal.server.core.batch import Batch
from tidal.server.core.keys import Keys
from tidal.server.core.owners import Owners
from tidal.server.core.rewrites import Pace, Rewrite, Rewritten, Rule
from tidal.server.core.userrows import UserRows
from tidal.server.logs import Throttle

from .surveys import Surveys

log = logging.getLogger("tidal.engine")
#: a line per purge or erase as it takes effect, at most one a second of each kind: a
#: clean-up erasing 95,000 users wrote 130,000 lines (each one's own record stays: its
#: user's ``history``, and the change feed)
_withdrawals = Throttle(log, interval=1.0)


class Past:
    def __init__(
        self, surveys: Surveys, keys: Keys, user_rows: UserRows, owners: Owners | None = None
    ) -> None:
        #: the withdrawals read, not yet in a batch: asked for, surveyed, joining one
        self.surveys = surveys
        self.rewrites = surveys.rewrites
        self._keys = keys
        self._user_rows = user_rows
        self._owners = owners
        self._pace = Pace()
        self._loaded(self.rewrites.rules)

    def start(self) -> None:
        self.surveys.start()

    async def close(self) -> None:
        """Every withdrawal read has joined a batch, or been refused."""
        await self.surveys.close()

    def adopt(self, ours: Callable[[int], bool], rules: dict[int, Rule]) -> None:
        """Cluster mode: partitions taken over, with the rules of their users' withdrawals
        not all rewritten yet; this node finds their rows and goes on rewriting them."""
        for user in [u for u in self.rewrites.rules if ours(u)]:
            self.rewrites.drop(user)  # of an earlier time this node served them
        self.rewrites.rules.update(rules)
        self._loaded(rules)

    def _loaded(self, rules: dict[int, Rule]) -> None:
        """Rules read from the database: their rows are to be found, and an erase's keys
        are forgotten from its ``erase_before`` down while its rows are not all deleted."""
        self.surveys.resume(rules)
        for user, rule in rules.items():
            if rule.erase_before:
                self._keys.erasing_since(user, rule.erase_before)

    def chunk(self, batch: Batch) -> Rewrite | None:
        """The next chunk of rows to rewrite, with ``batch``. Cluster mode: of a user this
        node still serves, fenced with the batch; a user another node serves now is left
        to that one, which loaded the rule as it took the partition."""
        waited_on = bool(batch.replies or batch.writes)
        if not self.rewrites.busy() or (waited_on and not self._pace.due(time.monotonic())):
            return None
        withdrawing = {w.user_id for w in batch.past}
        while (chunk := self.rewrites.chunk(withdrawing)) is not None:
            chunk.paced = waited_on
            chunk.began = time.monotonic()
            if self._owners is None:
                return chunk
            part = self._owners.part(chunk.user)
            epoch = self._owners.owned.get(part)
            if epoch is not None:
                batch.parts[part] = epoch
                return chunk
            self.rewrites.drop(chunk.user)
        return None

    # -- around each commit (called by its participant, ``Withdrawals``) ---------

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
            if rewrite.paced:  # the whole commit: the rows' pages cost most as it syncs
                self._pace.spent(time.monotonic() - rewrite.began)
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
        self.surveys.settle(batch)

    def failed(self, batches: tuple[Batch, ...], unknown: bool = False) -> None:
        """``batches`` were refused: so is every withdrawal asked for while they were open
        (``Surveys.refused``)."""
        self.surveys.refused(batches, unknown)

    def unknown(self, batch: Batch, message: str) -> None:
        self.surveys.unknown(batch, message)
