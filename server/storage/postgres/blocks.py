"""Cluster mode's upkeep of ``ledger_users``: the blocks commits write, one per commit
(``userrows.runs``), merged into blocks of up to ``userrows.BLOCK`` rows, so that a survey
reads about as many as one tidal's, not one per commit ever made."""

from __future__ import annotations

from typing import Final

import asyncpg

from tidal.server.core import userrows
from tidal.server.storage.sqlbulk import HEAD_LOCK

from .session import STATEMENT_TIMEOUT

#: the blocks not yet full: a full one joins no group. Most of a long history is full
#: blocks, which the pass then skips in the database, not here
_BLOCK_HEADS: Final = """
    SELECT first_seq, octet_length(users) / 8 FROM ledger_users
    WHERE first_seq > $1 AND octet_length(users) < $3 ORDER BY first_seq LIMIT $2"""


def _mergeable(heads: list[tuple[int, int]]) -> list[list[int]]:
    """Groups of two or more consecutive blocks (each starting where the one before ends),
    of ``userrows.BLOCK`` rows at most together: the first seqs of each."""
    groups: list[list[int]] = []
    group: list[int] = []
    rows = end = 0
    for first, n in heads:
        if group and first == end and rows + n <= userrows.BLOCK:
            group.append(first)
            rows += n
        else:
            if len(group) > 1:
                groups.append(group)
            group, rows = [first], n
        end = first + n
    if len(group) > 1:
        groups.append(group)
    return groups


async def merge(conn: asyncpg.Connection, after: int, most: int) -> tuple[int, int]:
    """Merges the consecutive blocks among the ``most`` past ``after``; returns where the
    next pass goes on (0: from the start) and how many blocks went. Under the log head's
    lock, which every transaction that writes blocks holds as it does (a commit writes its
    own as it takes the head; an erase, which blanks entries, takes the head first), so a
    merge never loses an entry blanked meanwhile."""
    merged = 0
    async with conn.transaction():
        await conn.execute(HEAD_LOCK, timeout=STATEMENT_TIMEOUT)
        rows = await conn.fetch(_BLOCK_HEADS, after, most, userrows.BLOCK * 8)
        heads = [(r[0], r[1]) for r in rows]
        for group in _mergeable(heads):
            rows = await conn.fetch(
                "SELECT users FROM ledger_users WHERE first_seq = ANY($1::bigint[])"
                " ORDER BY first_seq",
                group,
                timeout=STATEMENT_TIMEOUT,
            )
            users = b"".join(bytes(r[0]) for r in rows)
            await conn.execute(
                "UPDATE ledger_users SET users = $2 WHERE first_seq = $1", group[0], users
            )
            await conn.execute(
                "DELETE FROM ledger_users WHERE first_seq = ANY($1::bigint[])", group[1:]
            )
            merged += len(group) - 1
    # the last head may start a group still growing: the next pass begins with it
    return (heads[-2][0] if len(heads) == most and len(heads) > 1 else 0), merged
