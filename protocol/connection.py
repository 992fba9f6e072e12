"""A sans-I/O MessagePack-RPC endpoint: bytes in, events out; messages in, bytes out.

It never touches a socket or an event loop, so the same object serves the
asyncio server, the client and tests that feed it bytes by hand. Every buffer
is bounded by ``max_message_size``.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Final, NoReturn, TypeGuard

import msgpack

from .errors import ErrorCode, LocalProtocolError, RemoteProtocolError
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

DEFAULT_MAX_MESSAGE_SIZE: Final = 8 * 1024 * 1024
_HEAD_SIZE: Final = 16  # [0, msgid, ...] fits: 1 + 1 + 9 bytes at most


class _NeedData:
    """Sentinel type: the buffer holds no complete message yet."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


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

    def __init__(self, *, max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE) -> None:
        if max_message_size < 64:
            raise ValueError("max_message_size must be at least 64 bytes")
        self.max_message_size = max_message_size
        # msgpack parses partial messages as bytes arrive and drops them from
        # its buffer, so max_buffer_size alone does not bound one message: we
        # count the bytes since the last message boundary ourselves, and keep
        # the buffer limit as a second fence one chunk above ours.
        self._unpacker = msgpack.Unpacker(
            raw=False,
            use_list=True,
            strict_map_key=False,
            unicode_errors="surrogateescape",
            max_buffer_size=2 * max_message_size,
            # every element takes at least one byte, so these only refuse early
            # what the size limit would refuse later
            max_str_len=max_message_size,
            max_bin_len=max_message_size,
            max_array_len=max_message_size,
            max_map_len=max_message_size,
            max_ext_len=max_message_size,
        )
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        # Why the stream broke, kept as data: a stored exception would hold, by its
        # traceback, the frames that hold this object, and keep its buffers alive
        # until a full garbage collection.
        self._broken: tuple[str, ErrorCode, int | None] | None = None
        self._input: deque[bytes | memoryview] = deque()  # received, not yet given to msgpack
        self._fed = 0  # bytes given to msgpack since the stream began
        self._boundary = 0  # stream offset where the pending message starts
        # To name a refused message by its msgid we need its first bytes; they are
        # found when needed in the last piece fed, or carried over from before it.
        self._last_piece: bytes | memoryview = b""
        self._piece_start = 0  # stream offset of the last piece
        self._carried_head = b""

    # -- receiving -------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        if self._broken is not None:
            raise RemoteProtocolError(*self._broken)
        if data:
            self._input.append(data)

    def next_event(self) -> Event | _NeedData:
        """The next complete event, or ``NEED_DATA``; raises ``RemoteProtocolError``."""
        if self._broken is not None:
            raise RemoteProtocolError(*self._broken)
        while True:
            try:
                obj = self._unpacker.unpack()
            except msgpack.OutOfData:
                if self._fed - self._boundary > self.max_message_size:
                    self._too_large()
                if not self._feed():
                    return NEED_DATA
                continue
            except ValueError as exc:
                if "exceeds max_" in str(exc):
                    self._too_large()
                self._malformed(exc)
            except Exception as exc:  # FormatError, StackError, unhashable map keys
                self._malformed(exc)
            break
        end = self._unpacker.tell()
        if end - self._boundary > self.max_message_size:
            self._too_large()
        self._boundary = end
        return self._classify(obj)

    def _feed(self) -> bool:
        """Hand msgpack the next piece of input, never more than one message's worth at once,
        so its buffer stays bounded however large the chunks we are given."""
        if not self._input:
            return False
        piece = self._input.popleft()
        if len(piece) > self.max_message_size:
            view = memoryview(piece)
            piece, rest = view[: self.max_message_size], view[self.max_message_size :]
            self._input.appendleft(rest)
        # Complete messages were all consumed before we got here, so the pending
        # message's start is final: keep what the outgoing piece holds of it.
        self._carried_head = self._pending_head()
        self._piece_start = self._fed
        self._fed += len(piece)
        self._last_piece = piece
        try:
            self._unpacker.feed(piece)
        except msgpack.BufferFull:
            self._too_large()
        return True

    def _pending_head(self) -> bytes:
        """The first bytes of the pending message, as many as we still have (up to 16)."""
        if self._boundary >= self._piece_start:
            offset = self._boundary - self._piece_start
            return bytes(self._last_piece[offset : offset + _HEAD_SIZE])
        return (self._carried_head + bytes(self._last_piece[:_HEAD_SIZE]))[:_HEAD_SIZE]

    def _too_large(self) -> NoReturn:
        raise self._break(
            RemoteProtocolError(
                f"message too large: the limit is {self.max_message_size} bytes",
                ErrorCode.TOO_LARGE,
                _peek_msgid(self._pending_head()),
            )
        )

    def _malformed(self, exc: Exception) -> NoReturn:
        raise self._break(
            RemoteProtocolError(
                f"malformed MessagePack: {exc!r}",
                ErrorCode.PARSE_ERROR,
                _peek_msgid(self._pending_head()),
            )
        )

    def _break(self, error: RemoteProtocolError) -> RemoteProtocolError:
        """Remember the error: every later call raises it again."""
        self._broken = (str(error), error.code, error.msgid)
        self._input.clear()
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
            _check_msgid(message.msgid)
            obj: list[Any] = [RESPONSE, message.msgid, message.error, message.result]
        elif type(message) is Request:
            _check_msgid(message.msgid)
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


def _check_msgid(msgid: object) -> None:
    if not _is_int(msgid) or not MSGID_MIN <= msgid <= MSGID_MAX:
        raise LocalProtocolError(f"msgid must be an integer in {MSGID_MIN}..{MSGID_MAX}")


def _peek_msgid(head: bytes) -> int | None:
    """The msgid of a request from the first bytes of its encoding, if they hold it.

    Used when a message is too large to buffer: its header is all we have, and
    it is enough to tell the sender which request was refused.
    """
    unpacker = msgpack.Unpacker(raw=False, max_buffer_size=len(head) or 1)
    unpacker.feed(head)
    try:
        if unpacker.read_array_header() != 4 or unpacker.unpack() != REQUEST:
            return None
        msgid = unpacker.unpack()
    except Exception:
        return None
    return msgid if _is_int(msgid) else None
