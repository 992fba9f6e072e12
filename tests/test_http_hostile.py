"""Hostile input on the HTTP edge, as on the TCP port: each gets a clear status, or its
connection closed when it never finishes, and costs no other client anything."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator

import pytest

from tidal.client import Client
from tidal.protocol.http_requests import MAX_HEAD_BYTES
from tidal.server import Config, Server

from .http_peer import call, exchange, request, responses


@pytest.fixture
async def web(tmp_path: object) -> AsyncIterator[Server]:
    server = Server(
        Config(
            host="127.0.0.1", port=0, db=f"{tmp_path}/tidal.db", http="127.0.0.1:0",
            message_timeout=1.0, max_message_size=1 << 20,
        )
    )  # fmt: skip
    await server.start()
    yield server
    await server.shutdown()


async def bystanders_are_served(server: Server) -> None:
    """Someone else, on either edge, is answered as usual."""
    async with await Client.connect(*server.address) as c:
        assert (await c.leave(777)).status == "left"
    assert await asyncio.to_thread(call, server.http_address[1], "status", 777)


def held_open(port: int, data: bytes) -> bytes:
    """Send ``data`` and then nothing: what the server sends before it closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
        return got


@pytest.mark.parametrize(
    "data",
    [
        b"POST /v1/ping HTTP/1.1\r\nX-Slow: ",  # slowloris: a head that never ends
        b"POST /v1/ping HTTP/1.1\r\nContent-Length: 100\r\n\r\n[",  # a body never whole
        b"POST /v1/ping HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n[\r\n",  # no last chunk
    ],
)
async def test_a_request_that_never_ends_is_closed_after_the_message_timeout(
    web: Server, data: bytes
) -> None:
    holding = asyncio.ensure_future(asyncio.to_thread(held_open, web.http_address[1], data))
    await bystanders_are_served(web)
    assert await holding == b""  # closed, having answered nothing of it


async def test_headers_past_the_bound_get_431(web: Server) -> None:
    pad = b"X-Pad: " + b"a" * 1000 + b"\r\n"
    data = b"GET /health HTTP/1.1\r\n" + pad * (MAX_HEAD_BYTES // len(pad) + 2) + b"\r\n"
    (only,) = responses(await asyncio.to_thread(exchange, web.http_address[1], data))
    assert only[0] == 431 and only[1]["connection"] == "close", only
    await bystanders_are_served(web)


async def test_a_chunked_body_that_goes_on_for_ever_gets_413(web: Server) -> None:
    def flood(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /v1/ping HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")
            chunk = b"10000\r\n" + b"[" * 0x10000 + b"\r\n"
            try:
                for _ in range(100):  # 6.4 MiB, past the 1 MiB limit
                    s.sendall(chunk)
            except OSError:
                pass  # the server answered and closed: the rest is refused
            got = b""
            while True:
                try:
                    part = s.recv(65536)
                except ConnectionResetError:
                    break
                if not part:
                    break
                got += part
            return got

    answer = responses(await asyncio.to_thread(flood, web.http_address[1]))
    assert answer[0][0] == 413 and b"over the limit" in answer[0][2]
    await bystanders_are_served(web)


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"[1, 2", "not JSON"),
        (b"[" * 50_000 + b"]" * 50_000, "nested too deeply"),
        (b'{"user_id": 1, "user_id": 2}', "given twice"),
        (b"[18446744073709551616]", "user_id: must be an integer in 0..2**64-1"),
        (b"[-1e999]", "user_id: must be an integer"),
        (b'["1' + b"0" * 40 + b'"]', "user_id: must be an integer"),
        (b"[NaN]", "NaN"),
        (b'"\xff"', "not UTF-8"),
    ],
)
async def test_bad_json_gets_400_and_the_connection_goes_on(
    web: Server, body: bytes, fragment: str
) -> None:
    port = web.http_address[1]
    bad = (
        b"POST /v1/status HTTP/1.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    good = b"POST /v1/ping HTTP/1.1\r\nConnection: close\r\n\r\n"
    first, second = responses(await asyncio.to_thread(exchange, port, bad + good))
    assert first[0] == 400, first
    assert fragment in json.loads(first[2])["error"]["message"]
    assert second[0] == 200 and json.loads(second[2]) == {"result": "pong"}
    await bystanders_are_served(web)


async def test_garbage_instead_of_http_gets_400_and_is_closed(web: Server) -> None:
    (only,) = responses(
        await asyncio.to_thread(exchange, web.http_address[1], b"\x16\x03\x01 hi\r\n\r\n")
    )
    assert only[0] == 400
    await bystanders_are_served(web)


async def test_many_connections_that_say_nothing_cost_nothing(web: Server) -> None:
    idle = [socket.create_connection(("127.0.0.1", web.http_address[1])) for _ in range(200)]
    try:
        await bystanders_are_served(web)
        code, _, _ = await asyncio.to_thread(request, web.http_address[1], "/health")
        assert code == 200
    finally:
        for s in idle:
            s.close()


async def test_requests_before_a_broken_one_are_answered_first(web: Server) -> None:
    good = b"POST /v1/ping HTTP/1.1\r\n\r\n"
    got = responses(
        await asyncio.to_thread(exchange, web.http_address[1], good * 2 + b"BROKEN\r\n\r\n")
    )
    assert [status for status, _, _ in got] == [200, 200, 400]
    assert got[2][1]["connection"] == "close"


async def test_a_client_that_half_closes_is_answered(web: Server) -> None:
    def half_closed(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            body = b"[5]"
            s.sendall(
                b"POST /v1/leave HTTP/1.1\r\nContent-Type: application/json\r\n"
                b"Content-Length: 3\r\n\r\n" + body
            )
            s.shutdown(socket.SHUT_WR)  # all it will send: the answer still comes
            got = b""
            while chunk := s.recv(65536):
                got += chunk
            return got

    (only,) = responses(await asyncio.to_thread(half_closed, web.http_address[1]))
    assert only[0] == 200 and json.loads(only[2])["result"]["status"] == "left"
