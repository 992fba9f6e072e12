"""The cost of a leaver's past: purge and erase of users with 10,000 rows each, in a
1,000,000-row ledger, and what the other clients' signals feel meanwhile.

Each purge or erase logs the writer's time on it; the p50/p99 of 16x16 signals
are measured with purges running and, on an identical copy of the database,
without. Run alone: ``python bench/past.py`` prints the figures as JSON.
"""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgpack

from tidal.cli.child import Child, start
from tidal.client import SyncClient

VENV_BIN = Path(sys.executable).parent
TIDAL = str(VENV_BIN / "tidal")
HEAVY = 10_000_000  # heavy users are HEAVY + 0..19, 10,000 rows each in a 1M-row ledger


def serve(db: Path) -> Child:
    return start([TIDAL, "serve", "--port", "0", "--db", str(db)])


def stop(server: Child) -> None:
    server.proc.terminate()
    server.proc.wait(60)


def build(db: Path, rows: int) -> None:
    """A ledger of ``rows``: every 5th row is one of 20 heavy users', the rest spread over
    100,000 users; each row names community c1 and reached cohort 1 ("de")."""
    stop(serve(db))  # the schema, as tidal makes it
    context = msgpack.packb([["c1"], {"country": "DE"}, [1]])
    heavy = rows // 5 // 20
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA synchronous=OFF")
        for start_ in range(1, rows + 1, 200_000):
            conn.executemany(
                "INSERT INTO ledger (seq, user_id, entity, kind, weight, ts_ns, forwarded, context)"
                " VALUES (?, ?, ?, 'view', 1.0, 0, 1, ?)",
                (
                    (s, HEAVY + (s // 5) % 20 if s % 5 == 0 else s % 100_000, f"e{s % 1000}",
                     context)
                    for s in range(start_, min(rows + 1, start_ + 200_000))
                ),
            )  # fmt: skip
        for layer, cohort, name in ((0, 0, "''"), (1, 1, "''"), (2, 0, "'c1'")):
            conn.execute(
                f"INSERT INTO aggregates SELECT entity, {layer}, {cohort}, {name}, kind,"
                " COUNT(*), SUM(weight) FROM ledger GROUP BY entity, kind"
            )
        conn.execute("INSERT INTO cohorts VALUES (1, 'de', ?)", (msgpack.packb({"country": "DE"}),))
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('next_cohort_id', 2)")
        conn.execute("INSERT OR REPLACE INTO meta VALUES ('aggregates_seq', ?)", (rows,))
        # as a database from before the board: its buckets are filled from the ledger at boot
        conn.execute("DELETE FROM meta WHERE key = 'board_seq'")
    assert heavy == 10_000 or rows != 1_000_000


def load(port: int, requests: int) -> dict[str, Any]:
    done = subprocess.run(
        [TIDAL, "bench", "--port", str(port), "-c", "16", "-P", "16", "-n", str(requests),
         "--json", "--allow-data", "--keep"],
        capture_output=True, text=True, check=True, timeout=900,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _load_into(result: dict[str, Any], port: int, requests: int) -> None:
    result.update(load(port, requests))


def past_figures(scale: float = 1.0) -> dict[str, Any]:
    rows = max(100_000, int(1_000_000 * min(scale, 1.0)))
    requests = max(20_000, int(150_000 * scale))
    out: dict[str, Any] = {"ledger_rows": rows, "user_rows": rows // 100}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-past-") as tmp:
        built = Path(tmp) / "built.db"
        build(built, rows)
        for label in ("without", "with"):
            db = Path(tmp) / f"{label}.db"
            shutil.copy(built, db)
            began = time.perf_counter()
            server = serve(db)
            out.setdefault("boot_s", round(time.perf_counter() - began, 2))  # blocks listed
            try:
                if label == "without":
                    out["signals_alone"] = load(server.port, requests)
                    continue
                latencies: dict[str, list[float]] = {"purge": [], "erase": []}
                result: dict[str, Any] = {}
                loading = threading.Thread(target=_load_into, args=(result, server.port, requests))
                loading.start()
                with SyncClient("127.0.0.1", server.port, timeout=60) as c:
                    for i in range(20):
                        method = "purge" if i < 10 else "erase"
                        began = time.perf_counter()
                        done = getattr(c, method)(HEAVY + i)
                        latencies[method].append(time.perf_counter() - began)
                        assert done.signals == rows // 100, done
                loading.join()
                out["signals_during"] = result
                with SyncClient("127.0.0.1", server.port, timeout=60) as c:
                    while c.stats()[
                        "ledger_rewriting"
                    ]:  # the rows still to rewrite, logged once done
                        time.sleep(0.1)
                log = "".join(server.log)
                for method, rows_went in (("purge", "unforwarded"), ("erase", "deleted")):
                    ms = [float(m) for m in re.findall(rf"{method}d \(([\d.]+) ms\)", log)]
                    chunks = re.findall(
                        rf"rows {rows_went} in (\d+) commits, the longest ([\d.]+) ms", log
                    )
                    out[method] = {
                        "writer_ms_median": sorted(ms)[len(ms) // 2],
                        "writer_ms_max": max(ms),
                        "reply_ms_median": sorted(latencies[method])[5] * 1e3,
                        "rewrite_commits_median": sorted(int(n) for n, _ in chunks)[
                            len(chunks) // 2
                        ],
                        "rewrite_chunk_ms_max": max(float(m) for _, m in chunks),
                    }
            finally:
                stop(server)
    return out


if __name__ == "__main__":
    print(json.dumps(past_figures(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0), indent=1))


def past_report(past: dict[str, Any] | None) -> list[str]:
    if not past:
        return []
    alone, during = past["signals_alone"], past["signals_during"]
    return [
        "",
        "## Purge and erase",
        "",
        f"Ten purges, then ten erasures, of users with {past['user_rows']:,} rows each in a"
        f" {past['ledger_rows']:,}-row ledger, one after another, under a 16x16 signal load"
        " (`bench/past.py`). The writer's time is what tidal logs for each: in the commit where"
        " it takes effect, then on each chunk of its rows rewritten in the commits after."
        + (f" {past['note']}" if past.get("note") else ""),
        "",
        "| | writer ms as it takes effect (median, max) | reply ms (median) | rows rewritten:"
        " commits (median), longest chunk ms |",
        "|---|---:|---:|---:|",
        *(
            f"| {m} | {past[m]['writer_ms_median']:.1f}, {past[m]['writer_ms_max']:.1f}"
            f" | {past[m]['reply_ms_median']:.0f} | {past[m]['rewrite_commits_median']},"
            f" {past[m]['rewrite_chunk_ms_max']:.1f} |"
            for m in ("purge", "erase")
        ),
        "",
        "| other clients' signals, 16x16 | signals/s | p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
        f"| alone | {alone['signals_per_s']:,.0f} | {alone['p50_ms']:.2f}"
        f" | {alone['p99_ms']:.2f} |",
        f"| while purging and erasing | {during['signals_per_s']:,.0f} | {during['p50_ms']:.2f}"
        f" | {during['p99_ms']:.2f} |",
    ]
