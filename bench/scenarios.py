"""What ``make bench`` measures: every shape on every system, in rounds that alternate
between systems, and the figures beside them (boot, counts under load, the past)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

from bench.big_ranking import big_ranking_figures
from bench.board import board_boot_figures
from bench.cluster import cluster_figures
from bench.feed import feed_figures
from bench.goals import WIDE
from bench.groups import group_figures
from bench.http_edge import http_figures
from bench.past import past_figures
from bench.stored import boot_figures, counts_figures
from bench.systems import (
    PG,
    TIDAL,
    bare_server,
    redis_run,
    redis_server,
    requests_for,
    tidal_bench,
    tidal_pg_bench,
    tidal_server,
)
from tidal.cli.child import Child
from tidal.client import SyncClient
from tidal.testing.postgres import Cluster

SHAPES = [(1, 1), (50, 1), (16, 16), (4, 64)]
CLUSTER: list[Cluster] = []  # the PostgreSQL this run started


def run_all(scale: float, repeats: int) -> dict[str, Any]:
    """Every shape ``repeats`` times, rounds alternating between systems; each figure is the
    median run, with the range beside it (this machine's figures move a lot between runs)."""
    shape_runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    extra_runs: dict[str, list[dict[str, Any]]] = {}
    CLUSTER.append(Cluster())
    try:
        for round_ in range(repeats):
            print(f"-- round {round_ + 1} of {repeats}", file=sys.stderr)
            one_round(scale, shape_runs, extra_runs)
    finally:
        CLUSTER.pop().destroy()
    return {
        "machine": machine(),
        "repeats": repeats,
        "shapes": {
            system: {shape: median(runs) for shape, runs in by_shape.items()}
            for system, by_shape in shape_runs.items()
        },
        "extra": {name: median(runs) for name, runs in extra_runs.items()},
        "boot": boot_figures(scale),
        "board_boot": board_boot_figures(scale),
        "counts": counts_figures(scale),
        "past": past_figures(scale),
        "big_ranking": big_ranking_figures(scale),
        "feed": feed_figures(scale),
        "groups": group_figures(scale),
        "http": http_figures(scale, repeats),
        "cluster": cluster_figures(scale),
    }


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median run, with the range, and every run in round order (for ratios per round)."""
    ordered = sorted(runs, key=lambda r: float(r["signals_per_s"] or r["requests_per_s"]))
    chosen = dict(ordered[len(ordered) // 2])
    chosen["range"] = [ordered[0]["signals_per_s"], ordered[-1]["signals_per_s"]]
    keep = (
        "signals_per_s", "requests_per_s", "server_cpu_us", "tidal_cpu_us", "p50_ms", "p99_ms",
        "p999_ms",
    )  # fmt: skip
    chosen["runs"] = [{k: r.get(k) for k in keep} for r in runs]
    return chosen


def one_round(
    scale: float,
    shape_runs: dict[str, dict[str, list[dict[str, Any]]]],
    extra_runs: dict[str, list[dict[str, Any]]],
) -> None:
    """Every system once at every shape, then the other runs, each appended to its list."""
    _shapes(scale, shape_runs)
    extra = _Extra(extra_runs)
    _batches(scale, extra)
    _loads(scale, extra)


def _shapes(scale: float, shape_runs: dict[str, dict[str, list[dict[str, Any]]]]) -> None:
    def record(system: str, shape: str, result: dict[str, Any]) -> None:
        shape_runs.setdefault(system, {}).setdefault(shape, []).append(result)
        print(
            f"{system:>16} {shape:>6}: {result['signals_per_s']:>10,.0f} signals/s"
            f"  p50 {result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms",
            file=sys.stderr,
        )

    for c, p in SHAPES:
        n = requests_for(c, p, scale)
        with bare_server() as bare:
            record("bare stack", f"{c}x{p}", tidal_bench(bare, c, p, n))
        for durability in ("full", "normal"):
            with tidal_server(durability) as srv:
                record(f"tidal {durability}", f"{c}x{p}", tidal_bench(srv, c, p, n))
        record(PG, f"{c}x{p}", tidal_pg_bench(CLUSTER[0], c, p, n))
        for fsync in ("always", "everysec"):
            with redis_server(fsync) as red:
                record(f"redis {fsync}", f"{c}x{p}", redis_run(red, c, p, n))


class _Extra:
    """The other runs, by name: each round's result appended to its list."""

    def __init__(self, runs: dict[str, list[dict[str, Any]]]) -> None:
        self.runs = runs

    def __setitem__(self, name: str, result: dict[str, Any]) -> None:
        self.runs.setdefault(name, []).append(result)


def _batches(scale: float, extra: _Extra) -> None:
    batches = max(40, int(400 * scale))
    with bare_server() as bare:
        extra["bare batch 1000 (4x4)"] = tidal_bench(bare, 4, 4, batches, workload="batch")
    for durability in ("full", "normal"):
        with tidal_server(durability) as srv:
            extra[f"tidal {durability} batch 1000 (4x4)"] = tidal_bench(
                srv, 4, 4, batches, workload="batch"
            )
    with tidal_server("full") as srv:
        extra["tidal full batch 1000, compact ack (4x4)"] = tidal_bench(
            srv, 4, 4, batches, workload="batch_compact"
        )
    for fsync in ("always", "everysec"):
        with redis_server(fsync) as red:
            extra[f"redis {fsync} pipeline 1000 (4x4)"] = redis_run(
                red, 4, 4, batches, workload="batch"
            )


def _loads(scale: float, extra: _Extra) -> None:
    """The gate's cost (0% and 100% left), a mixed load, a long run, reads under load."""
    n = requests_for(16, 16, scale)
    for fraction in (0.0, 1.0):
        with tidal_server("full") as srv:
            extra[f"tidal full 16x16, {fraction:.0%} left"] = tidal_bench(
                srv, 16, 16, n, users=20_000, left_fraction=fraction
            )
        with redis_server("always") as red:
            extra[f"redis always 16x16, {fraction:.0%} left"] = redis_run(
                red, 16, 16, n, users=20_000, left_fraction=fraction
            )
    with tidal_server("full") as srv:
        extra["tidal full mixed 16x16"] = tidal_bench(srv, 16, 16, n, workload="mixed")
    with redis_server("always") as red:
        extra["redis always mixed 16x16"] = redis_run(red, 16, 16, n, workload="mixed")
    # long enough to cross checkpoints (every 200,000 signals): their stalls show in p99.9
    with tidal_server("full") as srv:
        extra["tidal full 16x16, long"] = tidal_bench(srv, 16, 16, 5 * n)
    # ... and over 1,000,000 entities: each checkpoint writes 100,000 changed tallies, and
    # now and then the current minute's and hour's buckets whole (``aggregates``)
    with tidal_server("full") as srv:
        extra[WIDE] = tidal_bench(srv, 16, 16, 5 * n, entities=1_000_000)
    with tidal_server("full") as srv:
        extra["counts under 16x16 signals"] = counts_under_load(srv, n)
    for workload in ("top", "top_window", "top_trend"):
        with tidal_server("full") as srv:
            extra[f"{workload} of 100,000 under 16x16 signals"] = top_under_load(srv, n, workload)


def counts_under_load(server: Child, signals: int) -> dict[str, Any]:
    """One client reading ``counts`` in a closed loop while 16x16 write signals."""
    return read_under_load(server, signals, "counts", 10_000)


def top_under_load(server: Child, signals: int, workload: str) -> dict[str, Any]:
    """One client reading the top 10 of a community of 100,000 entities in a closed loop,
    while 16x16 write signals (each to one of 16 communities, the ranked one among them)."""
    with SyncClient("127.0.0.1", server.port, timeout=60) as client:
        for first in range(0, 100_000, 1000):
            fill = [
                [i, f"x{i}", "view", 1.0, {"communities": ["bench:c0"]}]
                for i in range(first, first + 1000)
            ]
            client.call("signal_batch", fill)
    return read_under_load(server, signals, workload, 110_000)


def read_under_load(server: Child, signals: int, workload: str, begun: int) -> dict[str, Any]:
    """``workload`` from one client, 1x1, while 16x16 write signals; the load has begun once
    the server has counted ``begun`` signals."""
    cmd = [TIDAL, "bench", "--port", str(server.port), "-c", "16", "-P", "16", "--allow-data",
           "--keep"]  # fmt: skip
    load = subprocess.Popen(
        [*cmd, "-n", str(4 * signals), "--json"], stdout=subprocess.PIPE, text=True
    )
    try:
        with SyncClient("127.0.0.1", server.port, timeout=60) as client:
            while client.stats()["signals"] < begun:
                time.sleep(0.05)
        read = tidal_bench(server, 1, 1, max(500, signals // 20), workload=workload)
        still_loaded = load.poll() is None
    finally:
        out, _ = load.communicate(timeout=900)
    read["signals_per_s_meanwhile"] = json.loads(out)["signals_per_s"]
    read["load_outlasted_it"] = still_loaded
    return read


def machine() -> dict[str, Any]:
    redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    from tidal.server.engine import engine

    compiled = not engine.__file__.endswith(".py")
    return {
        "build": "compiled with mypyc" if compiled else "pure Python",
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "redis": redis.stdout.split()[2] if redis.returncode == 0 else None,
        "date": time.strftime("%Y-%m-%d"),
    }


# -- the report -------------------------------------------------------------
