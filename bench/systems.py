"""The systems ``make bench`` drives, each started on a fresh database and each driven
by the same load generator (``tidal bench``): tidal on SQLite and on PostgreSQL, the
bare stack (bench/bare_server.py), and Redis."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tidal.cli.child import Child, start
from tidal.testing.postgres import Cluster

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
TIDAL = str(VENV_BIN / "tidal")
PG = "tidal full on PostgreSQL"


def stop(server: Child) -> None:
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(60)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()


@contextmanager
def tidal_server(
    durability: str, db: Path | None = None, extra: tuple[str, ...] = ()
) -> Iterator[Child]:
    with tempfile.TemporaryDirectory(prefix="tidal-bench-") as tmp:
        path = db or Path(tmp) / "bench.db"
        server = start(
            [TIDAL, "serve", "--port", "0", "--db", str(path), "--durability", durability, *extra]
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
    cmd += ["--allow-data", "--keep"]  # a throwaway database, filled by the scenarios
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
