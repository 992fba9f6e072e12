"""``make bench``: tidal side by side with Redis and the bare stack limit, in one run.

Every system gets the same shapes from the same load generator, ``tidal bench``:
MessagePack-RPC for tidal and the bare stack, the same requests as Redis commands
(RESP, ``--redis-sha``) for Redis. Each server starts on a fresh database, one
after the other, and its CPU time over each run is read from /proc. Only ratios
within one run mean much: absolute figures on a shared 2-core machine drift.

Writes bench/results.json, docs/BENCHMARKS.md and docs/benchmarks.png.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tidal.cli.child import Child, start
from tidal.client import SyncClient

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as bench/run.py
from bench.past import past_figures
from tests.postgres import Cluster

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
TIDAL = str(VENV_BIN / "tidal")
SHAPES = [(1, 1), (50, 1), (16, 16), (4, 64)]
PG = "tidal full on PostgreSQL"
CLUSTER: list[Cluster] = []  # the PostgreSQL this run started
#: bench/past.py's writer time, median, on the page the purge issue left (docs/BENCHMARKS.md)
PAST_BEFORE_MS = {"purge": 224.0, "erase": 176.0}


def stop(server: Child) -> None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@contextmanager
def tidal_server(durability: str, db: Path | None = None) -> Iterator[Child]:
    with tempfile.TemporaryDirectory(prefix="tidal-bench-") as tmp:
        path = db or Path(tmp) / "bench.db"
        server = start(
            [TIDAL, "serve", "--port", "0", "--db", str(path), "--durability", durability]
        )
        try:
            yield server
        finally:
            stop(server)


@contextmanager
def tidal_on_postgres(cluster: Cluster) -> Iterator[Child]:
    """tidal full on a new database of ``cluster`` (started by this run, as the tests do)."""
    import asyncio

    name = asyncio.run(cluster.create())
    server = start([TIDAL, "serve", "--port", "0", "--db", cluster.url(name)])
    try:
        yield server
    finally:
        stop(server)
        asyncio.run(cluster.drop(name))


def postgres_cpu_s(cluster: Cluster) -> float:
    """CPU seconds of the PostgreSQL server's processes (the postmaster and its children)."""
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended meanwhile
            continue
        if int(stat.parent.name) == postmaster or int(fields[1]) == postmaster:
            ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def tidal_pg_bench(cluster: Cluster, clients: int, pipeline: int, requests: int) -> dict[str, Any]:
    """As ``tidal_bench``; the server's CPU is tidal's and PostgreSQL's together, since on
    SQLite the database's work is inside tidal's process."""
    with tidal_on_postgres(cluster) as srv:
        before = postgres_cpu_s(cluster)
        result = tidal_bench(srv, clients, pipeline, requests)
        signals = result["signals_per_s"] * result["seconds"]
        database_us = (postgres_cpu_s(cluster) - before) * 1e6 / signals
    result["tidal_cpu_us"] = result["server_cpu_us"]
    result["server_cpu_us"] = result["server_cpu_us"] + database_us
    return result


@contextmanager
def bare_server() -> Iterator[Child]:
    server = start([sys.executable, str(ROOT / "bench" / "bare_server.py"), "--port", "0"])
    try:
        yield server
    finally:
        stop(server)


