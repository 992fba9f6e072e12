"""A big ranking read under writes: what its reads cost their reader, and everyone else.

200,000 entities in one community, a writer sending batches of 1,000 signals to them
all along, and an unrelated client sending one signal at a time. Its latency is taken
in three phases of the reader's: none (the writer alone); the first read of ``top`` in
each of the community's 11 orders (count and weight in 5 windows, trend), each building
its order; then the orders kept, read round after round until the unrelated client has
as many samples again; then pages of 1,000 by count read to the end, again and again,
as long. Reported: the first reads, the kept reads' p50/p99/max, the deep pages'
p50/p99, the unrelated client's p99 in each phase, and the server's RSS before the
reads and after them."""

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
DEEP_PAGES = 20  # pages of 1,000 past the first, at least


class _Enough:
    """Set once the probe has ``count`` samples."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.event = asyncio.Event()


async def _figures(port: int, rss: Any, entities: int) -> dict[str, Any]:
    rng = random.Random(1)
    names = [f"big:e{i}" for i in range(entities)]
    async with await Client.connect("127.0.0.1", port, timeout=300) as c:
        for first in range(0, entities, 2000):
            last = min(first + 2000, entities)
            await c.signal_batch(
                [Signal(i, names[i], "view", 1.0 + i % 7, ["big"]) for i in range(first, last)]
            )
    stop = asyncio.Event()
    samples: list[float] = []  # the unrelated client's latencies, in the order they came
    enough = _Enough(PROBES)

    async def probed(count: int) -> None:
        nonlocal enough
        enough = _Enough(count)
        if len(samples) < count:
            await enough.event.wait()

    async def writer() -> None:
        async with await Client.connect("127.0.0.1", port, timeout=300) as w:
            while not stop.is_set():
                users = [rng.randrange(1 << 20) for _ in range(1000)]
                await w.signal_batch(
                    [Signal(u, rng.choice(names), "view", 1.0, ["big"]) for u in users]
                )

    async def probe() -> None:
        async with await Client.connect("127.0.0.1", port, timeout=300) as p:
            while not stop.is_set():
                began = time.perf_counter()
                await p.signal(1 << 40, "other", "view")
                samples.append(time.perf_counter() - began)
                if len(samples) >= enough.count:
                    enough.event.set()

    tasks = [asyncio.ensure_future(writer()), asyncio.ensure_future(probe())]
    try:
        await probed(PROBES)  # the writer alone
        alone = samples[:PROBES]
        rss_before = rss()
        firsts: list[float] = []
        kept: list[float] = []
        async with await Client.connect("127.0.0.1", port, timeout=300) as r:

            async def read(combo: dict[str, Any], into: list[float]) -> None:
                began = time.perf_counter()
                await r.top("community", "big", "view", limit=10, **combo)
                into.append(time.perf_counter() - began)

            mark = len(samples)
            for combo in COMBOS:  # each order built: its first read
                await read(combo, firsts)
            building = samples[mark:]
            mark = len(samples)
            sampled = asyncio.ensure_future(probed(mark + PROBES))
            while not sampled.done():  # the orders kept, read round after round
                for combo in COMBOS:
                    await read(combo, kept)
            reading = samples[mark:]
            rss_read = rss()
            rankings_kept = (await r.stats())["rankings_kept"]
            deep: list[float] = []  # pages past the head, 1,000 at a time, to the end
            mark = len(samples)
            sampled = asyncio.ensure_future(probed(mark + PROBES))
            after = None
            while not sampled.done() or len(deep) < DEEP_PAGES:
                began = time.perf_counter()
                page = await r.top("community", "big", "view", limit=1000, after=after)
                if after is not None:
                    deep.append(time.perf_counter() - began)
                after = page.next
            paging = samples[mark:]
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "entities": entities,
        "first_read_ms_max": max(firsts) * 1e3,
        "first_read_ms_p50": percentile(sorted(firsts), 0.5),
        "reads": len(kept),
        "top_p50_ms": percentile(sorted(kept), 0.5),
        "top_p99_ms": percentile(sorted(kept), 0.99),
        "top_max_ms": max(kept) * 1e3,
        "others_p99_alone_ms": percentile(sorted(alone), 0.99),
        "others_max_alone_ms": max(alone) * 1e3,
        "others_p99_building_ms": percentile(sorted(building), 0.99),
        "others_max_building_ms": max(building, default=0.0) * 1e3,
        "others_p99_reads_ms": percentile(sorted(reading), 0.99),
        "others_max_reads_ms": max(reading) * 1e3,
        "rankings_kept": rankings_kept,
        "deep_pages": len(deep),
        "deep_page_p50_ms": percentile(sorted(deep), 0.5),
        "deep_page_p99_ms": percentile(sorted(deep), 0.99),
        "others_p99_deep_ms": percentile(sorted(paging), 0.99),
        "others_max_deep_ms": max(paging) * 1e3,
        "rss_before_mib": rss_before / 1024,
        "rss_grown_mib": (rss_read - rss_before) / 1024,
    }


def big_ranking_figures(scale: float) -> dict[str, Any]:
    entities = max(20_000, int(200_000 * min(scale, 1.0)))
    with (
        tempfile.TemporaryDirectory(prefix="tidal-bench-ranking-") as tmp,
        tidal_server("full", Path(tmp) / "ranking.db") as srv,
    ):
        return asyncio.run(_figures(srv.port, srv.rss_kib, entities))


def ranking_report(r: dict[str, Any] | None) -> list[str]:
    """BENCHMARKS.md's section on the big ranking (``big_ranking_figures``); ``note``, if
    any, says how a run apart from ``make bench``'s was made."""
    if r is None:
        return []
    building = (
        [
            f"| ... while the 11 first reads build their orders (its max) |"
            f" {r['others_p99_building_ms']:.1f} ms ({r['others_max_building_ms']:,.0f} ms) |",
        ]
        if "others_p99_building_ms" in r
        else []
    )
    return [
        "",
        "## A big ranking read under writes",
        "",
        f"{r['entities']:,} entities in one community, a writer sending batches of 1,000"
        " signals to them all along, and `top` read in each of its 11 orders (count and"
        " weight in 5 windows, trend): first once each, which builds the order, then round"
        f" after round, {r['reads']:,} reads of kept orders, one after the other"
        " (`bench/big_ranking.py`). The target: others' p99 within 2x of alone, `top`"
        " within 50 ms at p99." + (f" {r['note']}" if r.get("note") else ""),
        "",
        "| figure | value |",
        "|---|---:|",
        f"| first read of an order (building it): p50 / the slowest |"
        f" {r.get('first_read_ms_p50', 0):,.0f} / {r['first_read_ms_max']:,.0f} ms |",
        f"| `top` of a kept order: p50 / p99 / max | {r['top_p50_ms']:,.1f} /"
        f" {r['top_p99_ms']:,.1f} / {r['top_max_ms']:,.0f} ms |",
        f"| another client's signal p99, writer alone (its max) | {r['others_p99_alone_ms']:.1f}"
        f" ms ({r['others_max_alone_ms']:,.0f} ms) |",
        *building,
        f"| ... while kept orders are read (its max) | {r['others_p99_reads_ms']:.1f} ms"
        f" ({r['others_max_reads_ms']:,.0f} ms) |",
        *(
            [
                f"| a page of 1,000 past the first, paging to the end ({r['deep_pages']:,}"
                f" pages): p50 / p99 | {r['deep_page_p50_ms']:,.1f} /"
                f" {r['deep_page_p99_ms']:,.1f} ms |",
                f"| ... another client's signal p99 meanwhile (its max) |"
                f" {r['others_p99_deep_ms']:.1f} ms ({r['others_max_deep_ms']:,.0f} ms) |",
            ]
            if "deep_pages" in r
            else []
        ),
        f"| orders kept | {r['rankings_kept']} |",
        f"| RSS before the reads, and grown over them | {r['rss_before_mib']:,.0f} MiB,"
        f" +{r['rss_grown_mib']:,.0f} MiB |",
    ]


if __name__ == "__main__":
    import json
    import sys

    scale = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    print(json.dumps(big_ranking_figures(scale), indent=1))
