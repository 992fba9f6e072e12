"""A consumer group under the same faults: consumers that take their share of the feed,
acknowledge most of it in small batches, and now and then crash between receiving and
acknowledging (their connection closed, nothing acknowledged). Every delivery and every
ack is recorded with its time, and checked after each fault:

- none is stuck: once the load stops, a consumer that acknowledges everything brings
  the group to lag 0 and nothing pending;
- none is lost: every event of the feed past the group's start was delivered;
- an acknowledged event is never delivered again once its ack was answered;
- per-user order: a user's events are first received in id order;
- receipts agree: each user's latest leave, purge and erase (as the feed has them) are
  the receipt's, each acknowledged, and acknowledged by an ack the history has;
  ``unconfirmed`` then names no one.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from tidal.client import Client, InvalidParams
from tidal.server.core.replies import UNKNOWN_SAVED

GROUP = "history"
#: short, so that faults find events out and sent again
ACK_WAIT = "1s"
CONSUMERS = 3
#: of the events a consumer receives, the share after which it crashes unacknowledged
CRASH = 0.02


@dataclass
class Delivery:
    at: float
    session: int
    id: int
    user: int | None
    deliveries: int


@dataclass
class Ack:
    session: int
    ids: list[int]
    invoked: float
    completed: float = float("inf")
    outcome: str = "pending"  # ok, fail, unknown


@dataclass
class GroupHistory:
    deliveries: list[Delivery] = field(default_factory=list)
    acks: list[Ack] = field(default_factory=list)
    sessions: int = 0
    crashes: int = 0
    #: the ports consumers subscribed at: in cluster mode, each node that served the groups
    ports: set[int] = field(default_factory=set)


class Session:
    """One consumer connection, over a bare socket: what it receives is recorded as it is
    read; its acks are recorded as sent and answered."""

    def __init__(self, record: GroupHistory, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:  # fmt: skip
        self.record, self.reader, self.writer = record, reader, writer
        record.sessions += 1
        self.index = record.sessions
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.msgid = 0
        self.replies: dict[int, asyncio.Future[Any]] = {}
        self.events: asyncio.Queue[Delivery | None] = asyncio.Queue()
        self.reading: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, record: GroupHistory, port: int) -> Session:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        session = cls(record, reader, writer)
        session.reading = asyncio.create_task(session._read())
        error, _ = await session.call("subscribe", {"group": GROUP})
        if error is not None:
            session.close()
            raise ConnectionError(f"subscribe refused: {error}")
        record.ports.add(port)
        return session

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(1 << 16):
                self.unpacker.feed(data)
                for message in self.unpacker:
                    self._take(message)
        except (ConnectionError, OSError):
            pass
        finally:
            for future in self.replies.values():
                if not future.done():
                    future.set_exception(ConnectionError("lost"))
            self.events.put_nowait(None)

    def _take(self, message: Any) -> None:
        if message[0] == 1:
            future = self.replies.pop(message[1], None)
            if future is not None and not future.done():
                future.set_result((message[2], message[3]))
        elif message[1] == "event" and len(message[2]) == 2:
            event, meta = message[2]
            d = Delivery(time.monotonic(), self.index, event["id"], event.get("user_id"),
                         meta["deliveries"])  # fmt: skip
            self.record.deliveries.append(d)
            self.events.put_nowait(d)

    async def call(self, method: str, *params: Any) -> tuple[Any, Any]:
        if self.reading is not None and self.reading.done():
            raise ConnectionError("lost")  # what is sent now is never answered
        self.msgid += 1
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.replies[self.msgid] = future
        self.writer.write(msgpack.packb([0, self.msgid, method, list(params)]))
        return await asyncio.wait_for(future, 60)

    async def ack(self, ids: list[int]) -> None:
        sent = Ack(self.index, ids, time.monotonic())
        self.record.acks.append(sent)
        try:
            error, _ = await self.call("ack", ids)
        except (ConnectionError, OSError, TimeoutError):
            sent.outcome = "unknown"
            return
        sent.completed = time.monotonic()
        if error is None:
            sent.outcome = "ok"
        else:  # a commit cut off and not settled in time says so: it may have held
            sent.outcome = "unknown" if UNKNOWN_SAVED in str(error[1]) else "fail"

    def close(self) -> None:
        self.writer.close()
        if self.reading is not None:
            self.reading.cancel()


#: the port of the server that serves the groups (in cluster mode, partition 0's node)
Port = Callable[[], Awaitable[int]]


async def consume(record: GroupHistory, port: Port, up: asyncio.Event,
                  stop: asyncio.Event, rng: random.Random) -> None:  # fmt: skip
    """One consumer until ``stop``: it reconnects after a crash of its own or a fault (in
    cluster mode, to the node that serves the groups then: ``moved`` refuses the others)."""
    while not stop.is_set():
        if not await either(up, stop):
            return
        try:
            session = await Session.open(record, await port())
        except (ConnectionError, OSError):
            await asyncio.sleep(0.05)  # the server is away: a pace, not a synchronisation
            continue
        try:
            await _take(session, record, stop, rng)
        finally:
            session.close()


async def _take(session: Session, record: GroupHistory, stop: asyncio.Event,
                rng: random.Random) -> None:  # fmt: skip
    batch: list[int] = []
    while not stop.is_set():
        getting = asyncio.ensure_future(session.events.get())
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([getting, stopping], return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if not getting.done():
            getting.cancel()
            return
        got = getting.result()
        if got is None:
            return  # the connection ended
        if rng.random() < CRASH:
            record.crashes += 1
            return  # a crash between receiving and acknowledging
        batch.append(got.id)
        if len(batch) >= rng.randrange(1, 6) or session.events.empty():
            ids, batch = sorted(set(batch)), []
            await session.ack(ids)


async def either(up: asyncio.Event, stop: asyncio.Event) -> bool:
    """Once the server is up (True) or the load stops (False)."""
    waits = [asyncio.ensure_future(up.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
    return not stop.is_set()


class GroupLoad:
    def __init__(self, record: GroupHistory, port: Port, up: asyncio.Event,
                 rng: random.Random) -> None:  # fmt: skip
        self.record, self.port, self.up, self.rng = record, port, up, rng
        self.stop_ = asyncio.Event()
        self.tasks: list[asyncio.Task[None]] = []
        self.made = False

    async def make(self) -> None:
        """The group, from the feed's start: made once, with the first load."""
        if self.made:
            return
        async with await Client.connect("127.0.0.1", await self.port(), timeout=60) as c:
            with contextlib.suppress(InvalidParams):  # made already, by a try cut short
                await c.call("group_create", GROUP, {"from": 0, "ack_wait": ACK_WAIT,
                                                     "max_deliveries": 1000})  # fmt: skip
        self.made = True

    def start(self) -> None:
        self.stop_.clear()
        rngs = [random.Random(self.rng.random()) for _ in range(CONSUMERS)]
        work = [consume(self.record, self.port, self.up, self.stop_, rng) for rng in rngs]
        self.tasks = [asyncio.create_task(each) for each in work]

    async def stop(self) -> None:
        self.stop_.set()
        await asyncio.gather(*self.tasks)
