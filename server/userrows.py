"""Where each user's ledger rows are, so that a purge or an erase need not scan the ledger.

An index on ``ledger.user_id`` would do it, at a price paid by every signal:
user ids arrive in no order, so each group commit dirties about one index page
per row, and writes it to the log (measured: 3.9 µs to insert a ledger row,
16.3 µs with the index). Instead:

- the rows committed since the last summary are listed here in memory, by user;
- every ``SUMMARY_ROWS`` rows, that list becomes a summary: one line per user in
  the ``user_rows`` table, all under the same ``upto`` (the last seq it covers).
  Lines are keyed (upto, user_id), so a summary is appended at the table's end,
  a few hundred lines per page; it is written a chunk per group commit, so that
  no commit waits long for it;
- a user's rows are then one lookup per summary (a few for a ledger of millions
  of rows) plus what memory holds;
- ``meta.user_rows_seq`` says which rows the table covers: boot lists in memory
  the rows past it again (a summary cut short by a crash is written again, and
  its lines are read twice, harmlessly).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import msgpack

from .batch import Batch

#: rows per summary: memory lists at most about twice this many seqs
SUMMARY_ROWS: Final = 100_000
#: summary lines written per group commit: a few ms of the writer's time
LINES_PER_COMMIT: Final = 5_000


def decode(line: bytes | str) -> list[int]:
    """A line's seqs: msgpack, or comma-separated text as the schema migration wrote them."""
    if isinstance(line, str):
        return [int(seq) for seq in line.split(",")]
    seqs: list[int] = msgpack.unpackb(line)
    return seqs


class UserRows:
    def __init__(self, uptos: list[int], covered: int) -> None:
        self.uptos = uptos  # the summaries in the table, oldest first
        self.covered = covered  # every row up to this seq is in the table
        self.recent: dict[int, list[int]] = {}  # db user id -> seqs past the summaries
        self._recent_rows = 0
        self._summary: dict[int, list[int]] | None = None  # being written
        self._summary_upto = 0
        self._to_write: list[int] = []  # users of the summary not yet written, in order

    def replay(self, rows: Iterable[tuple[int, int]]) -> None:
        """At boot: (seq, db user id) of the ledger rows past ``covered``."""
        for seq, user in rows:
            self._add(seq, user)

    def committed(self, batch: Batch) -> None:
        add = self._add
        for row in batch.ledger:
            add(row[0], row[1])
        if batch.user_lines_taken:
            del self._to_write[: batch.user_lines_taken]
            if batch.user_lines_covered is not None:  # the whole summary is in the table
                self.uptos.append(batch.user_lines_covered)
                self.covered = batch.user_lines_covered
                self._summary = None
        if batch.summary_retired is not None:
            self.uptos.remove(batch.summary_retired)

    def _add(self, seq: int, user: int) -> None:
        seqs = self.recent.get(user)
        if seqs is None:
            self.recent[user] = [seq]
        else:
            seqs.append(seq)
        self._recent_rows += 1

    def prepare(self, batch: Batch) -> None:
        """Give ``batch`` the next chunk of summary lines to write, if any are due."""
        if batch.retire is not None and self.uptos:
            batch.oldest_summary = self.uptos[0]  # gone, once no row of it is left
        if self._summary is None:
            if self._recent_rows < SUMMARY_ROWS:
                return
            # every row committed so far: all of them are below this batch
            self._summary, self._summary_upto = self.recent, batch.first_seq - 1
            self._to_write = sorted(self.recent)
            self.recent, self._recent_rows = {}, 0
        summary, upto = self._summary, self._summary_upto
        chunk = self._to_write[:LINES_PER_COMMIT]
        batch.user_lines = [(upto, u, msgpack.packb(summary[u])) for u in chunk if u in summary]
        batch.user_lines_taken = len(chunk)  # an erased user's line is simply not written
        if len(chunk) == len(self._to_write):
            batch.user_lines_covered = upto

    def where(self, user: int) -> tuple[list[int], list[int]]:
        """The summaries to look the user up in, and their rows that only memory lists."""
        uptos = [*self.uptos, self._summary_upto] if self._summary is not None else self.uptos
        seqs = list(self.recent.get(user, ()))
        if self._summary is not None:
            seqs += self._summary.get(user, ())
        return list(uptos), seqs

    def erased(self, user: int, before_seq: int) -> None:
        """An erase committed: the user's rows before it are gone (later ones, gated, stay)."""
        for listed in (self.recent, self._summary or {}):
            seqs = listed.pop(user, None)
            if seqs is not None:
                kept = [seq for seq in seqs if seq >= before_seq]
                if kept:
                    listed[user] = kept
