"""A sans-I/O MessagePack-RPC endpoint: bytes in, events out; messages in, bytes out.

It never touches a socket or an event loop, so the same object serves the
asyncio server, the client and tests that feed it bytes by hand. Where messages
end and how they are decoded is ``framing``; here they become events, and
messages become bytes. Every buffer is bounded by ``max_message_size``.
"""

from __future__ import annotations

from typing import Any, TypeGuard

import msgpack

from .errors import ErrorCode, LocalProtocolError, RemoteProtocolError
from .framing import Framing
from .limits import DEFAULT_MAX_MESSAGE_SIZE as DEFAULT_MAX_MESSAGE_SIZE
from .messages import (
    MSGID_MAX,
    MSGID_MIN,
    NOTIFICATION,
    REQUEST,
    RESPONSE,
    BadRequest,
    Event,
    Message,
    Notification,
    Request,
    Response,
    new_tuple,
)
from .outcomes import DECODING, NEED_DATA, Unreadable, _Decoding, _NeedData


def _is_int(value: object) -> TypeGuard[int]:
    # bool is an int subclass in Python, but never a valid msgid or type tag.
    return type(value) is int


def _method_name(value: object) -> str | None:
    """Method names may arrive as str or bin; anything else, or bad UTF-8, is no name."""
    if type(value) is bytes:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return None
    if type(value) is str:
        try:
            value.encode("utf-8")  # surrogate-escaped bytes were not UTF-8
        except UnicodeEncodeError:
            return None
        return value
    return None


