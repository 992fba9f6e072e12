"""Where each user's ledger rows are, so that a purge or an erase need not scan the ledger.

An index on ``ledger.user_id`` would do it, at a price paid by every signal:
user ids arrive in no order, so each group commit dirties about one index page
per row and writes it to the log (measured: 3.9 µs to insert a ledger row, 16.3
µs with the index). Per-user lists, rewritten as users come back, cost the same
in other ways. So instead the ledger's user column is kept a second time, in
blocks: ``ledger_users`` holds, for each ``BLOCK`` seqs, the user of each row,
packed 8 bytes a row. A block is appended once full (one insert per 4,096 rows);
the rows since the last block are listed in memory. Finding a user's rows reads
the blocks and searches them for the user's 8 bytes (``bytes.find``, in C):
about 8 MB and a few milliseconds per million rows, whatever the user.

An erased row's entry is overwritten with 0 as the row is deleted, not before:
a boot finds the rows an erase still has to delete through the blocks (a lookup of
user 0 then finds seqs whose rows are gone, which it skips, as it skips every seq no
longer in the ledger).
"""

from __future__ import annotations

from array import array
from collections.abc import Collection, Iterable, Sequence
from operator import itemgetter
from typing import Final

from .batch import Batch
from .ledger import Row, to_db

#: rows per block
BLOCK: Final = 4096
_user_of = itemgetter(1)


def block_of(seq: int) -> int:
    """The first seq of the block ``seq`` is in (blocks start at seq 1)."""
    return seq - (seq - 1) % BLOCK


def pack(users: Iterable[int]) -> bytes:
    return array("q", users).tobytes()


def find(block: bytes, first_seq: int, user: int) -> list[int]:
    """The seqs of the block's rows of ``user`` (as stored)."""
    pattern = array("q", (user,)).tobytes()
    seqs = []
    at = block.find(pattern)
    while at != -1:
        if at % 8 == 0:
            seqs.append(first_seq + at // 8)
            at = block.find(pattern, at + 8)
        else:  # the bytes straddle two entries
            at = block.find(pattern, at + 1)
    return seqs


#: from this many users on, ``find_all`` reads each block's users once, not each user's
#: bytes once per user: a search of 256k rows for one user took 1.3 ms here, and the pass
#: that hashes them all 9 ms
ONE_PASS: Final = 8


def find_all(blocks: Iterable[tuple[int, bytes]], users: Collection[int]) -> dict[int, list[int]]:
    """The seqs of each of ``users``' rows in ``blocks`` (as stored), for those with any:
    a bench's clean-up surveys hundreds of erasures at once, and searching the blocks once
    per user took the reader seconds a commit."""
    found: dict[int, list[int]] = {}
    wanted = set(users)
    for first, block in blocks:
        if len(wanted) < ONE_PASS:
            held: Iterable[int] = wanted
        else:
            entries = array("q")
            entries.frombytes(block)
            held = wanted.intersection(entries)  # in C: the block's users hashed once
        for user in held:
            if seqs := find(block, first, user):
                found.setdefault(user, []).extend(seqs)
    return found


def blank(block: bytes, first_seq: int, seqs: Iterable[int]) -> bytes:
    """``block`` with the entries of ``seqs`` set to 0: an erase leaves no trace here."""
    users = array("q")
    users.frombytes(block)
    for seq in seqs:
        users[seq - first_seq] = 0
    return users.tobytes()


def runs(rows: list[Row]) -> list[tuple[int, bytes]]:
    """Cluster mode: a commit's own blocks, one per run of consecutive seqs (a run breaks
    only where the node took a new block of seqs), written in its transaction. Nodes'
    seqs interleave in no order of blocks of ``BLOCK``, and a node that fails keeps no
    tail in memory for another to lose."""
    if not rows:
        return []
    if rows[-1][0] - rows[0][0] == len(rows) - 1:  # all but always: one run
        return [(rows[0][0], pack(map(_user_of, rows)))]
    blocks = []
    start = 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i][0] != rows[i - 1][0] + 1:
            blocks.append((rows[start][0], pack(map(_user_of, rows[start:i]))))
            start = i
    return blocks


class UserRows:
    def __init__(self, next_block: int, tail: list[int]) -> None:
        self.next_block = next_block  # the first seq of the next block to write
        self.tail = tail  # users of the committed rows from ``next_block`` on, in seq order

    def committed(self, batch: Batch) -> None:
        self.tail.extend(map(_user_of, batch.ledger))
        if batch.users_blocks:
            del self.tail[: BLOCK * len(batch.users_blocks)]
            self.next_block += BLOCK * len(batch.users_blocks)

    def prepare(self, batch: Batch) -> None:
        """Give ``batch`` the blocks that committed rows have filled."""
        tail, first = self.tail, self.next_block
        batch.users_blocks = [
            (first + at, pack(tail[at : at + BLOCK]))
            for at in range(0, len(tail) - BLOCK + 1, BLOCK)
        ]

    def recent(self, user_id: int, before_seq: int, pending: Sequence[Row] = ()) -> list[int]:
        """The seqs below ``before_seq`` of the user's rows not yet in a written block:
        committed (the tail), then ``pending`` (rows of a batch not yet committed)."""
        first = self.next_block
        user = to_db(user_id)
        seqs = [first + i for i, u in enumerate(self.tail) if u == user and first + i < before_seq]
        return seqs + [row[0] for row in pending if row[1] == user and row[0] < before_seq]

    def tails(self, user_ids: Collection[int]) -> dict[int, list[int]]:
        """Each user's seqs in the tail, in one pass over it (by user_id)."""
        wanted = {to_db(user_id): user_id for user_id in user_ids}
        first = self.next_block
        out: dict[int, list[int]] = {}
        for i, user in enumerate(self.tail):
            if (user_id := wanted.get(user)) is not None:
                out.setdefault(user_id, []).append(first + i)
        return out

    def deleted(self, seqs: Iterable[int]) -> None:
        """An erase's rows, deleted in a commit: their entries in the tail go too, so that
        the blocks written from it leave no trace. Not before: until its rows are deleted,
        a boot after a kill -9 finds them through the blocks to delete (``Past._resume``)."""
        first = self.next_block
        tail = self.tail
        for seq in seqs:
            if 0 <= seq - first < len(tail):
                tail[seq - first] = 0
