"""The connections' clock: what a silent or stalled connection costs is bounded in time."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Set

from .shared import Served

log = logging.getLogger("tidal.connection")


async def sweep_idle(connections: Set[Served], idle_timeout: float, message_timeout: float) -> None:
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
                close_idle(conn, idle_timeout)
            elif conn.partial_since is not None and conn.partial_since < now - message_timeout:
                close_stalled(conn, message_timeout)
            elif conn.last_active < quiet:
                conn.conn.rest()  # quiet since the last sweep: let its decoder go


def close_idle(conn: Served, timeout: float) -> None:
    """Close a connection that sent nothing for ``timeout``. One whose replies are still
    unsent is aborted: a peer that has not read them will not, and a polite close
    would wait for ever to flush them, holding its place under --max-connections."""
    conn.closed = True
    unsent = conn.transport.get_write_buffer_size()
    if unsent:
        log.info(
            "aborting %s: idle for over %ss, %d bytes of replies unread",
            conn.peer,
            timeout,
            unsent,
        )
        conn.transport.abort()
    else:
        log.info("closing %s: idle for over %ss", conn.peer, timeout)
        conn.transport.close()


def close_stalled(conn: Served, timeout: float) -> None:
    """A message begun over ``timeout`` ago is still not whole: what it sent so far is
    held for it, so a sender that stalls must not keep it for ever."""
    log.warning(
        "closing %s: a message of which %d bytes arrived is not whole after %ss",
        conn.peer,
        conn.conn.pending,
        timeout,
    )
    conn.closed = True
    conn.transport.abort()