class Connection:
    """One side of a MessagePack-RPC stream.

    After a ``RemoteProtocolError`` the object refuses further input, because
    msgpack's ``Unpacker`` state is undefined after a decode error.
    """

    def __init__(
        self,
        *,
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        decode_slice: int | None = None,
    ) -> None:
        """``decode_slice``: decode a larger message this many bytes at a time, returning
        ``DECODING`` between slices, so that a caller can do other work in between."""
        if max_message_size < 64:
            raise ValueError("max_message_size must be at least 64 bytes")
        self.max_message_size = max_message_size
        self._slice = decode_slice or 2 * max_message_size
        self._framing = Framing(max_message_size, decode_slice)
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        # Why the stream broke, kept as data: a stored exception would hold, by its
        # traceback, the frames that hold this object, and keep its buffers alive
        # until a full garbage collection.
        self._broken: tuple[str, ErrorCode, int | None] | None = None

    # -- receiving -------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        if self._broken is not None:
            raise RemoteProtocolError(*self._broken)
        self._framing.receive_data(data)

    def rest(self) -> None:
        self._framing.rest()

    @property
    def received(self) -> int:
        """Bytes received since the stream began."""
        return self._framing.received

    @property
    def offset(self) -> int:
        """Stream offset where the last message decoded ends."""
        return self._framing.offset

    @property
    def pending(self) -> int:
        """Bytes received that are not yet part of a message returned."""
        return self._framing.pending

    def next_event(self) -> Event | _NeedData | _Decoding:
        """The next complete event, ``NEED_DATA``, or ``DECODING`` (see ``decode_slice``);
        raises ``RemoteProtocolError``."""
        if self._broken is not None:
            raise RemoteProtocolError(*self._broken)
        while True:
            try:
                obj = self._framing.next_object()
            except RemoteProtocolError as exc:
                raise self._break(exc) from None
            if obj is NEED_DATA or obj is DECODING:
                return obj
            if type(obj) is not Unreadable:
                return self._classify(obj)
            if obj.msgid is not None:  # else a notification, or no request: nobody to tell
                return BadRequest(obj.msgid, ErrorCode.INVALID_REQUEST, obj.message)

    def _break(self, error: RemoteProtocolError) -> RemoteProtocolError:
        """Remember the error: every later call raises it again."""
        self._broken = (str(error), error.code, error.msgid)
        self._framing.clear()
        return error

    def _classify(self, obj: object) -> Event:
        if type(obj) is not list or not obj or not _is_int(obj[0]):
            raise self._break(
                RemoteProtocolError("a message must be an array starting with its type")
            )
        kind = obj[0]
        if kind == REQUEST:
            msgid = obj[1] if len(obj) > 1 else None
            if not _is_int(msgid):
                raise self._break(RemoteProtocolError("a request's msgid must be an integer"))
            if len(obj) != 4:
                return BadRequest(
                    msgid,
                    ErrorCode.INVALID_REQUEST,
                    f"a request is [0, msgid, method, params]; got {len(obj)} elements",
                )
            method = _method_name(obj[2])
            if method is None:
                return BadRequest(
                    msgid, ErrorCode.INVALID_REQUEST, "method: must be a UTF-8 str or bin"
                )
            params = obj[3]
            if type(params) is not list:
                return BadRequest(msgid, ErrorCode.INVALID_REQUEST, "params: must be an array")
            return new_tuple(Request, (msgid, method, params))
        if kind == NOTIFICATION:
            method = _method_name(obj[1]) if len(obj) == 3 else None
            if method is None or type(obj[2]) is not list:
                raise self._break(RemoteProtocolError("a notification is [2, method, params]"))
            return Notification(method, obj[2])
        if kind == RESPONSE:
            if len(obj) != 4 or not _is_int(obj[1]):
                raise self._break(RemoteProtocolError("a response is [1, msgid, error, result]"))
            return Response(obj[1], obj[2], obj[3])
        raise self._break(RemoteProtocolError(f"unknown message type {kind}"))

    # -- sending ---------------------------------------------------------

    def send(self, message: Message) -> bytes:
        """Encode one message; raises ``LocalProtocolError`` for what cannot go on the wire."""
        if type(message) is Response:
            _check_msgid(_first(message))
            obj: list[Any] = [RESPONSE, message.msgid, message.error, message.result]
        elif type(message) is Request:
            _check_msgid(_first(message))
            obj = [REQUEST, message.msgid, message.method, message.params]
        elif type(message) is Notification:
            obj = [NOTIFICATION, message.method, message.params]
        else:
            raise LocalProtocolError(f"cannot send {type(message).__name__}")
        try:
            data: bytes = self._packer.pack(obj)
        except (TypeError, ValueError, OverflowError) as exc:
            self._packer.reset()
            raise LocalProtocolError(f"cannot encode message: {exc}") from exc
        if len(data) > self.max_message_size:
            raise LocalProtocolError(
                f"message of {len(data)} bytes exceeds the limit of {self.max_message_size}",
                ErrorCode.TOO_LARGE,
            )
        return data

    def send_responses(self, responses: list[list[Any]]) -> bytes:
        """Many ``[1, msgid, error, result]`` in one call: the hot path of a server.

        MessagePack writes an array as a header followed by its elements packed
        back to back, so packing the list and cutting off the header leaves
        exactly the stream of responses, encoded by one call into C.
        """
        try:
            data: bytes = self._packer.pack(responses)
        except (TypeError, ValueError, OverflowError) as exc:
            self._packer.reset()
            raise LocalProtocolError(f"cannot encode response: {exc}") from exc
        count = len(responses)
        return data[1 if count < 16 else 3 if count < 65536 else 5 :]


def notification_head(method: str) -> bytes:
    """The bytes of ``[2, method, [`` before a single argument packed on its own: an event
    encoded once is pushed to every subscriber, and replayed from disk, behind this."""
    head: bytes = msgpack.packb(method, use_bin_type=True)
    return b"\x93\x02" + head + b"\x91"


def _first(message: tuple[Any, ...]) -> object:
    """A message's msgid as the caller gave it: read as its declared ``int``, compiled code
    would take True for 1 or refuse a str with TypeError, not ``LocalProtocolError``."""
    return message[0]


def _check_msgid(msgid: object) -> None:
    if not _is_int(msgid) or not MSGID_MIN <= msgid <= MSGID_MAX:
        raise LocalProtocolError(f"msgid must be an integer in {MSGID_MIN}..{MSGID_MAX}")
