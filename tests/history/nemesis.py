"""The faults, done for real to a real ``tidal serve`` and its database.

- ``kill9``: SIGKILL, then a start on the same database.
- ``term``: SIGTERM (a graceful stop), then a start.
- ``pause``: SIGSTOP, a pause while clients keep sending, then SIGCONT.
- ``pg_restart`` (PostgreSQL): the database stopped with ``-m immediate`` under load,
  then started; tidal refuses writes meanwhile and must come back by itself.
- ``mute`` (PostgreSQL): the relay between tidal and the database stops passing bytes on
  as a COMMIT goes by, both of its connections kept open (a hung pgbouncer or load
  balancer), until tidal says it is failing and a while after; then it passes them on.
- ``disk_full`` (SQLite): the file system the database is on (a tmpfs of the test's own)
  filled to the last byte for a while under load, then given room again; tidal refuses
  writes meanwhile and must come back by itself.
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
from pathlib import Path
from typing import Any

from tidal.client import Client
from tidal.testing.postgres import Cluster

from ..conftest import Database, ServerProcess
from ..relay import Relay
from .record import History

NEMESIS = ("kill9", "term", "pause", "pg_restart", "mute", "disk_full")
#: what only PostgreSQL has
DATABASE_FAULTS = ("pg_restart", "mute")
#: what only a database in a file of the test's own file system has
FILE_FAULTS = ("disk_full",)
#: the longest a server may take to serve again after a fault, or its standby to take
#: over: past it, the run fails saying so (a wedge), rather than waiting on
RECOVERY = 120.0


class Target:
    """The server under test: one serving process, and with ``standby`` one waiting."""

    def __init__(self, database: Database, history: History, *extra: str,
                 pg: Cluster | None = None, standby: bool = False,
                 disk: Path | None = None) -> None:  # fmt: skip
        self.database, self.history, self.extra, self.pg = database, history, extra, pg
        self.disk = disk  # the file system the SQLite file is on, for ``disk_full``
        #: PostgreSQL is reached through a relay, which ``mute`` makes hang
        self.relay = None if pg is None else Relay(pg.port)
        self.target = database.target
        if self.relay is not None:
            assert pg is not None and f":{pg.port}/" in self.target
            self.target = self.target.replace(f":{pg.port}/", f":{self.relay.port}/")
        self.serving = ServerProcess(self.target, *extra)
        self.waiting: ServerProcess | None = None
        self.with_standby = standby
        self.up = asyncio.Event()  # clients connect only while it is set

    def port(self) -> int:
        return self.serving.port

    async def start(self) -> None:
        """The serving process, unless it runs (a standby that took over), and a standby."""
        if self.relay is not None and self.relay.closed:
            await self.relay.start()
        proc = self.serving.proc
        if proc is None or proc.returncode is not None:
            await self.serving.start()
        if self.with_standby and self.waiting is None:
            self.waiting = await ServerProcess(self.target, "--standby", *self.extra).start(
                bound=True
            )
            await self.waiting.logged("standby: waiting for")
        self.up.set()

    def logs(self, lines: int = 40) -> str:
        """The last lines each server logged, the one serving and the one waiting."""
        out = []
        for name, proc in (("serving", self.serving), ("waiting", self.waiting)):
            if proc is not None:
                tail = b"".join(proc.log[-lines:]).decode(errors="replace")
                out.append(f"--- the {name} tidal's last {lines} lines:\n{tail}")
        return "\n".join(out)

    async def close(self) -> None:
        self.up.clear()
        for proc in (self.serving, self.waiting):
            if proc is not None and proc.proc is not None and proc.proc.returncode is None:
                await proc.kill9()
        if self.relay is not None:
            await self.relay.close()

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
            await self.serving.logged("listening on", timeout=RECOVERY)
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
        await restart_postgresql(self.pg, self.history, rng)
        if self.waiting is not None:
            await self._settle_lock("the database restarted")

    async def mute(self, rng: random.Random) -> None:
        assert self.relay is not None
        self.history.fault("relay to postgresql hangs at the next COMMIT")
        self.relay.mute(b"COMMIT")
        await self._health(self.serving, lambda h: h["status"] != "ok", "to say it is failing")
        await asyncio.sleep(rng.uniform(0, 2.0))  # the fault is a span of time
        self.relay.unmute()
        self.history.fault("relay passes bytes on again")
        if self.waiting is not None:
            await self._settle_lock("its path to the database hung")
        else:
            await self._serves(self.serving)

    async def disk_full(self, rng: random.Random) -> None:
        assert self.disk is not None
        ballast = self.disk / "ballast"
        await asyncio.to_thread(_fill, ballast)
        self.history.fault("disk full")
        await asyncio.sleep(rng.uniform(0.2, 1.5))  # the fault is a span of time
        ballast.unlink()
        self.history.fault("disk has room again")
        await self._serves(self.serving)

    async def settle(self) -> None:
        """Before a check: who serves, as the processes say. Under load, the serving tidal
        may have let the database go by itself (a COMMIT and a new session both unanswered
        for seconds: judged a silent path, its session ended), and its standby taken it."""
        if self.waiting is not None:
            await self._settle_lock("its session ended by itself")
        else:
            await self._serves(self.serving)

    async def _settle_lock(self, why: str) -> None:
        """With its session gone (``why``), the standby may have taken the database: then the one
        that served stops writing, and is stopped here; a new standby goes behind."""
        assert self.waiting is not None
        serving, waiting = self.serving, self.waiting
        assert serving.proc is not None
        won = asyncio.ensure_future(waiting.logged("listening on", timeout=RECOVERY))
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
            await won
        except AssertionError:
            raise AssertionError(
                f"{why}, the serving tidal neither committed again nor let its standby take"
                f" over in {RECOVERY:.0f} s:\n" + self.logs(20)
            ) from None
        self.history.fault(f"standby took over after {why}")
        self.serving, self.waiting = waiting, None
        await self.start()  # a new standby behind it

    @classmethod
    async def _serves(cls, process: ServerProcess) -> None:
        """Returns once ``process`` commits again: its health says ok."""
        await cls._health(process, lambda h: h["status"] == "ok", "to commit again", RECOVERY)

    @staticmethod
    async def _health(process: ServerProcess, until: Callable[[dict[str, Any]], bool],
                      what: str, most: float = 60) -> None:  # fmt: skip
        """Returns once ``process``'s health passes ``until``, polled: health is the state."""
        async with await Client.connect("127.0.0.1", process.port, timeout=10) as c:
            deadline = time.monotonic() + most
            while time.monotonic() < deadline:
                if until(await c.health()):
                    return
                await asyncio.sleep(0.05)
        raise AssertionError(f"tidal's health did not change {what} in {most:.0f} s:\n"
                             + b"".join(process.log[-20:]).decode())  # fmt: skip

    def faults(self, names: list[str]) -> list[Callable[[random.Random], Awaitable[None]]]:
        """The faults named (kill9 twice as likely), those this backend has."""
        kinds: list[Callable[[random.Random], Awaitable[None]]] = []
        for name in names:
            if name in DATABASE_FAULTS and self.pg is None:
                continue
            if name in FILE_FAULTS and self.disk is None:
                continue
            fault = getattr(self, name, None)
            if name not in NEMESIS or fault is None:
                raise ValueError(f"TIDAL_HISTORY_NEMESIS: {name!r} is not one of {NEMESIS}")
            kinds += [fault] * (2 if name == "kill9" else 1)
        return kinds


async def restart_postgresql(pg: Cluster, history: History, rng: random.Random) -> None:
    """PostgreSQL stopped ``-m immediate`` under load, down for a while, then started."""
    history.fault("postgresql stop -m immediate")
    await asyncio.to_thread(pg.stop, "immediate")
    await asyncio.sleep(rng.uniform(0.1, 1.0))  # down for a while, under load
    await asyncio.to_thread(pg.start)
    history.fault("postgresql started")


def _fill(ballast: Path) -> None:
    """Takes every byte left on ``ballast``'s file system (tmpfs allocates at once): a MiB
    at a time, then a page at a time (one call for all that is free fails whole)."""
    with ballast.open("wb") as f:
        end = 0
        for step in (2**20, os.statvfs(ballast.parent).f_frsize):
            while True:
                try:
                    os.posix_fallocate(f.fileno(), end, step)
                except OSError:
                    break
                end += step
