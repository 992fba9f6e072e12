"""The figures ``make bench`` takes over a database filled straight, not through tidal:
boot with a million leave records, and ``counts`` over a large ledger."""

from __future__ import annotations

import re
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.systems import requests_for, tidal_bench, tidal_server


def boot_figures(scale: float) -> dict[str, Any]:
    """Boot time and RSS with 0 and 1,000,000 leave records."""
    records = max(10_000, int(1_000_000 * min(scale, 1.0)))
    out: dict[str, Any] = {"records": records}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-boot-") as tmp:
        db = Path(tmp) / "boot.db"
        for label, count in (("empty", 0), ("full", records)):
            if count:
                with tidal_server("full", db):
                    pass  # create the schema
                fill_memberships(db, count)
            began = time.perf_counter()
            with tidal_server("full", db) as srv:
                seconds = time.perf_counter() - began
                loaded = re.search(r"loaded \S+ in ([\d.]+)s", "".join(srv.log))
                out[label] = {
                    "boot_s": round(seconds, 3),
                    "load_s": float(loaded.group(1)) if loaded else None,
                    "rss_kib": srv.rss_kib(),
                }
        out["bytes_per_record"] = round(
            (out["full"]["rss_kib"] - out["empty"]["rss_kib"]) * 1024 / records, 1
        )
    return out


def fill_memberships(db: Path, count: int) -> None:
    with sqlite3.connect(db) as conn:
        now = time.time_ns()
        conn.executemany(
            "INSERT OR REPLACE INTO memberships (user_id, left, left_at_ns) VALUES (?, 1, ?)",
            ((u, now + u) for u in range(count)),
        )


def counts_figures(scale: float) -> dict[str, Any]:
    """counts() latency with a small and a large ledger (rows written straight to SQLite,
    with the aggregates table checkpointed up to the last of them, as tidal leaves it)."""
    large = max(100_000, int(10_000_000 * min(scale, 1.0)))
    out: dict[str, Any] = {}
    for rows in (10_000, large):
        with tempfile.TemporaryDirectory(prefix="tidal-bench-counts-") as tmp:
            db = Path(tmp) / "counts.db"
            with tidal_server("full", db):
                pass
            fill_ledger(db, rows)
            with tidal_server("full", db) as srv:
                result = tidal_bench(srv, 16, 16, requests_for(16, 16, scale), workload="counts")
            out[f"{rows} rows"] = result
    return out


def fill_ledger(db: Path, rows: int) -> None:
    import msgpack

    context = msgpack.packb([["c1"], {"country": "DE"}, []])
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA synchronous=OFF")
        step = 200_000
        for start in range(1, rows + 1, step):
            conn.executemany(
                "INSERT INTO ledger (seq, user_id, entity, kind, weight, ts_ns, forwarded, context)"
                " VALUES (?, ?, ?, 'view', 1.0, 0, 1, ?)",
                (
                    (s, s % 100_000, f"e{s % 1000}", context)
                    for s in range(start, min(rows + 1, start + step))
                ),
            )
        conn.execute(
            "INSERT INTO aggregates SELECT entity, 0, 0, '', kind, COUNT(*), SUM(weight)"
            " FROM ledger GROUP BY entity, kind"
        )
        conn.execute(
            "INSERT INTO aggregates SELECT entity, 2, 0, 'c1', kind, COUNT(*), SUM(weight)"
            " FROM ledger GROUP BY entity, kind"
        )
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('aggregates_seq', ?)", (rows,))
        # as a database from before the board: its buckets are filled from the ledger at boot
        conn.execute("DELETE FROM meta WHERE key = 'board_seq'")
