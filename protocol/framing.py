"""Framing: where each MessagePack message in a byte stream ends, and decoding it.

Two passes. The scanner walks the bytes as they come and builds nothing, to find
where each message ends; only whole messages reach the decoder. A decoder fed a
partial message would already hold a list as long as each array header announces:
5 bytes asking for 16,000 elements cost 128 KiB, so a few KiB could pin gigabytes.
A whole message's headers announce only elements that are there, each at least
one byte, so memory follows the bytes received. Sans-I/O, like the rest of
``protocol``: bytes in, objects out.
"""

from __future__ import annotations

import gc
from collections import deque
from typing import Any, Final, NoReturn

import msgpack

from .errors import ErrorCode, RemoteProtocolError, bounded
from .headers import announced
from .outcomes import DECODING, NEED_DATA, UNHASHABLE_KEY, Unreadable, peek_msgid

_HEAD_SIZE: Final = 16  # [0, msgid, ...] fits: 1 + 1 + 9 bytes at most
#: A partial message's headers are read this far into it, where a request's envelope, its
#: method and its params' headers are: one announcing more than the limit could hold is
#: refused then, not once that many bytes have come (or never, from a sender that stops).
_PROBE_BYTES: Final = 1024
_PAUSE_GC_ABOVE: Final = 64 * 1024  # bytes of one message waiting to be decoded


class Framing:
    """The receiving half of a connection; every buffer bounded by ``max_message_size``."""

    def __init__(self, max_message_size: int, decode_slice: int | None = None) -> None:
        self.max_message_size = max_message_size
        self._slice = decode_slice or 2 * max_message_size
        # Each Unpacker holds a 40 KiB parse stack: they are made when bytes come, and let
        # go of by ``rest`` while nothing is pending, so an idle connection costs little.
        self._scanner: msgpack.Unpacker | None = None
        self._unpacker: msgpack.Unpacker | None = None
        self._base = 0  # stream offset where the present Unpackers began
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
        # the partial message whose headers are being read, and where its next one starts
        self._probe_start = -1
        self._probe_at = 0

    def receive_data(self, data: bytes) -> None:
        if data:
            self._input.append(data)
            self.received += len(data)

    def _start(self) -> tuple[msgpack.Unpacker, msgpack.Unpacker]:
        size = self.max_message_size
        self._base = self._scanned  # all before it was whole messages, all decoded
        self._scanner = msgpack.Unpacker(max_buffer_size=2 * size, read_size=min(4096, 2 * size))
        self._unpacker = self._decoder()
        return self._scanner, self._unpacker

    def _decoder(self) -> msgpack.Unpacker:
        size = self.max_message_size
        return msgpack.Unpacker(
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

    def next_object(self) -> Any:
        """The next whole message, decoded; or ``NEED_DATA``, or ``DECODING`` (see
        ``decode_slice``). Raises ``RemoteProtocolError`` for what cannot be framed."""
        ends = self._ends
        if not ends and not self._scan():
            return NEED_DATA
        assert self._unpacker is not None  # _scan made it
        end = ends[0]
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
        except TypeError:  # a map key Python cannot hash: the frame is whole, go on after it
            msgid = peek_msgid(self._head(self.offset))
            ends.popleft()
            self.offset = self._given = end
            self._unpacker = self._decoder()  # the old one's state is undefined now
            return Unreadable(msgid, UNHASHABLE_KEY)
        except Exception as exc:  # what the scanner could not see
            self._malformed(exc, self.offset)
        finally:
            if pause_gc:
                gc.enable()
        ends.popleft()
        self.offset = end
        return obj

    def _scan(self) -> bool:
        """Find where the whole messages in what was received end.

        False when not one whole message is there yet.
        """
        pieces = self._pieces  # drop those wholly before the last message decoded
        while len(pieces) > 1 and pieces[1][0] <= self.offset:
            pieces.popleft()
        scanner = self._scanner
        if scanner is None:
            if not self._input:
                return False
            scanner, _ = self._start()
        limit = self.max_message_size
        found = 0
        while True:
            if self._base + scanner.tell() == self._scanned:
                # all fed is scanned (input mostly ends where a message does): feed more,
                # rather than learn it from OutOfData, an exception per chunk received
                if found or not self._feed():
                    break
                continue
            try:
                scanner.skip()
            except msgpack.OutOfData:
                # all fed past the last message's end belongs to the one arriving: the
                # scanner waits for a whole string before it moves past it
                if self._scanned - self._found > limit:
                    self._too_large(self._found)
                self._probe()
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

    def _probe(self) -> None:
        """Refuse now a partial message whose headers already prove it cannot fit: an array
        or map announcing more elements than the limit has bytes (each takes one at least),
        or a string, bin or ext longer than the limit. Each header is read once, however
        the message is cut, and only in its first ``_PROBE_BYTES``: a large honest message,
        arriving in pieces, costs this no more than a small one."""
        start = self._found
        if self._probe_start != start:
            self._probe_start, self._probe_at = start, start
        stop = min(self._scanned, start + _PROBE_BYTES)
        if self._probe_at >= stop:
            return
        read, too_many = announced(self._bytes(self._probe_at, stop), self.max_message_size)
        if too_many is not None:
            self._too_large(start, too_many)
        self._probe_at += read

    def _bytes(self, begin: int, end: int) -> bytes:
        """The scanned bytes from stream offset ``begin`` to ``end``."""
        out = []
        for start, piece in self._pieces:
            stop = start + len(piece)
            if stop <= begin:
                continue
            if start >= end:
                break
            out.append(bytes(piece[max(begin - start, 0) : end - start]))
        return b"".join(out)

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

    def _too_large(self, start: int, why: str = "") -> NoReturn:
        raise RemoteProtocolError(
            f"message too large{why}: the limit is {self.max_message_size} bytes",
            ErrorCode.TOO_LARGE,
            peek_msgid(self._head(start)),
        )

    def _malformed(self, exc: Exception, start: int) -> NoReturn:
        raise RemoteProtocolError(
            f"malformed MessagePack: {bounded(repr(exc))}",
            ErrorCode.PARSE_ERROR,
            peek_msgid(self._head(start)),
        )

    def clear(self) -> None:
        """Drop what is buffered: the stream broke, and nothing more is read from it."""
        self._input.clear()
        self._pieces.clear()
