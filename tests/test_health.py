"""Health that tells the truth: an orchestrator routes and restarts on it.

``health`` is ok only when the database is loaded, storage takes writes, and the
writer answers; the CLI (Docker's health check) and the metrics say the same.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
import subprocess
import sys
from collections.abc import Awaitable, Callable
from importlib.metadata import version
from pathlib import Path

import pytest

from tidal.cli.child import listening_port
from tidal.client import CallTimeout, Client, Unavailable
from tidal.server import Config, Server
from tidal.server.core.batch import Batch
from tidal.server.errors import StorageFailure

from .test_durability import wrap_commit
from .test_observability import scrape, value


def health_cli(port: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli", "health", "--port", str(port), "--timeout", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_a_healthy_server_says_ok_everywhere(db_path: Path) -> None:
    server = Server(Config(port=0, db=str(db_path), metrics_port=0))
    await server.start()
    try:
        async with await Client.connect(*server.address) as c:
            assert await c.health() == {"status": "ok", "storage": "ok", "memory": "ok"}
            assert (await c.stats())["version"] == version("tidal")  # from the package
        done = await asyncio.to_thread(health_cli, server.address[1])
        assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
        text = await asyncio.to_thread(scrape, server.metrics_port)
        assert value(text, "tidal_ready") == 1 and value(text, "tidal_storage_up") == 1
        assert value(text, "process_resident_memory_bytes") > 1e6  # prometheus-client's own
        assert value(text, "process_open_fds") > 0
    finally:
        await server.shutdown()


async def test_a_server_whose_storage_failed_is_unhealthy(db_path: Path) -> None:
    server = Server(Config(port=0, db=str(db_path), metrics_port=0))
    await server.start()

    async def broken(real: Callable[[Batch], Awaitable[None]], batch: Batch) -> None:
        if batch.writes:
            raise StorageFailure("disk I/O error", transient=False)
        await real(batch)

    try:
        async with await Client.connect(*server.address) as c:
            wrap_commit(server, broken)
            with pytest.raises(Unavailable):
                await c.leave(1)
            assert await c.ping() == "pong"  # alive, answering ...
            health = await c.health()  # ... and not fit to serve
            assert health["status"] == "failing" and health["storage"] == "failed"
            assert "disk I/O error" in health["error"]
        done = await asyncio.to_thread(health_cli, server.address[1])
        assert done.returncode == 1, done.stdout
        assert done.stdout.startswith("failing: storage failed"), done.stdout
        assert "disk I/O error" in done.stdout
        text = await asyncio.to_thread(scrape, server.metrics_port)
        assert value(text, "tidal_storage_up") == 0 and value(text, "tidal_ready") == 1
    finally:
        await server.shutdown()


async def test_a_writer_that_hangs_fails_the_health_check(server: Server) -> None:
    release = asyncio.Event()
    stuck = asyncio.Event()

    async def hung(real: Callable[[Batch], Awaitable[None]], batch: Batch) -> None:
        if batch.writes:
            stuck.set()
            await release.wait()  # an fsync that does not return
        await real(batch)

    wrap_commit(server, hung)
    async with await Client.connect(*server.address) as c:
        leave = asyncio.create_task(c.leave(3))
        await stuck.wait()
        assert await c.ping() == "pong"
        with pytest.raises(CallTimeout):
            await asyncio.wait_for(c.call("health", timeout=0.5), 5)
        release.set()
        assert (await leave).status == "left"
        assert (await c.health())["status"] == "ok"


async def test_a_long_boot_answers_health_as_starting(db_path: Path) -> None:
    """The boot is held up for real: another program holds the database's write lock."""
    made = sqlite3.connect(db_path, isolation_level=None)
    made.execute("PRAGMA journal_mode=DELETE")
    made.execute("BEGIN EXCLUSIVE")  # tidal's switch to WAL waits (up to 5 s) for this
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tidal.cli",
        "serve",
        "--port",
        "0",
        "--metrics-port",
        "0",
        "--db",
        str(db_path),
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    try:
        port = metrics_port = 0
        while not port:
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            assert line, "tidal serve exited during boot"
            if found := re.search(rb"metrics on http://[^:]+:(\d+)", line):
                metrics_port = int(found.group(1))
            if found := re.search(rb"bound [^:]+:(\d+); loading", line):
                port = int(found.group(1))
        async with await Client.connect("127.0.0.1", port, reconnect=0) as c:
            assert await c.health() == {"status": "starting", "storage": "loading"}
            assert await c.ping() == "pong"
            with pytest.raises(Unavailable, match="starting"):
                await c.status(1)
            done = await asyncio.to_thread(health_cli, port)
            assert done.returncode == 1 and done.stdout.startswith("starting"), done.stdout
            text = await asyncio.to_thread(scrape, metrics_port)
            assert value(text, "tidal_ready") == 0 and value(text, "tidal_storage_up") == 0
            made.execute("ROLLBACK")
            made.close()
            while listening_port(await asyncio.wait_for(proc.stderr.readline(), 30)) is None:
                pass
            assert (await c.health())["status"] == "ok"  # the same connection, now served
            assert (await c.status(1)).status == "active"
    finally:
        proc.kill()
        await proc.wait()
