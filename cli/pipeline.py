"""One connection of ``tidal bench``: ``pipeline`` slots, each keeping one request in
flight. A reply frees its slot, and the slot's next request goes out in the same write
as the others freed by that chunk of input; replies are only counted and timed."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, Protocol, cast

import msgpack


class Delimiter(Protocol):
    """Replies of a wire other than MessagePack (``resp``, ``httpwire``), delimited in the
    order their requests went, each as (slot, error or None)."""

    def sent(self, slot: int, replies: int) -> None: ...

    def feed(self, data: bytes) -> list[tuple[int, Any]]: ...


class Load(asyncio.Protocol):
    """One connection: ``pipeline`` slots, each with its own queue of encoded requests.
    ``resp``: the server is Redis, each request ``replies`` commands long, or tidal's HTTP
    edge: the replies are delimited by it."""

    def __init__(
        self,
        queues: list[list[bytes]],
        latencies: list[float],
        done: Callable[[], None],
        auth: bytes = b"",
        resp: Delimiter | None = None,
        replies: int = 1,
    ):
        self.auth = auth  # an encoded auth request (msgid -1) to send first, if any
        self.resp = resp
        self.replies = replies
        self.queues = [list(reversed(q)) for q in queues]  # pop() from the end is O(1)
        self.sent_at = [0.0] * len(queues)
        self.latencies = latencies
        self.errors = 0
        self.answered = 0
        self.unpacker = msgpack.Unpacker(raw=False, use_list=False)
        self._done = done
        self.outstanding = 0
        self.lost: Exception | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def start(self) -> None:
        now = time.perf_counter()
        out = []
        for slot, queue in enumerate(self.queues):
            if queue:
                out.append(queue.pop())
                self.sent_at[slot] = now
                self.outstanding += 1
                if self.resp is not None:
                    self.resp.sent(slot, self.replies)
        if out:
            self.transport.write(self.auth + b"".join(out))
        else:
            self._done()

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        out: list[bytes] = []
        queues, sent_at, latencies, resp = self.queues, self.sent_at, self.latencies, self.resp
        answered: Iterator[tuple[int, Any]]
        if resp is None:
            self.unpacker.feed(data)
            answered = ((message[1], message[2]) for message in self.unpacker)
        else:
            answered = iter(resp.feed(data))
        for slot, error in answered:
            if slot == -1:  # the auth reply
                if error is not None:
                    self.lost = ConnectionError(f"auth refused: {error!r}")
                continue
            latencies.append(now - sent_at[slot])
            self.answered += 1
            if error is not None:
                self.errors += 1
                if self.errors == 1:
                    print(f"tidal bench: error reply: {error!r}", file=sys.stderr)
            queue = queues[slot]
            if queue:
                out.append(queue.pop())
                sent_at[slot] = now
                if resp is not None:
                    resp.sent(slot, self.replies)
            else:
                self.outstanding -= 1
        if out:
            self.transport.write(b"".join(out))
        if self.outstanding == 0:
            self._done()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.outstanding:
            self.lost = exc or ConnectionError("connection closed by the server")
            self.outstanding = 0
            self._done()
