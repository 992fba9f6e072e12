"""HTTP/1.1 and JSON, as much as ``tidal bench`` needs to drive tidal's HTTP edge.

The same requests as over MessagePack-RPC, each a ``POST /v1/METHOD`` whose body is the
params as a JSON array, on keep-alive connections (pipelined as deep as ``-P``): so the
HTTP row of ``make bench`` and the MessagePack one face the same load generator. Replies
are only delimited (by Content-Length), never parsed as JSON.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any, Final

_HEAD_END: Final = b"\r\n\r\n"


def request(method: str, params: list[Any], host: str, token: str | None = None) -> bytes:
    body = json.dumps(params, separators=(",", ":")).encode()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (
        f"POST /v1/{method} HTTP/1.1\r\nHost: {host}\r\n{auth}"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


class Replies:
    """Responses in the order requests were sent (HTTP/1.1 answers pipelined requests in
    order). Yields (slot, error or None) per answered request, as ``resp.Replies`` does."""

    def __init__(self) -> None:
        self._buf = b""
        self._waiting: deque[int] = deque()

    def sent(self, slot: int, replies: int) -> None:
        self._waiting.append(slot)

    def feed(self, data: bytes) -> list[tuple[int, Any]]:
        buf = self._buf + data if self._buf else data
        pos, done = 0, []
        while True:
            head_end = buf.find(_HEAD_END, pos)
            if head_end < 0:
                break
            head = buf[pos:head_end]
            length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
            end = head_end + 4 + length
            if end > len(buf):
                break
            status = head[9:12]
            error = None if status == b"200" else buf[head_end + 4 : end].decode()
            done.append((self._waiting.popleft(), error))
            pos = end
        self._buf = buf[pos:]
        return done
