"""Redis's wire protocol (RESP), as much as ``tidal bench`` needs to drive Redis.

``make bench`` races tidal against Redis; a fair race has both face the same client.
So the load generator that drives tidal also drives Redis: each tidal request has
its Redis equivalent (a signal is one call of ``bench/signal.lua``, a batch of N is N
calls written at once), drawn from the same random stream, and replies are counted
and timed by the same loop. Replies are only delimited, never turned into objects.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any, Final

_CRLF: Final = b"\r\n"


def command(*args: str | bytes) -> bytes:
    """One command as a RESP array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode() if isinstance(arg, str) else arg
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def equivalent(sha: str, method: str, params: list[Any]) -> tuple[bytes, int]:
    """The Redis commands that do what a tidal request does, and how many replies they get.

    A signal runs ``signal.lua`` (ARGV: user, entity, community, country)."""

    def signal(p: list[Any]) -> bytes:
        user, entity, _kind, _weight, context = p
        country = context["attrs"]["country"]
        return command("EVALSHA", sha, "0", str(user), entity, context["communities"][0], country)

    if method == "signal":
        return signal(params), 1
    if method == "signal_batch":
        return b"".join(signal(p) for p in params[0]), len(params[0])
    if method == "status":
        return command("SISMEMBER", "left", str(params[0])), 1
    if method == "leave":
        return command("SADD", "left", str(params[0])), 1
    if method == "rejoin":
        return command("SREM", "left", str(params[0])), 1
    raise ValueError(f"workload: {method} has no Redis equivalent here")


def _reply_end(buf: bytes, pos: int) -> tuple[int, bool] | None:
    """Where the reply starting at ``pos`` ends, and whether it is an error; None if the
    buffer does not hold all of it yet."""
    eol = buf.find(_CRLF, pos)
    if eol < 0:
        return None
    kind = buf[pos]
    if kind in b"+:":
        return eol + 2, False
    if kind == ord("-"):
        return eol + 2, True
    size = int(buf[pos + 1 : eol])
    if kind == ord("$"):
        end = eol + 2 + (size + 2 if size >= 0 else 0)
        return (end, False) if end <= len(buf) else None
    if kind == ord("*"):
        pos = eol + 2
        for _ in range(max(size, 0)):
            inner = _reply_end(buf, pos)
            if inner is None:
                return None
            pos = inner[0]
        return pos, False
    raise ValueError(f"not a RESP reply: {buf[pos : pos + 16]!r}")


class Replies:
    """Replies in the order requests were sent: a request of N commands is answered when
    its N replies have come. Yields (slot, error or None) per answered request."""

    def __init__(self) -> None:
        self._buf = b""
        self._waiting: deque[list[int]] = deque()  # [slot, replies still due, errors]

    def sent(self, slot: int, replies: int) -> None:
        self._waiting.append([slot, replies, 0])

    def feed(self, data: bytes) -> list[tuple[int, Any]]:
        buf = self._buf + data if self._buf else data
        pos, done = 0, []
        while pos < len(buf):
            end = _reply_end(buf, pos)
            if end is None:
                break
            pos = end[0]
            head = self._waiting[0]
            head[1] -= 1
            head[2] += end[1]
            if not head[1]:
                self._waiting.popleft()
                done.append((head[0], "redis error" if head[2] else None))
        self._buf = buf[pos:]
        return done


async def add_to_set(host: str, port: int, key: str, members: range) -> None:
    """SADD ``members`` to ``key``, in chunks: the leavers, before the clock starts."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for start in range(members.start, members.stop, 10_000):
            chunk = range(start, min(members.stop, start + 10_000))
            writer.write(command("SADD", key, *(str(u) for u in chunk)))
            line = await reader.readline()
            if not line.startswith(b":"):
                raise ConnectionError(f"redis refused SADD: {line!r}")
    finally:
        writer.close()
