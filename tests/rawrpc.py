"""A bare MessagePack-RPC peer over a real socket, for sending what no polite client would."""

from __future__ import annotations

import asyncio
from typing import Any

import msgpack


class RawPeer:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)

    @classmethod
    async def open(cls, address: tuple[str, int]) -> RawPeer:
        reader, writer = await asyncio.open_connection(*address)
        return cls(reader, writer)

    def send(self, obj: Any) -> None:
        self.writer.write(msgpack.packb(obj, use_bin_type=True))

    def send_raw(self, data: bytes) -> None:
        self.writer.write(data)

    async def receive(self, timeout: float = 10) -> Any:
        """The next message, or None once the server has closed the connection."""
        while True:
            for obj in self.unpacker:
                return obj
            data = await asyncio.wait_for(self.reader.read(1 << 16), timeout)
            if not data:
                return None
            self.unpacker.feed(data)

    async def call(self, method: Any, *params: Any, msgid: int = 1) -> Any:
        self.send([0, msgid, method, list(params)])
        return await self.receive()

    async def closed(self, timeout: float = 10) -> bool:
        """True when the server closes the connection (EOF or reset) without another reply."""
        try:
            return await self.receive(timeout) is None
        except ConnectionResetError:
            return True

    def close(self) -> None:
        self.writer.close()
