"""Boot with the board full: how long a million aggregates take to come back."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import Any

from bench.systems import tidal_server
from tidal.client import SyncClient


def board_boot_figures(scale: float) -> dict[str, Any]:
    """Boot with 1,000,000 aggregates on the board (a signal's entity in the ledger layer and
    in one of 16 communities, 500,000 signals), each with its minute, hour and trend: the
    time to load (median of 5), of it building memory (the board, from the rows read), the
    RSS, and what it grew by over an empty server's, per aggregate."""
    signals = max(10_000, int(500_000 * min(scale, 1.0)))
    out: dict[str, Any] = {"aggregates": 2 * signals}
    with tempfile.TemporaryDirectory(prefix="tidal-bench-board-") as tmp:
        db = Path(tmp) / "board.db"
        with tidal_server("full", Path(tmp) / "empty.db") as srv:
            out["empty_rss_kib"] = srv.rss_kib()
        with tidal_server("full", db) as srv, SyncClient("127.0.0.1", srv.port, timeout=300) as c:
            for first in range(0, signals, 2000):
                batch = [
                    [i, f"e{i}", "view", 1.0, {"communities": [f"c{i % 16}"]}]
                    for i in range(first, min(first + 2000, signals))
                ]
                c.call("signal_batch", batch)
        loads, builds, rss = [], [], []
        for _ in range(5):
            with tidal_server("full", db) as srv:
                line = "".join(srv.log)
                loaded = re.search(r"loaded \S+ in ([\d.]+)s", line)
                built = re.search(r"([\d.]+)s building memory", line)
                if loaded and built:
                    loads.append(float(loaded.group(1)))
                    builds.append(float(built.group(1)))
                rss.append(srv.rss_kib())
        loads.sort()
        builds.sort()
        out["load_s"] = loads[len(loads) // 2] if loads else None
        out["load_range_s"] = [loads[0], loads[-1]] if loads else None
        out["build_s"] = builds[len(builds) // 2] if builds else None
        out["build_range_s"] = [builds[0], builds[-1]] if builds else None
        out["rss_kib"] = max(rss)
        out["bytes_per_aggregate"] = (max(rss) - out["empty_rss_kib"]) * 1024 / out["aggregates"]
    return out
