"""The commit log over a long history, for ``bench/cluster.py``: its rows after each third of
the signals (it is pruned below checkpoints), and a node's boot after that history
against its boot after a tenth of it, with a board of the same shape."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bench import nodes as started
from bench.systems import stop
from tidal.testing.postgres import Cluster


def _log_rows(url: str) -> int:
    async def count() -> int:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            rows: int = await conn.fetchval("SELECT COUNT(*) FROM tidal_log")
            return rows
        finally:
            await conn.close()

    return asyncio.run(count())


#: a checkpoint at most every second, so that a run of seconds shows the log pruned
CHECKPOINT = ("--checkpoint-seconds", "1")


def history(pg: Cluster, signals: int, thirds: bool) -> dict[str, Any]:
    """One node takes ``signals`` single signals (in thirds: the log's rows read after each),
    is stopped, and started again with its address: its boot, from start to every partition
    served, and what it replayed."""
    with started.database(pg) as url:
        node = started.node(url, None, *CHECKPOINT)
        port = node.port
        rows = []
        try:
            started.served([node])
            for _ in range(3 if thirds else 1):
                started.result(started.bench(node, signals // (3 if thirds else 1), "--own-users"))
                rows.append(_log_rows(url))
        finally:
            stop(node)
        kept = _log_rows(url)
        began = time.monotonic()
        node = started.node(url, port, *CHECKPOINT)
        try:
            listening = time.monotonic() - began
            served = started.served([node]) + listening
        finally:
            stop(node)
    return {"signals": signals, "log_rows": rows, "replayed": kept, "listening_s": listening,
            "boot_s": served}  # fmt: skip


def history_report(short: dict[str, Any] | None, long: dict[str, Any] | None) -> list[str]:
    if not short or not long:
        return []
    thirds = ", ".join(f"{rows:,}" for rows in long["log_rows"])
    return [
        "",
        f"The commit log over a long history (one node, {' '.join(CHECKPOINT)}): after each"
        f" third of {long['signals']:,} single signals it held {thirds} rows. Boot, from start"
        " to every partition served, with the node's address:",
        "",
        "| history | log rows replayed | listening s | every partition served s |",
        "|---|---:|---:|---:|",
        *(
            f"| {h['signals']:,} signals | {h['replayed']:,} | {h['listening_s']:.2f}"
            f" | {h['boot_s']:.2f} |"
            for h in (short, long)
        ),
        "",
        f"The long history's boot: {long['boot_s'] / short['boot_s']:.2f}x the short one's.",
    ]
