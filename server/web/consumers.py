"""A group's consumers over HTTP: a stream (``GET /v1/groups/NAME/events``) is one
consumer, and its acks and nacks come on other requests, often other connections. The
stream's first event names it (``consumer``); an ack that gives that id is applied as if
the stream had sent it, and answered where it was asked."""

from __future__ import annotations

import secrets
from typing import Any, Protocol

from tidal.server.core.replies import Listener, Replier


class Stream(Replier, Protocol):
    consumer: str | None
    group: str | None


class Consumers:
    def __init__(self) -> None:
        self._streams: dict[str, Stream] = {}

    def add(self, stream: Stream) -> str:
        consumer = secrets.token_urlsafe(12)
        self._streams[consumer] = stream
        return consumer

    def find(self, group: str, consumer: str) -> Stream | None:
        stream = self._streams.get(consumer)
        return stream if stream is not None and stream.group == group else None

    def forget(self, stream: Stream) -> None:
        if stream.consumer is not None:
            self._streams.pop(stream.consumer, None)


class OnBehalf:
    """A ``Replier`` that is a consumer's stream to the groups (its ``listener`` says which
    consumer it is) and the asking connection to everything else: the answer goes there."""

    __slots__ = ("_asker", "_stream")

    def __init__(self, stream: Stream, asker: Replier) -> None:
        self._stream = stream
        self._asker = asker

    @property
    def listener(self) -> Listener | None:
        return self._stream.listener

    @listener.setter
    def listener(self, value: Listener | None) -> None:
        self._stream.listener = value

    def reply(self, msgid: int | None, result: Any) -> None:
        self._asker.reply(msgid, result)

    def reply_error(self, msgid: int | None, code: int, message: str) -> None:
        self._asker.reply_error(msgid, code, message)

    def reading(self, bytes_: int) -> None:
        self._asker.reading(bytes_)

    def hold(self, on: bool) -> None:
        self._asker.hold(on)

    def flush(self) -> None:
        self._asker.flush()

    def push(self, data: bytes) -> None:
        self._stream.push(data)

    def unsent(self) -> int:
        return self._stream.unsent()

    def blocked(self) -> bool:
        return self._stream.blocked()

    def end(self, data: bytes) -> None:
        self._stream.end(data)
