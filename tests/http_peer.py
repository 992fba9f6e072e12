"""An HTTP client for the tests that shares no code with tidal: Python's ``urllib`` and
raw sockets, so that what they see is what any HTTP client would."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

Reply = tuple[int, dict[str, str], Any]


def request(
    port: int,
    path: str,
    body: Any = None,
    *,
    method: str | None = None,
    token: str | None = None,
    headers: dict[str, str] | None = None,
    data: bytes | None = None,
) -> Reply:
    """``path`` on 127.0.0.1:``port``: status, headers (lower case) and the JSON answer."""
    sent = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        sent["Authorization"] = f"Bearer {token}"
    if data is None and body is not None:
        data = json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=data,
        method=method or ("POST" if data is not None or path.startswith("/v1/") else "GET"),
        headers=sent,
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, _json(r.read())
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, _json(e.read())


def call(port: int, method: str, *params: Any, token: str | None = None) -> Any:
    """``POST /v1/METHOD`` with positional params: its result, or AssertionError."""
    status, _, answer = request(port, f"/v1/{method}", list(params), token=token)
    assert status == 200, (method, status, answer)
    return answer["result"]


def _json(data: bytes) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        return data


def exchange(port: int, data: bytes, *, until: bytes | None = None, most: int = 1 << 22) -> bytes:
    """Send ``data`` on a new connection and read until the server closes it, or until
    ``until`` has been read (a count of responses: ``until`` occurrences)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        got = b""
        while len(got) < most:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
            if until is not None and until in got:
                break
        return got


def responses(data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Each HTTP response in ``data`` (by Content-Length): status, headers, body."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers.get("content-length", len(rest)))
        out.append((int(lines[0].split()[1]), headers, rest[:length]))
        data = rest[length:]
    return out


class EventStream:
    """A Server-Sent Events stream read off a raw socket, frame by frame (the standard's
    fields: id, event, data; a comment line as ``comment``)."""

    def __init__(self, port: int, path: str, headers: dict[str, str] | None = None) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        lines = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        self.sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{lines}\r\n".encode())
        self._buffer = b""
        head = self._until(b"\r\n\r\n")
        status_line, *fields = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {k.lower(): v.strip() for k, _, v in (f.partition(":") for f in fields)}
        if self.status != 200:  # an error: its JSON body
            length = int(self.headers["content-length"])
            while len(self._buffer) < length:
                self._buffer += self.sock.recv(65536)
            self.error = json.loads(self._buffer[:length])

    def _until(self, mark: bytes) -> bytes:
        while mark not in self._buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError(f"closed; {len(self._buffer)} bytes unparsed")
            self._buffer += chunk
        found, _, self._buffer = self._buffer.partition(mark)
        return found

    def next(self) -> dict[str, str]:
        """The next frame (EOFError once the server closed the stream); one that only sets
        the reconnection time is kept as ``retry`` and skipped."""
        while True:
            frame: dict[str, str] = {}
            for line in self._until(b"\n\n").decode().split("\n"):
                name, _, value = line.partition(":")
                frame[name or "comment"] = value[1:] if value.startswith(" ") else value
            if set(frame) != {"retry"}:
                return frame
            self.retry = int(frame["retry"])

    def events(self, n: int) -> list[dict[str, Any]]:
        """The next ``n`` events with an id, their data parsed (heartbeats skipped)."""
        out: list[dict[str, Any]] = []
        while len(out) < n:
            frame = self.next()
            if "id" in frame:
                out.append({**frame, "data": json.loads(frame["data"])})
        return out

    def close(self) -> None:
        self.sock.close()
