"""Load that a failover must not lose a bit of: four clients writing keyed signals,
leaves and purges, each retried until acknowledged; then every acknowledgement is
checked against the ledger, status and counts."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from tidal.client import Client, ConnectionLost, Unavailable

from .conftest import Database
from .test_postgres import Progress

T = TypeVar("T")
ENTITIES = 7
__all__ = ["Progress", "Writer", "check_everything_acknowledged_is_there"]


@dataclass
class Writer:
    """One client's work: keyed signals for its own users; every tenth user leaves, every
    twentieth with a purge, and signals once more; each call retried until acknowledged
    (a failover refuses some: nothing of those was saved)."""

    client: Client
    index: int
    progress: Progress
    signals: dict[int, tuple[int, bool]] = field(default_factory=dict)  # seq -> (user, fwd)
    left: dict[int, int] = field(default_factory=dict)  # user -> seq of their first signal after
    purged: set[int] = field(default_factory=set)
    acked_at: list[float] = field(default_factory=list)
    refused: int = 0

    async def retry(self, call: Callable[[], Awaitable[T]]) -> T:
        while True:
            try:
                return await call()
            except (Unavailable, ConnectionLost):
                self.refused += 1
                await asyncio.sleep(0.02)  # a client's pace while the server is away

    async def run(self, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            user = self.index * 1_000_000 + n
            key = f"w{self.index}-{n}"

            entity = f"e{n % ENTITIES}"
            send = functools.partial(self.client.signal, user, entity, "view", communities=["c"])
            ack = await self.retry(functools.partial(send, key=key))
            self.signals[ack.seq] = (user, ack.forwarded)
            self.acked_at.append(time.monotonic())
            self.progress.add()
            if n % 10 == 0:
                purge = n % 20 == 0
                await self.retry(functools.partial(self.client.leave, user, purge=purge))
                if purge:
                    self.purged.add(user)
                after = await self.retry(
                    functools.partial(
                        self.client.signal, user, "e0", "view", communities=["c"], key=f"{key}+"
                    )
                )
                self.signals[after.seq] = (user, after.forwarded)
                self.left[user] = after.seq
            n += 1


async def check_everything_acknowledged_is_there(
    database: Database, client: Client, writers: list[Writer]
) -> int:
    """Every acknowledged signal in the ledger under its seq, as forwarded as its reply
    said; every acknowledged leave in status, none of its user's later signals forwarded;
    every purge out of the community counts. How many acknowledgements were checked."""
    ledger = await database.rows("SELECT seq, user_id, forwarded, entity FROM ledger")
    rows = {seq: user for seq, user, _, _ in ledger}
    forwarded = {seq: fwd for seq, _, fwd, _ in ledger}
    purged = set().union(*(w.purged for w in writers))
    views = Counter(entity for _, _, _, entity in ledger)
    community = Counter(e for _, user, fwd, e in ledger if fwd and user not in purged)
    for e in range(ENTITIES):
        counts = await client.counts(f"e{e}")
        assert counts.ledger["view"].count == views[f"e{e}"], e
        assert counts.communities["c"]["view"].count == community[f"e{e}"], e
    checked = len(purged)
    for w in writers:
        for seq, (user, fwd) in w.signals.items():
            assert rows.get(seq) == user, f"acknowledged seq {seq} of user {user}: {rows.get(seq)}"
            # a purge withdraws its user's rows, rewritten as not forwarded a chunk at a time
            assert bool(forwarded[seq]) == fwd or user in purged, seq
            checked += 1
        for user, seq in w.left.items():
            assert (await client.status(user)).left, user
            assert not w.signals[seq][1], f"user {user}'s signal after their leave was forwarded"
            checked += 1
    return checked
