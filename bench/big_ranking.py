"""A big ranking read under writes: what its reads cost their reader, and everyone else.

200,000 entities in one community, a writer sending batches of 1,000 signals to them
all along, and an unrelated client sending one signal at a time. Its latency is taken
first with the writer alone, then while a reader reads ``top`` of the community in each
of its 11 orders (count and weight in 5 windows, trend), round after round. Reported:
the first read of each order, every read's p50/p99/max, the unrelated client's p99 in
both phases, and the server's RSS before the reads, after them, and once the orders
were dropped (``--order-idle``, shortened for the run)."""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.systems import tidal_server
from tidal.cli.results import percentile
from tidal.client import Client, Signal

WINDOWS = ("all", "1h", "24h", "7d", "30d")
COMBOS: list[dict[str, Any]] = [
    *({"by": by, "window": w} for by in ("count", "weight") for w in WINDOWS),
    {"by": "trend"},
]
PROBES = 2000  # the unrelated client's signals per phase


async def _figures(port: int, rss: Any, entities: int, rounds: int) -> dict[str, Any]:
    rng = random.Random(1)
    names = [f"big:e{i}" for i in range(entities)]
    async with await Client.connect("127.0.0.1", port, timeout=300) as c:
        for first in range(0, entities, 2000):
            last = min(first + 2000, entities)
            await c.signal_batch(
                [Signal(i, names[i], "view", 1.0 + i % 7, ["big"]) for i in range(first, last)]
            )
    stop = asyncio.Event()

    async def writer() -> None:
        async with await Client.connect("127.0.0.1", port, timeout=300) as w:
            while not stop.is_set():
                users = [rng.randrange(1 << 20) for _ in range(1000)]
                await w.signal_batch(
                    [Signal(u, rng.choice(names), "view", 1.0, ["big"]) for u in users]
                )

    async def probe(samples: list[float]) -> None:
        async with await Client.connect("127.0.0.1", port, timeout=300) as p:
            while len(samples) < PROBES and not stop.is_set():
                began = time.perf_counter()
                await p.signal(1 << 40, "other", "view")
                samples.append(time.perf_counter() - began)

    writing = asyncio.ensure_future(writer())
    alone: list[float] = []
    await probe(alone)
    rss_before = rss()
    during: list[float] = []
    probing = asyncio.ensure_future(probe(during))
    reads: list[float] = []
    firsts: list[float] = []
    async with await Client.connect("127.0.0.1", port, timeout=300) as r:
        for round_ in range(rounds):
            for combo in COMBOS:
                began = time.perf_counter()
                await r.top("community", "big", "view", limit=10, **combo)
                took = time.perf_counter() - began
                reads.append(took)
                if round_ == 0:
                    firsts.append(took)
        rss_read = rss()
        kept = (await r.stats())["rankings_kept"]
    probing.cancel()  # it may have its samples already
    stop.set()
    await asyncio.gather(writing, probing, return_exceptions=True)
    return {
        "entities": entities,
        "reads": len(reads),
        "first_read_ms_max": max(firsts) * 1e3,
        "top_p50_ms": percentile(sorted(reads), 0.5),
        "top_p99_ms": percentile(sorted(reads), 0.99),
        "top_max_ms": max(reads) * 1e3,
        "others_p99_alone_ms": percentile(sorted(alone), 0.99),
        "others_max_alone_ms": max(alone) * 1e3,
        "others_p99_reads_ms": percentile(sorted(during), 0.99),
        "others_max_reads_ms": max(during) * 1e3,
        "rankings_kept": kept,
        "rss_before_mib": rss_before / 1024,
        "rss_grown_mib": (rss_read - rss_before) / 1024,
    }


def big_ranking_figures(scale: float) -> dict[str, Any]:
    entities = max(20_000, int(200_000 * min(scale, 1.0)))
    with (
        tempfile.TemporaryDirectory(prefix="tidal-bench-ranking-") as tmp,
        tidal_server("full", Path(tmp) / "ranking.db") as srv,
    ):
        return asyncio.run(_figures(srv.port, srv.rss_kib, entities, rounds=5))


def ranking_report(r: dict[str, Any] | None) -> list[str]:
    """BENCHMARKS.md's section on the big ranking (``big_ranking_figures``)."""
    if r is None:
        return []
    return [
        "",
        "## A big ranking read under writes",
        "",
        f"{r['entities']:,} entities in one community, a writer sending batches of 1,000"
        " signals to them all along, and `top` read in each of its 11 orders (count and"
        f" weight in 5 windows, trend), {r['reads']} reads in all, one after the other"
        " (`bench/big_ranking.py`). The target: others' p99 within 2x of alone, `top`"
        " within 50 ms at p99.",
        "",
        "| figure | value |",
        "|---|---:|",
        f"| first read of an order, the slowest | {r['first_read_ms_max']:,.0f} ms |",
        f"| `top` p50 / p99 / max | {r['top_p50_ms']:,.0f} / {r['top_p99_ms']:,.0f}"
        f" / {r['top_max_ms']:,.0f} ms |",
        f"| another client's signal p99, writer alone (its max) | {r['others_p99_alone_ms']:.1f}"
        f" ms ({r['others_max_alone_ms']:,.0f} ms) |",
        f"| ... while the reads run (its max) | {r['others_p99_reads_ms']:.1f} ms"
        f" ({r['others_max_reads_ms']:,.0f} ms) |",
        f"| orders kept | {r['rankings_kept']} |",
        f"| RSS before the reads, and grown over them | {r['rss_before_mib']:,.0f} MiB,"
        f" +{r['rss_grown_mib']:,.0f} MiB |",
    ]


if __name__ == "__main__":
    import json
    import sys

    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    print(json.dumps(big_ranking_figures(scale), indent=1))
