"""Fixtures: a real server on 127.0.0.1 port 0, in process or as a child, over a real SQLite
file or a real PostgreSQL database (tests marked ``both_backends`` run on each)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tidal.cli.child import listening_port
from tidal.cli.child import start as start_child
from tidal.client import Client, ClusterClient
from tidal.server import Config, Server
from tidal.server.core.chunks import unpack_records
from tidal.testing.postgres import Cluster, Missing, fetch, free_port

BACKENDS = ("sqlite", "postgresql")
#: what ``tidal serve`` logs once its port is bound, before it loads (or, as a standby, waits)
BOUND = re.compile(rb"bound \S+:(\d+);")
#: ... and once its HTTP port is (``--http``)
HTTP_BOUND = re.compile(rb"HTTP on https?://\S+:(\d+)/")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test about what tidal promises runs on both backends, when marked so; one marked
    ``through_cluster`` runs on SQLite (or both) and through a ``ClusterClient`` on three
    nodes."""
    if "backend" not in metafunc.fixturenames:
        return
    cluster = metafunc.definition.get_closest_marker("through_cluster") is not None
    if metafunc.definition.get_closest_marker("both_backends"):
        metafunc.parametrize("backend", (*BACKENDS, "cluster") if cluster else BACKENDS)
    elif cluster:
        metafunc.parametrize("backend", ("sqlite", "cluster"))


@pytest.fixture
def backend() -> str:
    return "sqlite"


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    try:
        cluster = Cluster()
    except Missing as exc:
        pytest.fail(str(exc))
    yield cluster
    cluster.destroy()


