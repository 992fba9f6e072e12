"""What a bench run made, and its removal after the run: only what the run's sent requests
wrote, a batch at a time."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from .workload import COHORT, BenchConfig


@dataclass(frozen=True, slots=True)
class Made:
    """What a run made on the server, for its clean-up: the users its sent requests wrote
    for (not those of requests it never sent: Ctrl-C), and whether it defined the cohort."""

    users: frozenset[int]
    cohort: bool


#: users erased at once by the clean-up: a batch of requests pipelined on one connection
CLEAN_BATCH = 1000


async def clean_up(
    cfg: BenchConfig, made: Made, progress: Callable[[int, int], None] | None = None
) -> str:
    """Remove what the run made: its users' signals erased (an erase leaves its user Left,
    so each is then rejoined), a batch at a time, and its cohort, if it defined it. What
    stays is what the server keeps of any erase: each user's history lines, and the change
    feed's events."""
    from tidal.client import Client, Moved

    async def one(client: Client, user: int) -> None:
        try:
            await client.erase(user)
            await client.rejoin(user)
        except Moved:  # cluster mode: another node serves it, and stored nothing of it here
            pass

    ordered = sorted(made.users)
    async with await Client.connect(cfg.host, cfg.port, timeout=300, token=cfg.token) as client:
        for start in range(0, len(ordered), CLEAN_BATCH):
            await asyncio.gather(*(one(client, u) for u in ordered[start : start + CLEAN_BATCH]))
            if progress is not None:
                progress(min(start + CLEAN_BATCH, len(ordered)), len(ordered))
        if made.cohort:
            await client.drop_cohort(COHORT)
    dropped = f" and dropped cohort {COHORT}" if made.cohort else ""
    return f"erased and rejoined its {len(ordered):,} users{dropped}"
