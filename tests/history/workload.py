"""Random operations over a small key space, from many pipelining connections, recorded.

Users include 0 and the u64 edges; a keyed signal's whole content follows from its key,
so a resend (on purpose: keys are drawn from a small pool) is the same signal, and the
checker can hold the server to "counted once". Cohorts are defined and dropped midway.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from tidal.client import CallTimeout, Client, ConnectionLost, ServerError

from .record import SENDING, History, Op

USERS = [*range(1, 14), 0, 2**63, 2**64 - 1]
ENTITIES = [f"p{i}" for i in range(6)]
KINDS = ["v", "l"]
COMMUNITIES = ["a", "b", "c"]
COHORTS: dict[str, dict[str, Any]] = {
    "de": {"country": "DE"},
    "all": {},
    "fr": {"country": "FR"},
    "gold": {"tier": ["gold", "pro"], "country": "DE"},
}
MIN_NS, HOUR_NS, DAY_NS = 60 * 10**9, 3600 * 10**9, 86400 * 10**9
#: event ages, none near a window's edge (1h, 24h, 7d, 30d) for runs shorter than 20 minutes
AGES = [None, None, None, 0, 30 * MIN_NS, 3 * HOUR_NS, 2 * DAY_NS, 10 * DAY_NS, 40 * DAY_NS]
KEYS = 300  # a small pool: keys are reused on purpose
CALL_TIMEOUT = 60.0
#: the most a task waits after a refusal that says "not now" (error 2) before its next call
BACKOFF = 0.05


class Signals:
    """Signals as sent on the wire; keyed ones are a function of their key."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.t0 = time.time_ns()

    def content(self, rng: random.Random, key: str | None) -> list[Any]:
        communities = rng.sample(COMMUNITIES, rng.randrange(3))
        attrs = {"country": rng.choice(["DE", "FR"]), "tier": rng.choice(["gold", "free"])}
        context: dict[str, Any] = {"communities": communities, "attrs": attrs}
        if (age := rng.choice(AGES)) is not None:
            context["at_ns"] = self.t0 - age
        if key is not None:
            context["id"] = key
        weight = rng.randrange(1, 4)
        return [rng.choice(USERS), rng.choice(ENTITIES), rng.choice(KINDS), weight, context]

    def one(self) -> list[Any]:
        if self.rng.random() < 0.3:
            key = f"k{self.rng.randrange(KEYS)}"
            return self.content(random.Random(zlib.crc32(key.encode())), key)
        return self.content(self.rng, None)


def request(
    rng: random.Random, signals: Signals, one_user: bool = False
) -> tuple[str, list[Any], int | None]:
    """One random operation: method, params, and the user it is about. ``one_user``: a
    batch's signals are of one user (cluster mode: one node serves them all)."""
    roll = rng.random()
    user = rng.choice(USERS)
    if roll < 0.55:
        item = signals.one()
        return "signal", item, item[0]
    if roll < 0.72:
        items: dict[Any, list[Any]] = {}
        for _ in range(rng.randrange(1, 7)):
            item = signals.one()
            if one_user and items:
                first = next(iter(items.values()))[0]
                if "id" in item[4] and item[0] != first:
                    continue  # a keyed signal's user follows from its key
                item[0] = first
            items.setdefault(item[4].get("id") or len(items), item)  # a key once per batch
        ack = rng.choice(["full", "compact"])
        return "signal_batch", [list(items.values()), {"ack": ack}], None
    if roll < 0.78:
        return "purge", [user], user
    if roll < 0.82:
        return "erase", [user], user
    if roll < 0.87:
        return "leave", [user, {"purge": True}], user
    if roll < 0.91:
        return "leave", [user], user
    if roll < 0.97:
        return "rejoin", [user], user
    name = rng.choice(list(COHORTS))
    if roll < 0.985:
        return "define_cohort", [name, COHORTS[name]], None
    return "drop_cohort", [name], None


class Caller(Protocol):
    """What a connection's tasks call: a ``Client``, or cluster mode's ``RoutedClient``."""

    @property
    def is_connected(self) -> bool: ...

    async def call(self, method: str, *params: Any) -> Any: ...

    async def close(self) -> None: ...


#: a new client for connection ``index``
Dial = Callable[[int], Awaitable[Caller]]


def dial_port(port: Callable[[], int]) -> Dial:
    """Clients of the one server listening on ``port()``."""

    async def dial(index: int) -> Caller:
        return await Client.connect("127.0.0.1", port(), timeout=CALL_TIMEOUT, reconnect=0)

    return dial


class Stopped(Exception):
    """The load was stopped while a task waited for the server to be back: the task ends."""