@dataclass
class Database:
    """Where a test's server keeps its state: ``target`` is what ``--db`` is given."""

    backend: str
    target: str

    async def rows(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """A query of the database as it stands (``?`` placeholders on both backends)."""
        if self.backend == "sqlite":
            with contextlib.closing(sqlite3.connect(self.target)) as db:
                return db.execute(sql, args).fetchall()
        parts = sql.split("?")
        numbered = parts[0] + "".join(f"${i}{p}" for i, p in enumerate(parts[1:], 1))
        return await fetch(self.target, numbered, *args)

    async def board(self) -> dict[tuple[str, int, int | str, str], tuple[int, float]]:
        """Each aggregate as the board's chunks hold it on disk, (entity, layer, key, kind)
        to (count, weight): a tally's record in the newest chunk holding it (``chunks``)."""
        held: dict[int, tuple[str, int, int | str, str, int, float] | None] = {}
        for (data,) in await self.rows("SELECT records FROM board_chunks ORDER BY chunk DESC"):
            r = unpack_records(data)
            for tid in r.buried:
                held.setdefault(tid, None)
            for j, tid in enumerate(r.ids):
                layer, key, kind = r.slots[r.where[j]]
                held.setdefault(tid, (r.entities[j], layer, key, kind, r.counts[j], r.weights[j]))
        return {row[:4]: row[4:] for row in held.values() if row is not None}


@pytest.fixture
async def database(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[Database]:
    if backend == "sqlite":
        yield Database(backend, str(tmp_path / "tidal.db"))
        return
    cluster: Cluster = request.getfixturevalue("pg_cluster")
    name = await cluster.create()
    yield Database(backend, cluster.url(name))
    await cluster.drop(name)


@contextlib.contextmanager
def tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """A real, small file system of our own (tmpfs), so that it can be filled or made read-only."""
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"this test mounts a tmpfs and needs root to: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "tidal.db"


@pytest.fixture
async def server(database: Database) -> AsyncIterator[Server]:
    """A server on the test's database; with the ``cluster`` backend, the first of three
    cluster nodes (in this process) over it."""
    if database.backend == "cluster":
        async with three_nodes(database) as servers:
            yield servers[0]
        return
    srv = Server(Config(host="127.0.0.1", port=0, db=database.target))
    await srv.start()
    yield srv
    await srv.shutdown()


@pytest.fixture
async def client(server: Server, backend: str) -> AsyncIterator[Any]:
    """A client of ``server``; with the ``cluster`` backend, a ``ClusterClient`` that finds
    the other nodes from its partition map."""
    host, port = server.address
    if backend == "cluster":
        async with await ClusterClient.connect(host, port, timeout=10) as routed:
            yield routed
        return
    async with await Client.connect(host, port, timeout=10) as c:
        yield c


@contextlib.asynccontextmanager
async def three_nodes(database: Database, http: bool = False) -> AsyncIterator[list[Server]]:
    """Three cluster nodes on ``database``, once they share every partition; with ``http``,
    each serving its HTTP edge too."""
    servers: list[Server] = []
    try:
        for _ in range(3):
            port = free_port()
            config = Config(
                host="127.0.0.1", port=port, db=database.target, cluster="semantic",
                advertise=f"127.0.0.1:{port}", http="127.0.0.1:0" if http else None,
            )  # fmt: skip
            servers.append(Server(config))
            await servers[-1].start()
        wanted = {f"127.0.0.1:{srv.address[1]}" for srv in servers}
        async with await Client.connect(*servers[0].address, timeout=10) as c:
            for _ in range(1000):  # the nodes' own ticks, polled: 20 s at most
                if {o for o, _ in (await c.call("partition_map"))["owners"]} == wanted:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("three cluster nodes did not share the partitions in 20 s")
        yield servers
    finally:
        for srv in servers:
            await srv.shutdown()


async def signal_p99(client: Client, n: int) -> float:
    """The p99 latency, in seconds, of ``n`` signals sent one after another."""
    latencies = []
    for i in range(n):
        began = time.perf_counter()
        await client.signal(i, "e", "view")
        latencies.append(time.perf_counter() - began)
    return statistics.quantiles(latencies, n=100)[98]


class ServerProcess:
    """``tidal serve`` as a child process, so it can be killed for real."""

    def __init__(self, db: str | Path, *extra: str, launcher: list[str] | None = None) -> None:
        self.db = db
        self.extra = extra
        self.launcher = launcher or [sys.executable, "-m", "tidal.cli"]
        self.proc: asyncio.subprocess.Process | None = None
        self.port = 0
        self.http_port = 0  # with --http
        self.log: list[bytes] = []
        self._reader: asyncio.Task[None] | None = None
        self._awaited: list[tuple[bytes, asyncio.Future[None]]] = []

    @property
    def file(self) -> Path:
        """The SQLite file it serves (for the tests about the file itself)."""
        assert isinstance(self.db, Path) or "://" not in self.db, "not a SQLite file"
        return Path(self.db)

    async def start(self, *, bound: bool = False) -> ServerProcess:
        """Returns once it listens; with ``bound``, once its port is bound (a standby's
        is, while it waits for the database)."""
        self.log = []
        self.proc = await asyncio.create_subprocess_exec(
            *self.launcher,
            "serve",
            "--port",
            "0",
            "--db",
            str(self.db),
            *self.extra,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        assert self.proc.stderr is not None
        while True:
            line = await asyncio.wait_for(self.proc.stderr.readline(), 30)
            if not line:
                await self.proc.wait()
                raise AssertionError(
                    "tidal serve exited before listening:\n" + b"".join(self.log).decode()
                )
            self.log.append(line)
            if found := HTTP_BOUND.search(line):
                self.http_port = int(found.group(1))
            if (port := listening_port(line)) is not None:
                self.port = port
                break
            if bound and (found := BOUND.search(line)):
                self.port = int(found.group(1))
                break
        self._reader = asyncio.create_task(self._drain(self.proc.stderr))
        return self

    async def _drain(self, stream: asyncio.StreamReader) -> None:
        while line := await stream.readline():
            self.log.append(line)
            for text, future in self._awaited:
                if text in line and not future.done():
                    future.set_result(None)

    async def logged(self, text: str, timeout: float = 30) -> None:
        """Returns once a line of its log holds ``text`` (from its start on)."""
        wanted = text.encode()
        if any(wanted in line for line in self.log):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._awaited.append((wanted, future))
        try:
            await asyncio.wait_for(future, timeout)
        except TimeoutError:
            raise AssertionError(
                f"never logged {text!r}:\n" + b"".join(self.log).decode()
            ) from None

    async def connect(self) -> Client:
        return await Client.connect("127.0.0.1", self.port, timeout=10)

    async def connect_with(self, **options: Any) -> Client:
        return await Client.connect("127.0.0.1", self.port, **{"timeout": 10, **options})

    async def stop(self, signum: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            # a process that exited by itself may be reaped already, its returncode not yet set
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signum)
        return await self.wait()

    async def wait(self) -> int:
        assert self.proc is not None
        code = await asyncio.wait_for(self.proc.wait(), 30)
        if self._reader is not None:
            await self._reader
        return code

    async def kill9(self) -> None:
        code = await self.stop(signal.SIGKILL)
        assert code == -signal.SIGKILL


class BlockingServer:
    """``tidal serve`` as a child, for tests without an event loop (the blocking client)."""

    def __init__(self, db: str | Path, *extra: str) -> None:
        self.db, self.extra = db, extra
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self) -> BlockingServer:
        serve = ["serve", "--port", "0", "--db", str(self.db), *self.extra]
        child = start_child([sys.executable, "-m", "tidal.cli", *serve])
        self.proc, self.port = child.proc, child.port
        return self

    def stop(self, signum: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signum)
        return self.proc.wait(30)


@pytest.fixture
def blocking_server(db_path: Path) -> Iterator[BlockingServer]:
    server = BlockingServer(db_path).start()
    yield server
    server.stop(signal.SIGKILL)


@pytest.fixture
async def process(database: Database) -> AsyncIterator[ServerProcess]:
    proc = ServerProcess(database.target)
    yield proc
    if proc.proc is not None and proc.proc.returncode is None:
        await proc.kill9()
