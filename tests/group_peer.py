"""A consumer group's consumer on a bare socket, for the tests of groups: it takes what it
is sent, and acknowledges only when a test says so, or never (a consumer that crashes
between receiving and acknowledging)."""

from __future__ import annotations

from typing import Any

from .rawrpc import RawPeer


class GroupPeer:
    def __init__(self, raw: RawPeer) -> None:
        self.raw = raw
        self.msgid = 0
        #: (event, deliveries) in the order they came
        self.got: list[tuple[dict[str, Any], int]] = []
        self.ended: Any = None  # the error notification the server closed it with

    @classmethod
    async def join(cls, address: tuple[str, int], group: str) -> GroupPeer:
        peer = cls(await RawPeer.open(address))
        error, reply = await peer.call("subscribe", {"group": group})
        assert error is None, error
        assert reply["group"] == group, reply
        return peer

    def _take(self, message: Any) -> None:
        if message[0] == 2 and message[1] == "event":
            assert len(message[2]) == 2, f"a group's event carries its delivery: {message}"
            self.got.append((message[2][0], message[2][1]["deliveries"]))
        elif message[0] == 2 and message[1] == "error":
            self.ended = message[2]

    async def call(self, method: str, *params: Any) -> tuple[Any, Any]:
        """(error, result), the events that came meanwhile kept."""
        self.msgid += 1
        self.raw.send([0, self.msgid, method, list(params)])
        while True:
            message = await self.raw.receive()
            assert message is not None, f"the server closed the consumer during {method}"
            if message[0] == 1 and message[1] == self.msgid:
                return message[2], message[3]
            self._take(message)

    async def until(self, count: int, timeout: float = 10) -> list[tuple[dict[str, Any], int]]:
        """Once ``count`` events have come in all."""
        while len(self.got) < count:
            message = await self.raw.receive(timeout)
            assert message is not None, f"closed after {len(self.got)} of {count}: {self.ended}"
            self._take(message)
        return self.got

    async def closed(self) -> bool:
        """The server closed it; what came first is kept."""
        while True:
            try:
                message = await self.raw.receive()
            except ConnectionResetError:
                return True
            if message is None:
                return True
            self._take(message)

    def ids(self) -> list[int]:
        return [event["id"] for event, _ in self.got]

    def close(self) -> None:
        self.raw.close()