class Connection:
    """One client connection shared by a few pipelining tasks; reconnects once the
    server is back (``up``), never retrying a call itself: each call is recorded once.
    A stop (``stop``) ends the wait for ``up``, which a failed run may never set again."""

    def __init__(self, index: int, dial: Dial, up: asyncio.Event, stop: asyncio.Event) -> None:
        self.index = index
        self.dial = dial
        self.up = up
        self.stop = stop
        self.client: Caller | None = None
        self.lock = asyncio.Lock()

    async def get(self) -> Caller:
        async with self.lock:
            while self.client is None or not self.client.is_connected:
                if self.client is not None:
                    await self.client.close()
                    self.client = None
                await self._up()
                with contextlib.suppress(OSError, ConnectionLost, CallTimeout, ServerError):
                    self.client = await self.dial(self.index)
                if self.client is None:
                    await asyncio.sleep(0.05)  # the server is starting: a pace, not a sync
            return self.client

    async def _up(self) -> None:
        """Returns once the server is up; raises ``Stopped`` if the load stops first."""
        waits = [asyncio.ensure_future(self.up.wait()), asyncio.ensure_future(self.stop.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        if self.stop.is_set():
            raise Stopped

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


async def call(history: History, conn: Connection, method: str, params: list[Any],
               user: int | None) -> Op | None:  # fmt: skip
    client = await conn.get()
    op = history.invoke(conn.index, method, params, user)
    sending = SENDING.set(op)
    try:
        outcome = await client.call(method, *params)
    except (ServerError, ConnectionLost, CallTimeout, OSError) as exc:
        outcome = exc
    finally:
        SENDING.reset(sending)
    record(history, op, outcome)
    return op


#: the users and entities of ``in_order``'s probes: their own, so that no other operation
#: (an erase above all) changes what their reads count
PROBE_USERS = 10**6
#: the connections with a probe
PROBES = 2


async def in_order(history: History, conn: Connection, rng: random.Random, index: int,
                   prefix: str, stop: asyncio.Event, done: Callable[[], None]) -> None:  # fmt: skip
    """Reads answer as of their place in their connection's order (PROTOCOL.md): pipelined
    on one connection, 1-4 signals of a user of its own to an entity of its own, a purge or
    a leave with purge of that user (which a read waits for), ``counts`` of the entity, one
    more signal. The read counts every signal of the entity acknowledged before it, and
    not the one sent after it: checked here, exactly, while no signal of the entity has
    an unknown outcome (after one, the probe goes on with a new entity)."""
    user = PROBE_USERS + index
    generation, acked = 0, 0
    while not stop.is_set():
        entity = f"{prefix}.{generation}"  # no earlier probe wrote it
        n = rng.randrange(1, 5)
        purge: list[Any] = [user, {"purge": True}]
        withdrawal = ("purge", [user], user) if rng.random() < 0.5 else ("leave", purge, user)
        sent: list[tuple[str, list[Any], int | None]] = [
            *[("signal", [user, entity, "v", 1, {}], user) for _ in range(n)],
            withdrawal,
            ("counts", [entity], None),
            ("signal", [user, entity, "v", 1, {}], user),
        ]
        client = await conn.get()
        ops = [history.invoke(conn.index, m, p, u) for m, p, u in sent]
        calls = [_sending(op, client.call(m, *p)) for op, (m, p, _) in zip(ops, sent, strict=True)]
        for op, outcome in zip(ops, await asyncio.gather(*calls, return_exceptions=True),
                               strict=True):  # fmt: skip
            record(history, op, outcome)
            done()
        signals = [ops[i] for i in (*range(n), n + 2)]
        read = ops[n + 1]
        if read.outcome == "ok" and all(op.outcome in ("ok", "fail") for op in signals[:n]):
            before = acked + sum(op.outcome == "ok" for op in signals[:n])
            got = read.reply["ledger"].get("v", {}).get("count", 0)
            if got != before:
                history.observed.append((read.invoked, (
                    f"counts({entity}) = {got}, read after {before} acknowledged signals of it on"
                    f" its connection and before one more: a read answers as of its place in"
                    f" its connection's order (#{read.index})"
                )))  # fmt: skip
        if any(op.outcome not in ("ok", "fail") for op in signals):
            generation, acked = generation + 1, 0  # some may count, or not: a new entity
        else:
            acked += sum(op.outcome == "ok" for op in signals)


def _sending(op: Op, call: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
    """``call`` as a task that records its tries in ``op`` (``SENDING``); started now, in
    order with the connection's other calls."""
    return asyncio.get_running_loop().create_task(call, context=_with(op))


def _with(op: Op) -> contextvars.Context:
    context = contextvars.copy_context()
    context.run(SENDING.set, op)
    return context


def record(history: History, op: Op, outcome: Any) -> None:
    """An operation's completion, from its reply or its exception (as ``call`` records)."""
    if isinstance(outcome, ServerError):
        if "whether this request was saved is unknown" in str(outcome):
            history.complete(op, "unknown", f"{outcome.code} {outcome}")
            op.bound = time.monotonic()
        else:
            history.complete(op, "fail", f"{outcome.code} {outcome}")
            op.partial = "the rest of this request was not saved" in str(outcome)
    elif isinstance(outcome, CallTimeout):
        history.complete(op, "unknown")
        # every fault ends within seconds (a pause, a database away, a hung path that
        # tidal gives up on): a request its server never answers is a defect of its own
        history.observed.append((op.invoked, (
            f"{op.method} #{op.index} was not answered in {CALL_TIMEOUT:.0f} s, its connection"
            f" open: a request is answered, or its connection closed"
        )))  # fmt: skip
    elif isinstance(outcome, (ConnectionLost, OSError)):
        history.complete(op, "unknown")
    elif isinstance(outcome, BaseException):
        raise outcome
    else:
        history.complete(op, "ok", outcome)


async def worker(history: History, conn: Connection, rng: random.Random, signals: Signals,
                 stop: asyncio.Event, done: Callable[[], None],
                 one_user: bool) -> None:  # fmt: skip
    while not stop.is_set():
        method, params, user = request(rng, signals, one_user)
        op = await call(history, conn, method, params, user)
        done()
        if op is not None and op.outcome == "fail" and str(op.reply).startswith("2 "):
            # refused for now (the database is away, the budget full): a client backs off,
            # as one would; else a second's outage is thousands of refusals, which the
            # checker goes through at every check, and the history says nothing more
            await asyncio.sleep(rng.uniform(0, BACKOFF))  # a pace, not a synchronisation


class Load:
    """``connections`` connections of ``depth`` pipelining tasks each, until stopped."""

    def __init__(self, history: History, rng: random.Random, dial: Dial, up: asyncio.Event,
                 connections: int = 8, depth: int = 3, one_user: bool = False) -> None:  # fmt: skip
        self.history, self.rng, self.up = history, rng, up
        self.one_user = one_user
        self._stop = asyncio.Event()
        self.conns = [Connection(i, dial, up, self._stop) for i in range(connections)]
        self.depth = depth
        self.signals = Signals(rng)
        self.completed = 0
        self.starts = 0
        self._target = 0
        self._reached = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.watcher = Connection(connections, dial, up, self._stop)
        #: the most the aggregates took past what was allowed, and that, in bytes
        self.memory_over = (0, 0)

    def _done(self) -> None:
        self.completed += 1
        if self.completed >= self._target:
            self._reached.set()

    def _task(self, work: Awaitable[None]) -> None:
        async def until_stopped() -> None:
            with contextlib.suppress(Stopped):
                await work

        self._tasks.append(asyncio.create_task(until_stopped()))

    def start(self) -> None:
        self._stop.clear()
        self._tasks = []
        for conn in self.conns:
            for _ in range(self.depth if conn.index % 2 else 16):  # some pipeline deep
                self._task(worker(
                    self.history,
                    conn,
                    random.Random(self.rng.random()),
                    self.signals,
                    self._stop,
                    self._done,
                    self.one_user,
                ))  # fmt: skip
        self.starts += 1
        self._task(self._watch_memory(self.watcher))
        for conn in self.conns[:PROBES]:  # a probe of reads in order on each
            rng = random.Random(self.rng.random())
            prefix = f"q{conn.index}.{self.starts}"
            probe = in_order(self.history, conn, rng, conn.index, prefix, self._stop, self._done)
            self._task(probe)

    async def _watch_memory(self, conn: Connection) -> None:
        """``stats`` polled all along, on a connection of its own: the memory budget is
        held at every moment, not only when the checker looks (``memory_over``). A boot
        loads what the database holds, even past the budget (PROTOCOL.md): writes may
        not add to what a server held when first seen (on each new connection), if that
        was more."""
        seen: Caller | None = None  # a new connection: a server started, or back
        most = 0
        while not self._stop.is_set():
            client = await conn.get()
            with contextlib.suppress(ServerError, ConnectionLost, CallTimeout, OSError):
                stats = await client.call("stats")
                budget, used = stats["memory_budget"], stats["aggregates_bytes"]
                if client is not seen:
                    seen, most = client, max(budget, used)
                if budget and used > most:
                    self.memory_over = max(self.memory_over, (used, most))
            await asyncio.sleep(0.02)  # a poll's pace, not a synchronisation

    async def until(self, more: int, timeout: float = 120) -> None:
        """Returns once ``more`` further operations have completed (a state, not a time)."""
        self._target = self.completed + more
        self._reached.clear()
        if self.completed < self._target:
            await asyncio.wait_for(self._reached.wait(), timeout)

    async def stop(self) -> None:
        self._stop.set()
        await asyncio.gather(*self._tasks)
        for conn in [*self.conns, self.watcher]:
            await conn.close()
            conn.client = None


Step = Callable[[], Awaitable[None]]
