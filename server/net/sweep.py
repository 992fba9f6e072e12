"""The connections' clock: what a silent or stalled connection costs is bounded in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Set

from .connection import ServerConnection


async def sweep_idle(
    connections: Set[ServerConnection], idle_timeout: float, message_timeout: float
) -> None:
    """Close connections that have nothing in flight and sent nothing for ``idle_timeout``
    (a subscriber listens: it need send nothing), and those whose partial message is
    older than ``message_timeout``; let a quiet one's decoder go. Runs until cancelled."""
    every = min(idle_timeout, message_timeout) / 4
    while True:
        await asyncio.sleep(every)  # a schedule, not a synchronisation
        now = time.monotonic()
        cutoff = now - idle_timeout
        quiet = now - every
        for conn in list(connections):
            if conn.closed:
                continue
            if conn.last_active < cutoff and conn.inflight == 0 and conn.listener is None:
                conn.close_idle(idle_timeout)
            elif conn.partial_since is not None and conn.partial_since < now - message_timeout:
                conn.close_stalled(message_timeout)
            elif conn.last_active < quiet:
                conn.conn.rest()  # quiet since the last sweep: let its decoder go
