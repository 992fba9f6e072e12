"""A connection of the history's load over the HTTP edge (``--http``): the same calls as a
MessagePack client makes, as ``POST /v1/METHOD`` on one keep-alive connection, pipelined
by the tasks that share it, answered in order. What it hands back is what the MessagePack
client would have: each answer mapped from JSON by the method's result schema, each error
as the same exception. So the checker judges HTTP's promises (an answer means committed,
the gate at once, idempotency) as it judges MessagePack's."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import deque
from typing import Any

from tidal.client import CallTimeout, ConnectionLost
from tidal.protocol.jsonmap import inward
from tidal.protocol.methods import BY_NAME
from tidal.protocol.refusals import from_wire

#: each method's answer, from JSON back to what MessagePack carries
_RESULTS = {m.name: inward(m.result) for m in BY_NAME.values()}


class HttpCaller:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, timeout: float
    ) -> None:
        self._reader, self._writer, self._timeout = reader, writer, timeout
        self._pending: deque[tuple[str, asyncio.Future[Any]]] = deque()
        self._closed = False
        self._reading = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, port: int, timeout: float) -> HttpCaller:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", port), timeout
            )
        except TimeoutError:
            raise CallTimeout("connect timed out") from None
        return cls(reader, writer, timeout)

    @property
    def is_connected(self) -> bool:
        return not self._closed

    async def call(self, method: str, *params: Any) -> Any:
        if self._closed:
            raise ConnectionLost("the HTTP connection is closed")
        body = json.dumps(list(params)).encode()
        self._writer.write(
            b"POST /v1/%s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (method.encode(), len(body), body)
        )
        answered: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending.append((method, answered))
        try:
            return await asyncio.wait_for(asyncio.shield(answered), self._timeout)
        except TimeoutError:
            raise CallTimeout(f"{method}: no answer in {self._timeout} s") from None

    async def _read(self) -> None:
        why: BaseException = ConnectionLost("the server closed the HTTP connection")
        try:
            while True:
                head = await self._reader.readuntil(b"\r\n\r\n")
                status = int(head[9:12])
                length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                body = json.loads(await self._reader.readexactly(length))
                method, answered = self._pending.popleft()
                if answered.done():
                    continue  # its caller timed out
                if status == 200:
                    convert = _RESULTS[method]
                    result = body["result"]
                    answered.set_result(result if convert is None else convert(result))
                else:
                    error = body["error"]
                    answered.set_exception(
                        from_wire([error["code"], error["message"], error.get("data", {})])
                    )
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
            why = ConnectionLost(f"the HTTP connection dropped: {exc!r}")
        finally:
            self._closed = True
            while self._pending:
                _, answered = self._pending.popleft()
                if not answered.done():
                    answered.set_exception(why)
                    answered.exception()  # retrieved: a timed-out caller never will

    async def close(self) -> None:
        self._closed = True
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reading
