"""A sans-I/O MessagePack-RPC endpoint: bytes in, events out; messages in, bytes out.

It never touches a socket or an event loop, so the same object serves the
asyncio server, the client and tests that feed it bytes by hand. Every buffer
is bounded by ``max_message_size``.
"""

from __future__ import annotations

import gc
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
_HEAD_SIZE: Final = 16
_PAUSE_GC_ABOVE: Final = (
    64 * 1024
)  # bytes waiting to be decoded  # [0, msgid, ...] fits: 1 + 1 + 9 bytes at most


class _NeedData:
    """Sentinel type: the buffer holds no complete message yet."""

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = _NeedData()


class _Decoding:
    """Sentinel type: part of a large message was decoded; call ``next_event`` again."""

    def __repr__(self) -> str:
        return "DECODING"


DECODING: Final = _Decoding()


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
        # Two passes. The scanner walks the bytes as they come and builds nothing, to
        # find where each message ends; only whole messages reach the decoder. A decoder
        # fed a partial message would already hold a list as long as each array header
        # announces: 5 bytes asking for 16,000 elements cost 128 KiB, so a few KiB could
        # pin gigabytes. A whole message's headers announce only elements that are there,
        # each at least one byte, so memory follows the bytes received.
        # Each Unpacker holds a 40 KiB parse stack: they are made when bytes come, and let
        # go of by ``rest`` while nothing is pending, so an idle connection costs little.
        self._scanner: msgpack.Unpacker | None = None
        self._unpacker: msgpack.Unpacker | None = None
        self._base = 0  # stream offset where the present Unpackers began
        self._packer = msgpack.Packer(use_bin_type=True, autoreset=True)
        # Why the stream broke, kept as data: a stored exception would hold, by its
        # traceback, the frames that hold this object, and keep its buffers alive
        # until a full garbage collection.
        self._broken: tuple[str, ErrorCode, int | None] | None = None
        self._input: deque[bytes | memoryview] = deque()  # received, not yet scanned
        self.received = 0  # bytes received since the stream began
        self._scanned = 0  # stream offset up to which the scanner has been fed
        self._found = 0  # stream offset where the last message the scanner found ends
        self._given = 0  # stream offset up to which the decoder has been fed
        self._ends: deque[int] = deque()  # stream offsets where whole messages found end
        self.offset = 0  # stream offset where the last message decoded ends
        # pieces scanned, with their stream offsets, from the one holding ``offset``:
        # what the decoder is given, and where a refused message's msgid is read
        self._pieces: deque[tuple[int, bytes | memoryview]] = deque()

    # -- receiving -------------------------------------------------------

    def receive_data(self, data: bytes) -> None:
        if self._broken is not None:
            raise RemoteProtocolError(*self._broken)
        if data:
            self._input.append(data)
            self.received += len(data)

    def _start(self) -> tuple[msgpack.Unpacker, msgpack.Unpacker]:
        size = self.max_message_size
        self._base = self._scanned  # all before it was whole messages, all decoded
        self._scanner = msgpack.Unpacker(max_buffer_size=2 * size, read_size=min(4096, 2 * size))
        self._unpacker = msgpack.Unpacker(
            read_size=min(4096, 2 * size),
            raw=False,
            use_list=True,
            strict_map_key=False,
            unicode_errors="surrogateescape",
            max_buffer_size=2 * size,
            # every element takes at least one byte, so these only refuse early
            # what the size limit would refuse later
            max_str_len=size,
            max_bin_len=size,
            max_array_len=size,
            max_map_len=size,
            max_ext_len=size,
        )
        return self._scanner, self._unpacker

    def rest(self) -> None:
        """Let go of the decoder while no message is pending: ~88 KiB per idle connection."""
        if self.received == self.offset and not self._ends and self._scanner is not None:
            self._scanner = self._unpacker = None
            self._pieces.clear()

    @property
    def pending(self) -> int:
        """Bytes received that are not yet part of a message returned: a partial message's
        share of them is what a slow or stalled sender makes us hold."""
        return self.received - self.offset

    def next_event(self) -> Event | _NeedData | _Decoding:
        """The next complete event, ``NEED_DATA``, or ``DECODING`` (see ``decode_slice``);
        raises ``RemoteProtocolError``."""
        if self._broken is not None:
            raise RemoteProtocolError(*self._broken)
        if not self._ends and not self._scan():
            return NEED_DATA
        assert self._unpacker is not None  # _scan made it
        end = self._ends[0]
        if self._given < end:
            # whole messages only, so each header's elements are there; a large one a
            # slice at a time
            large = end - self._given > self._slice
            self._give(self._given + self._slice if large else self._found)
        # A large message may hold millions of containers; the cyclic GC, run again and
        # again while they are built, made 8 MiB of empty arrays take 4.2 s, not 0.5 s.
        pause_gc = end - self.offset > _PAUSE_GC_ABOVE and gc.isenabled()
        if pause_gc:
            gc.disable()
        try:
            obj = self._unpacker.unpack()
        except msgpack.OutOfData:
            return DECODING  # the rest of this message is given next time
        except ValueError as exc:
            if "exceeds max_" in str(exc):
                self._too_large(self.offset)
            self._malformed(exc, self.offset)
        except Exception as exc:  # unhashable map keys, and what the scanner could not see
            self._malformed(exc, self.offset)
        finally:
            if pause_gc:
                gc.enable()
        self._ends.popleft()
        self.offset = end
        pieces = self._pieces
        while len(pieces) > 1 and pieces[1][0] <= self.offset:
            pieces.popleft()
        return self._classify(obj)

    def _scan(self) -> bool:
        """Find where the whole messages in what was received end.

        False when not one whole message is there yet.
        """
        scanner = self._scanner
        if scanner is None:
            if not self._input:
                return False
            scanner, _ = self._start()
        limit = self.max_message_size
        found = 0
        while True:
            try:
                scanner.skip()
            except msgpack.OutOfData:
                # all fed past the last message's end belongs to the one arriving: the
                # scanner waits for a whole string before it moves past it
                if self._scanned - self._found > limit:
                    self._too_large(self._found)
                if found or not self._feed():
                    break
                continue
            except Exception as exc:  # FormatError, StackError
                self._malformed(exc, self._found)
            end = self._base + scanner.tell()
            if end - self._found > limit:
                self._too_large(self._found)
            self._found = end
            self._ends.append(end)
            found += 1
        return found > 0

    def _feed(self) -> bool:
        """Hand the scanner the next piece of input, never more than one message's worth at
        once, so that its buffer stays bounded however large the chunks we are given."""
        if not self._input:
            return False
        piece = self._input.popleft()
        if len(piece) > self.max_message_size:
            view = memoryview(piece)
            piece, rest = view[: self.max_message_size], view[self.max_message_size :]
            self._input.appendleft(rest)
        self._pieces.append((self._scanned, piece))
        self._scanned += len(piece)
        assert self._scanner is not None
        try:
            self._scanner.feed(piece)
        except msgpack.BufferFull:
            self._too_large(self._found)
        return True

    def _give(self, upto: int) -> None:
        """Feed the decoder the scanned bytes up to stream offset ``upto`` (a message's end)."""
        for start, piece in self._pieces:
            end = start + len(piece)
            if end <= self._given:
                continue
            if start >= upto:
                break
            part = piece[max(self._given - start, 0) : upto - start]
            assert self._unpacker is not None
            self._unpacker.feed(part)
            self._given = start + (upto - start if upto < end else len(piece))

    def _head(self, offset: int) -> bytes:
        """The first bytes (up to 16) of the message starting at stream offset ``offset``."""
        head = b""
        for start, piece in self._pieces:
            end = start + len(piece)
            if end <= offset:
                continue
            head += bytes(piece[max(offset - start, 0) : max(offset - start, 0) + _HEAD_SIZE])
            if len(head) >= _HEAD_SIZE:
                break
        return head[:_HEAD_SIZE]

    def _too_large(self, start: int) -> NoReturn:
        raise self._break(
            RemoteProtocolError(
                f"message too large: the limit is {self.max_message_size} bytes",
                ErrorCode.TOO_LARGE,
                _peek_msgid(self._head(start)),
            )
        )

    def _malformed(self, exc: Exception, start: int) -> NoReturn:
        raise self._break(
            RemoteProtocolError(
                f"malformed MessagePack: {exc!r}",
                ErrorCode.PARSE_ERROR,
                _peek_msgid(self._head(start)),
            )
        )

    def _break(self, error: RemoteProtocolError) -> RemoteProtocolError:
        """Remember the error: every later call raises it again."""
        self._broken = (str(error), error.code, error.msgid)
        self._input.clear()
        self._pieces.clear()
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