def tidal_bench(
    server: Child, clients: int, pipeline: int, requests: int, **extra: Any
) -> dict[str, Any]:
    """``tidal bench`` against ``server``, whose CPU time it reads; ``redis_sha=`` for Redis."""
    cmd = [TIDAL, "bench", "--port", str(server.port), "-c", str(clients), "-P", str(pipeline)]
    cmd += ["-n", str(requests), "--json", "--server-pid", str(server.proc.pid)]
    for key, value in extra.items():
        cmd += [f"--{key.replace('_', '-')}", str(value)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=900)
    if done.returncode != 0:
        raise RuntimeError(f"tidal bench failed: {done.stderr}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# -- Redis ------------------------------------------------------------------

SIGNAL_LUA = (ROOT / "bench" / "signal.lua").read_text()


def ensure_redis() -> None:
    if shutil.which("redis-server") and shutil.which("redis-cli"):
        return
    print("installing redis-server and redis-tools from Debian ...", file=sys.stderr)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(
        ["apt-get", "install", "-y", "-qq", "redis-server", "redis-tools"], check=True, env=env
    )


@contextmanager
def redis_server(fsync: str) -> Iterator[Child]:
    with tempfile.TemporaryDirectory(prefix="tidal-bench-redis-") as tmp:
        port = free_port()
        proc = subprocess.Popen(
            [
                "redis-server",
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", tmp,
                "--appendonly", "yes",
                "--appendfsync", fsync,
                "--save", "",
                "--loglevel", "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        server = Child(proc, port, [])  # type: ignore[arg-type]
        try:
            for _ in range(200):
                if redis_cli(port, "PING").strip() == "PONG":
                    break
                time.sleep(0.05)  # waiting for an external process to come up
            yield server
        finally:
            redis_cli(port, "SHUTDOWN", "NOSAVE")
            proc.wait(30)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def redis_cli(port: int, *args: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, check=False
    )
    return done.stdout


def redis_run(
    server: Child, clients: int, pipeline: int, requests: int, **extra: Any
) -> dict[str, Any]:
    """The same load as ``tidal_bench`` gives tidal, as calls of ``bench/signal.lua``."""
    sha = redis_cli(server.port, "SCRIPT", "LOAD", SIGNAL_LUA).strip()
    return tidal_bench(server, clients, pipeline, requests, redis_sha=sha, **extra)


# -- the runs ---------------------------------------------------------------


def requests_for(clients: int, pipeline: int, scale: float) -> int:
    base = 4_000 if clients * pipeline == 1 else 60_000
    return max(1_000, int(base * scale))


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
        "counts": counts_figures(scale),
        "past": past_figures(scale),
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
    def record(system: str, shape: str, result: dict[str, Any]) -> None:
        shape_runs.setdefault(system, {}).setdefault(shape, []).append(result)
        print(
            f"{system:>16} {shape:>6}: {result['signals_per_s']:>10,.0f} signals/s"
            f"  p50 {result['p50_ms']:.2f} ms  p99 {result['p99_ms']:.2f} ms",
            file=sys.stderr,
        )

    class Extra:
        def __setitem__(self, name: str, result: dict[str, Any]) -> None:
            extra_runs.setdefault(name, []).append(result)

    extra = Extra()

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

    batches = max(40, int(400 * scale))
    with bare_server() as bare:
        extra["bare batch 1000 (4x4)"] = tidal_bench(bare, 4, 4, batches, workload="batch")
    for durability in ("full", "normal"):
        with tidal_server(durability) as srv:
            extra[f"tidal {durability} batch 1000 (4x4)"] = tidal_bench(
                srv, 4, 4, batches, workload="batch"
            )
    for fsync in ("always", "everysec"):
        with redis_server(fsync) as red:
            extra[f"redis {fsync} pipeline 1000 (4x4)"] = redis_run(
                red, 4, 4, batches, workload="batch"
            )

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
    with tidal_server("full") as srv:
        extra["counts under 16x16 signals"] = counts_under_load(srv, n)


def counts_under_load(server: Child, signals: int) -> dict[str, Any]:
    """One client reading ``counts`` in a closed loop while 16x16 write signals."""
    cmd = [TIDAL, "bench", "--port", str(server.port), "-c", "16", "-P", "16"]
    load = subprocess.Popen(
        [*cmd, "-n", str(4 * signals), "--json"], stdout=subprocess.PIPE, text=True
    )
    try:
        with SyncClient("127.0.0.1", server.port, timeout=60) as client:
            while client.stats()["signals"] < 10_000:  # the load has begun
                time.sleep(0.05)
        counts = tidal_bench(server, 1, 1, max(500, signals // 20), workload="counts")
        still_loaded = load.poll() is None
    finally:
        out, _ = load.communicate(timeout=900)
    counts["signals_per_s_meanwhile"] = json.loads(out)["signals_per_s"]
    counts["load_outlasted_it"] = still_loaded
    return counts


def machine() -> dict[str, Any]:
    redis = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    from tidal.server import engine

    compiled = not engine.__file__.endswith(".py")
    return {
        "build": "compiled with mypyc" if compiled else "pure Python",
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "redis": redis.stdout.split()[2] if redis.returncode == 0 else None,
        "date": time.strftime("%Y-%m-%d"),
    }


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
                "INSERT INTO ledger VALUES (?, ?, ?, 'view', 1.0, 0, 1, ?)",
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


# -- the report -------------------------------------------------------------


def _span(result: dict[str, Any]) -> str:
    low, high = result.get("range", [result["signals_per_s"]] * 2)
    digits = 1 if high < 10_000 else 0
    return f"{low / 1000:.{digits}f}k-{high / 1000:.{digits}f}k"


def cpu_cell(result: dict[str, Any]) -> str:
    values = [r["server_cpu_us"] for r in result.get("runs", []) if r.get("server_cpu_us")]
    if not values:
        return "n/a"
    return f"{result['server_cpu_us']:.1f} ({min(values):.1f}-{max(values):.1f})"


def report(results: dict[str, Any]) -> str:
    shapes = results["shapes"]
    extra = results["extra"]
    systems = ["bare stack", "tidal full", PG, "tidal normal", "redis always", "redis everysec"]
    labels = [f"{c}x{p}" for c, p in SHAPES]

    def sps(system: str, shape: str) -> float:
        value: float = shapes[system][shape]["signals_per_s"]
        return value

    m = results["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"One run of `make bench` on {m['date']}: {m['cores']} cores,",
        f"Python {m['python']}, Redis {m['redis']}, tidal {m.get('build', 'as installed')}.",
        f"Each figure is the median of {results.get('repeats', 1)} runs, in rounds that alternate",
        "between the systems; the range of the runs is in brackets. Compare within this page",
        "only: absolute figures on this shared machine drift (by up to 2x between runs).",
        "",
        "**One load generator for every system**: `tidal bench` (Python, closed loop, every",
        "request encoded before the clock starts), on the same machine. It speaks",
        "MessagePack-RPC to tidal and the bare stack, and sends Redis the same requests as",
        "RESP commands (`--redis-sha`): a signal calls `bench/signal.lua` (ledger counter,",
        "`SISMEMBER` gate, community and cohort counters), with AOF on. The server's CPU",
        "time (user + system, all threads, from `/proc/PID/stat`) is read around each run.",
        "",
        "Workload: `signal` with one community and one attribute, a cohort defined on that",
        "attribute, 100,000 users, 1,000 entities.",
        "",
        f"`{PG}`: PostgreSQL 15 from Debian, started by the run (`initdb` in a temporary",
        "directory, default settings, `synchronous_commit` on), on the same two cores; a new",
        "database for each run. Its CPU is tidal's and the PostgreSQL server's processes'",
        "together (on SQLite the database's work is inside tidal's process); tidal's own",
        "share is in square brackets.",
        "",
        "## Signals per second (C clients x P pipelined)",
        "",
        "| system | " + " | ".join(labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for system in systems:
        cells = [f"{sps(system, s):,.0f} ({_span(shapes[system][s])})" for s in labels]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines += ["", "## Latency p50 / p99 (ms)", "", "| system | " + " | ".join(labels) + " |"]
    lines.append("|---|" + "---:|" * len(labels))
    for system in systems:
        cells = [
            f"{shapes[system][s]['p50_ms']:.2f} / {shapes[system][s]['p99_ms']:.2f}" for s in labels
        ]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines += ["", "## Server CPU per signal (µs, user + system, from /proc)", ""]
    lines += ["| system | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for system in systems:
        cells = [cpu_cell(shapes[system][s]) for s in labels]
        if system == PG:
            cells = [
                f"{cell} [{shapes[system][s].get('tidal_cpu_us') or 0:.1f}]"
                for cell, s in zip(cells, labels, strict=True)
            ]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## Goals",
        "",
        "Each ratio is the median of the rounds' ratios (each round runs both systems one",
        "after the other), with their range.",
        "",
        "| goal | measured | met |",
        "|---|---|---|",
    ]

    met: list[bool] = []

    def goal(name: str, ratios: list[float], at_least: float, text: str = "") -> None:
        mid = sorted(ratios)[len(ratios) // 2]
        shown = text or f"{mid:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"
        met.append(mid >= at_least)
        lines.append(f"| {name} | {shown} | {'met' if met[-1] else 'not met'} |")

    def per_round(a: dict[str, Any], b: dict[str, Any], key: str = "signals_per_s") -> list[float]:
        return [x[key] / y[key] for x, y in zip(a["runs"], b["runs"], strict=False) if y[key]]

    for shape in ("16x16", "50x1", "4x64"):
        tidal, redis = shapes["tidal full"][shape], shapes["redis always"][shape]
        cpu = per_round(redis, tidal, "server_cpu_us")
        goal(
            f"1. CPU per signal, tidal full ≤ Redis always, {shape} (Redis/tidal)",
            cpu,
            1.0,
            f"{tidal['server_cpu_us']:.1f} vs {redis['server_cpu_us']:.1f} µs:"
            f" {sorted(cpu)[len(cpu) // 2]:.2f}x ({min(cpu):.2f}-{max(cpu):.2f})",
        )
    for shape in ("50x1", "16x16", "4x64"):
        goal(
            f"2. throughput, tidal full ≥ Redis always, {shape}",
            per_round(shapes["tidal full"][shape], shapes["redis always"][shape]),
            1.0,
        )
    goal(
        "2. throughput, tidal normal ≥ Redis everysec, 16x16",
        per_round(shapes["tidal normal"]["16x16"], shapes["redis everysec"]["16x16"]),
        1.0,
    )
    goal(
        "3. batch of 1,000 ≥ 3x single signals at 4x64 (tidal full)",
        per_round(extra["tidal full batch 1000 (4x4)"], shapes["tidal full"]["4x64"]),
        3.0,
    )
    counts = extra["counts under 16x16 signals"]
    p50s = [r["p50_ms"] for r in counts["runs"]]
    goal(
        "4. counts p50 ≤ 1 ms under a 16x16 signal load",
        [1.0 / max(p, 1e-9) for p in p50s],
        1.0,
        f"{sorted(p50s)[len(p50s) // 2]:.2f} ms ({min(p50s):.2f}-{max(p50s):.2f});"
        f" p99 {counts['p99_ms']:.2f} ms",
    )
    long = extra["tidal full 16x16, long"]
    tails = [r["p999_ms"] / r["p50_ms"] for r in long["runs"]]
    goal(
        f"5. p99.9 ≤ 3x p50, 16x16 over {long['requests']:,} signals (checkpoints included)",
        [3.0 / t for t in tails],
        1.0,
        f"{long['p999_ms']:.1f} / {long['p50_ms']:.1f} ms: {sorted(tails)[len(tails) // 2]:.2f}x"
        f" ({min(tails):.2f}-{max(tails):.2f})",
    )
    goal(
        "6. 100% Left ≥ 0% Left (tidal full, 16x16)",
        per_round(extra["tidal full 16x16, 100% left"], extra["tidal full 16x16, 0% left"]),
        1.0,
    )
    past = results.get("past")
    if past:
        ratios = [PAST_BEFORE_MS[m] / past[m]["writer_ms_median"] for m in ("purge", "erase")]
        goal(
            "7. purge and erase writer time within 10% of before (224 and 176 ms, issue 11)",
            [min(ratios) * 1.1],
            1.0,
            " and ".join(f"{past[m]['writer_ms_median']:.0f}" for m in ("purge", "erase")) + " ms",
        )
    lines += ["", "## Other targets", "", "| target | measured | met |", "|---|---|---|"]

    def target(name: str, value: float, at_least: float, text: str) -> None:
        lines.append(f"| {name} | {text} | {'yes' if value >= at_least else 'no'} |")

    boot = results["boot"]
    load_s = boot["full"]["load_s"] or boot["full"]["boot_s"]
    target(
        f"boot with {boot['records']:,} leave records ≤ 2 s",
        2.0 - load_s,
        0.0,
        f"{load_s:.2f} s to load, {boot['full']['boot_s']:.2f} s to listening",
    )
    target(
        "≤ 200 bytes of RSS per leave record",
        200 - boot["bytes_per_record"],
        0.0,
        f"{boot['bytes_per_record']:.0f} B"
        f" ({boot['empty']['rss_kib']:,} → {boot['full']['rss_kib']:,} KiB)",
    )
    counts = results["counts"]
    small, large = (counts[k]["p99_ms"] for k in counts)
    large_rows = list(counts)[1]
    target(
        f"counts p99 at {large_rows} within 1.5x of 10,000 rows",
        1.5 - large / small,
        0.0,
        f"{small:.2f} → {large:.2f} ms ({large / small:.2f}x)",
    )
    lines += [
        "",
        "## Other shapes",
        "",
        "| run | signals/s (range) | p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
    ]
    for name, r in extra.items():
        rate = (
            f"{r['signals_per_s']:,.0f} ({_span(r)})"
            if r["signals_per_s"]
            else f"{r['requests_per_s']:,.0f} req/s"
        )
        lines.append(f"| {name} | {rate} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
    for name, r in counts.items():
        lines.append(
            f"| counts, ledger of {name} (16x16) | {r['requests_per_s']:,.0f} req/s"
            f" | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |"
        )
    lines += past_report(results.get("past"))
    lines += [
        "",
        "Redis has no `signal_batch`: its batch row sends 1,000 script calls in one write, and"
        " counts the request answered when all 1,000 replies are in.",
        "The mixed load is 95% signal, 4% status, 1% leave/rejoin: for Redis, `signal.lua`,"
        " `SISMEMBER`, `SADD` and `SREM`.",
        "",
        "![throughput against concurrency](benchmarks.png)",
        "",
    ]
    return "\n".join(lines)


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
        " (`bench/past.py`); the writer's time is what tidal logs for each.",
        "",
        "| | writer ms (median, max) | reply ms (median) |",
        "|---|---:|---:|",
        *(
            f"| {m} | {past[m]['writer_ms_median']:.0f}, {past[m]['writer_ms_max']:.0f}"
            f" | {past[m]['reply_ms_median']:.0f} |"
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


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c}x{p}" for c, p in SHAPES]
    fig, ax = plt.subplots(figsize=(8, 5))
    for system, by_shape in results["shapes"].items():
        ax.plot(labels, [by_shape[s]["signals_per_s"] for s in labels], marker="o", label=system)
    ax.set_xlabel("clients x pipelined requests")
    ax.set_ylabel("signals per second")
    ax.set_yscale("log")
    ax.set_title("Throughput against concurrency (one run of make bench)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each shape (median)")
    parser.add_argument("--report-only", action="store_true", help="rewrite docs from results")
    args = parser.parse_args()
    results_path = ROOT / "bench" / "results.json"
    if args.report_only:
        results = json.loads(results_path.read_text())
    else:
        ensure_redis()
        results = run_all(args.scale, args.repeats)
        results_path.write_text(json.dumps(results, indent=1) + "\n")
    (ROOT / "docs" / "BENCHMARKS.md").write_text(report(results))
    plot(results, ROOT / "docs" / "benchmarks.png")
    print("wrote docs/BENCHMARKS.md and docs/benchmarks.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
