"""The faults, done for real to a real ``tidal serve`` and its database.

- ``kill9``: SIGKILL, then a start on the same database.
- ``term``: SIGTERM (a graceful stop), then a start.
- ``pause``: SIGSTOP, a pause while clients keep sending, then SIGCONT.
- ``pg_restart`` (PostgreSQL): the database stopped with ``-m immediate`` under load,
  then started; tidal refuses writes meanwhile and must come back by itself.
- With a ``--standby`` (PostgreSQL), every kill and stop is a takeover: the standby
  serves, and a new standby is started behind it; a database restart may hand the
  database to either.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable

from tidal.client import Client
from tidal.testing.postgres import Cluster

from ..conftest import Database, ServerProcess
from .record import History

NEMESIS = ("kill9", "term", "pause", "pg_restart")


class Target:
    """The server under test: one serving process, and with ``standby`` one waiting."""

    def __init__(self, database: Database, history: History, *extra: str,
                 pg: Cluster | None = None, standby: bool = False) -> None:  # fmt: skip
        self.database, self.history, self.extra, self.pg = database, history, extra, pg
        self.serving = ServerProcess(database.target, *extra)
        self.waiting: ServerProcess | None = None
        self.with_standby = standby
        self.up = asyncio.Event()  # clients connect only while it is set

    def port(self) -> int:
        return self.serving.port

    async def start(self) -> None:
        """The serving process, unless it runs (a standby that took over), and a standby."""
        proc = self.serving.proc
        if proc is None or proc.returncode is not None:
            await self.serving.start()
        if self.with_standby and self.waiting is None:
            self.waiting = await ServerProcess(
                self.database.target, "--standby", *self.extra
            ).start(bound=True)
            await self.waiting.logged("standby: waiting for")
        self.up.set()

    async def close(self) -> None:
        self.up.clear()
        for proc in (self.serving, self.waiting):
            if proc is not None and proc.proc is not None and proc.proc.returncode is None:
                await proc.kill9()

    async def _dead(self, signum: int) -> None:
        self.up.clear()
        self.history.fault(signal.Signals(signum).name)
        await self.serving.stop(signum)
        self.history.died(self.history.faults[-1].at)

    async def _next(self) -> None:
        """After the serving process died: its standby takes over, and a new standby goes
        behind it; without one, it is started again on the same database."""
        if self.waiting is not None:
            self.serving, self.waiting = self.waiting, None
            await self.serving.logged("listening on", timeout=60)
            self.history.fault("standby took over")
        await self.start()

    async def kill9(self, rng: random.Random) -> None:
        await self._dead(signal.SIGKILL)
        await self._next()

    async def term(self, rng: random.Random) -> None:
        await self._dead(signal.SIGTERM)
        await self._next()

    async def pause(self, rng: random.Random) -> None:
        assert self.serving.proc is not None
        self.history.fault("SIGSTOP")
        os.kill(self.serving.proc.pid, signal.SIGSTOP)
        await asyncio.sleep(rng.uniform(0.2, 1.5))  # the fault itself is a span of time
        os.kill(self.serving.proc.pid, signal.SIGCONT)
        self.history.fault("SIGCONT")

    async def pg_restart(self, rng: random.Random) -> None:
        assert self.pg is not None
        self.history.fault("postgresql stop -m immediate")
        await asyncio.to_thread(self.pg.stop, "immediate")
        await asyncio.sleep(rng.uniform(0.1, 1.0))  # down for a while, under load
        await asyncio.to_thread(self.pg.start)
        self.history.fault("postgresql started")
        if self.waiting is not None:
            await self._settle_lock()

    async def _settle_lock(self) -> None:
        """With its session gone, the standby may have taken the database: then the one
        that served stops writing, and is stopped here; a new standby goes behind."""
        assert self.waiting is not None
        serving, waiting = self.serving, self.waiting
        assert serving.proc is not None
        won = asyncio.ensure_future(waiting.logged("listening on", timeout=3600))
        kept = asyncio.ensure_future(self._serves(serving))
        exited = asyncio.ensure_future(serving.proc.wait())
        await asyncio.wait([won, kept, exited], return_when=asyncio.FIRST_COMPLETED)
        kept.cancel()
        exited.cancel()
        if kept.done() and not kept.cancelled() and kept.exception() is None:
            won.cancel()
            return
        self.up.clear()
        await serving.stop(signal.SIGKILL)
        self.history.died(time.monotonic())
        try:
            await asyncio.wait_for(won, 60)
        except TimeoutError:
            raise AssertionError(
                "the database restarted, the serving tidal stopped and its standby did not"
                " take over in 60 s:\n" + b"".join(serving.log[-20:] + waiting.log[-20:]).decode()
            ) from None
        self.history.fault("standby took over after the database restarted")
        self.serving, self.waiting = waiting, None
        await self.start()  # a new standby behind it

    @staticmethod
    async def _serves(process: ServerProcess) -> None:
        """Returns once ``process`` commits again: its health says ok."""
        async with await Client.connect("127.0.0.1", process.port, timeout=10) as c:
            for _ in range(72000):  # polled, for an hour at most: health is the state
                if (await c.health())["status"] == "ok":
                    return
                await asyncio.sleep(0.05)

    def faults(self, names: list[str]) -> list[Callable[[random.Random], Awaitable[None]]]:
        """The faults named (kill9 twice as likely), those this backend has."""
        kinds: list[Callable[[random.Random], Awaitable[None]]] = []
        for name in names:
            if name == "pg_restart" and self.pg is None:
                continue
            fault = getattr(self, name, None)
            if name not in NEMESIS or fault is None:
                raise ValueError(f"TIDAL_HISTORY_NEMESIS: {name!r} is not one of {NEMESIS}")
            kinds += [fault] * (2 if name == "kill9" else 1)
        return kinds
