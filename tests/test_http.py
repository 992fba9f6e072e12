"""The HTTP/JSON edge (``--http``), over real sockets to a real server: every method
answers as over MessagePack, with the same promises (an answer means committed, the
gate at once, idempotency keys), its statuses, its token, keep-alive and pipelining.
The client is Python's urllib and raw sockets: no code shared with tidal."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tidal.client import Client
from tidal.protocol.jsonmap import Mapping
from tidal.protocol.methods import BY_NAME
from tidal.server import Config, Server

from .conftest import Database
from .http_peer import call, exchange, request, responses


async def serving(target: str, **settings: Any) -> Server:
    server = Server(Config(host="127.0.0.1", port=0, db=target, http="127.0.0.1:0", **settings))
    await server.start()
    return server


@pytest.fixture
async def web(database: Database) -> AsyncIterator[Server]:
    server = await serving(database.target)
    yield server
    await server.shutdown()


def over_http(server: Server, method: str, *params: Any) -> Any:
    return call(server.http_address[1], method, *params)


async def both(server: Server, c: Client, method: str, *params: Any) -> tuple[Any, Any]:
    """``method``'s answer over HTTP, and over MessagePack mapped as JSON maps it."""
    got = await asyncio.to_thread(over_http, server, method, *params)
    wire = await c.call(method, *params)
    expected = json.loads(json.dumps(Mapping(BY_NAME[method]).answer(wire)))
    return scrub(got), scrub(expected)


#: what changes between two answers a moment apart: the time each was answered at
MOMENTARY = {"as_of_ns", "lag_seconds", "oldest_unacked_seconds"}


def scrub(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if k not in MOMENTARY}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


@pytest.mark.both_backends
async def test_every_method_class_answers_as_over_messagepack(web: Server) -> None:
    port = web.http_address[1]
    big = 2**64 - 1
    async with await Client.connect(*web.address) as c:
        write: list[tuple[Any, ...]] = [
            ("define_cohort", "eu", {"region": ["eu"]}),
            (
                "signal",
                1,
                "song",
                "view",
                1.0,
                {"communities": ["jazz"], "attrs": {"region": "eu"}},
            ),
            ("signal", str(big), "song", "like", 2.5, {"communities": ["jazz"]}),
            (
                "signal_batch",
                [[2, "song", "view"], [3, "tune", "view", 1.0, {"communities": ["jazz"]}]],
            ),
            ("leave", 3),
            ("group_create", "audit", {"from": 0}),
        ]
        for method, *params in write:
            await asyncio.to_thread(over_http, web, method, *params)
        assert (await c.status(big)).status == "active"  # the string was the uint64
        assert (await c.status(3)).status == "left"
        reads: list[tuple[Any, ...]] = [
            ("status", 3),
            ("history", 3),
            ("counts", "song"),
            ("top", "community", "jazz", "view"),
            ("catalog", "community"),
            ("cohorts",),
            ("left_users",),
            ("count_left",),
            ("groups",),
            ("receipt", 3),
            ("unconfirmed",),
            ("dead_letters", "audit"),
            ("partition_map",),
            ("ping",),
        ]
        for method, *params in reads:
            got, expected = await both(web, c, method, *params)
            assert got == expected, method
        status = await asyncio.to_thread(over_http, web, "status", str(big))
        assert status["user_id"] == str(big)  # answered as a string, exactly
        after: list[tuple[Any, ...]] = [
            ("purge", 1),
            ("erase", 2),
            ("rejoin", 3),
            ("drop_cohort", "eu"),
        ]
        for method, *params in after:
            await asyncio.to_thread(over_http, web, method, *params)
        assert (await c.status(3)).status == "active"
        assert "purge" in [line["event"] for line in await c.call("history", 1)]
        assert await c.call("cohorts") == {}
    code, _, document = await asyncio.to_thread(request, port, "/v1/openrpc.json", method="GET")
    assert code == 200 and document["openrpc"].startswith("1.")
    assert {m["name"] for m in document["methods"]} == set(BY_NAME)


@pytest.mark.both_backends
async def test_an_answer_means_committed_and_the_gate_holds_at_once(database: Database) -> None:
    server = await serving(database.target)
    try:
        async with await Client.connect(*server.address) as c:
            for user in range(40):
                left = await asyncio.to_thread(over_http, server, "leave", user)
                assert left["status"] == "left"
                # the leave's answer is out: a signal from any edge is gated already
                assert not (await c.signal(user, "e", "view", communities=["x"])).forwarded
    finally:
        await server.shutdown()
    server = await serving(database.target)  # what was answered is on disk
    try:
        async with await Client.connect(*server.address) as c:
            assert await c.count_left() == 40
    finally:
        await server.shutdown()


async def test_an_idempotency_key_header_is_the_signals_key(web: Server) -> None:
    port = web.http_address[1]
    body = {"user_id": 5, "entity": "e", "kind": "view"}
    key = {"Idempotency-Key": "order-17"}
    first = await asyncio.to_thread(request, port, "/v1/signal", body, headers=key)
    again = await asyncio.to_thread(request, port, "/v1/signal", body, headers=key)
    other = await asyncio.to_thread(request, port, "/v1/signal", body)
    assert first[0] == again[0] == other[0] == 200
    assert first[2] == again[2] and other[2]["result"]["seq"] != first[2]["result"]["seq"]
    async with await Client.connect(*web.address) as c:
        assert (await c.stats())["signals"] == 2
    with_id = {**body, "context": {"id": "other"}}
    code, _, answer = await asyncio.to_thread(request, port, "/v1/signal", with_id, headers=key)
    assert code == 400 and "differs from context.id" in answer["error"]["message"]
    code, _, answer = await asyncio.to_thread(request, port, "/v1/leave", [5], headers=key)
    assert code == 400 and "only signal takes one" in answer["error"]["message"]


async def test_statuses_say_what_went_wrong(db_path: Path) -> None:
    server = await serving(str(db_path), max_message_size=100_000, memory_budget="1")
    port = server.http_address[1]
    try:
        for path, body, data, headers, status, fragment in [
            ("/v1/status", [-1], None, {}, 400, "user_id: must be an integer"),
            ("/v1/status", [2**64], None, {}, 400, "user_id: must be an integer"),
            ("/v1/status", {"user": 1}, None, {}, 400, "has no param 'user'"),
            ("/v1/status", None, b"[1", {}, 400, "not JSON"),
            ("/v1/status", None, b"[1]", {"Content-Type": "text/plain"}, 400, "content-type"),
            ("/v1/nothing", [], None, {}, 404, "method not found"),
            ("/v1/subscribe", [], None, {}, 404, "GET /v1/events"),
            ("/elsewhere", None, None, {}, 404, "not found"),
            ("/v1/ping", None, b"[" + b" " * 200_000 + b"]", {}, 413, "over the limit"),
            ("/v1/signal", [1, "e", "v", 1.0, {"communities": ["c"]}], None, {}, 507, "full:"),
        ]:
            code, _, answer = await asyncio.to_thread(
                request, port, path, body, data=data, headers=headers
            )
            assert code == status, (path, answer)
            assert fragment in answer["error"]["message"], (path, answer)
        code, _, answer = await asyncio.to_thread(request, port, "/v1/ping", method="GET")
        assert code == 400 and "takes POST" in answer["error"]["message"]
    finally:
        await server.shutdown()


async def test_a_token_is_asked_of_every_request_but_the_probes(db_path: Path) -> None:
    server = await serving(str(db_path), token="s3cret")
    port = server.http_address[1]
    try:
        code, headers, answer = await asyncio.to_thread(request, port, "/v1/ping", [])
        assert code == 401 and "Authorization: Bearer" in answer["error"]["message"]
        assert "Basic" in headers["www-authenticate"] and headers["connection"] == "close"
        code, _, answer = await asyncio.to_thread(request, port, "/v1/ping", [], token="nope")
        assert code == 401 and answer["error"]["message"] == "unauthorized: wrong token"
        assert await asyncio.to_thread(call, port, "ping", token="s3cret") == "pong"
        basic = {"Authorization": "Basic " + b"any:s3cret".hex()}
        code, _, _ = await asyncio.to_thread(request, port, "/", headers=basic)
        assert code == 401  # not base64
        import base64

        basic = {"Authorization": "Basic " + base64.b64encode(b"me:s3cret").decode()}
        code, headers, page = await asyncio.to_thread(request, port, "/", headers=basic)
        assert code == 200 and b"tidal console" in page
        assert headers["content-type"].startswith("text/html")
        for probe in ("/health", "/ready"):
            code, _, answer = await asyncio.to_thread(request, port, probe)
            assert code == 200 and answer["status"] == "ok"
        # a refused request's body is never read: its connection is closed after the 401
        data = b"POST /v1/ping HTTP/1.1\r\nContent-Length: 2\r\n\r\n[]" * 3
        (only,) = responses(await asyncio.to_thread(exchange, port, data))
        assert only[0] == 401
    finally:
        await server.shutdown()


async def test_keep_alive_and_pipelining_answer_in_the_order_asked(web: Server) -> None:
    port = web.http_address[1]
    parts = []
    for i in range(100):
        method, params = [("signal", [i, "e", "view"]), ("leave", [i]), ("status", [i])][i % 3]
        body = json.dumps(params).encode()
        parts.append(
            b"POST /v1/%s HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: %d"
            b"\r\n\r\n%s" % (method.encode(), len(body), body)
        )
    parts.append(b"GET /health HTTP/1.1\r\nConnection: close\r\n\r\n")
    got = responses(await asyncio.to_thread(exchange, port, b"".join(parts)))
    assert len(got) == 101 and all(status == 200 for status, _, _ in got)
    for i, (_, _, body) in enumerate(got[:100]):
        result = json.loads(body)["result"]
        if i % 3 == 0:
            assert set(result) == {"seq", "forwarded"}
        else:
            assert result["user_id"] == str(i)  # its own answer, in its place
            assert result["status"] == ("left" if i % 3 == 1 else "active")
    assert json.loads(got[100][2])["status"] == "ok"


async def test_an_http_server_beyond_loopback_needs_a_token(db_path: Path) -> None:
    from tidal.server.errors import ProtectedMode

    server = Server(Config(port=0, db=str(db_path), http="0.0.0.0:0"))
    with pytest.raises(ProtectedMode, match=r"'0\.0\.0\.0' without a token"):
        await server.start()


async def test_a_body_is_asked_for_when_the_client_expects_to_be(web: Server) -> None:
    """curl sends ``Expect: 100-continue`` past 1 KiB, and waits for it before the body."""

    def expecting(port: int) -> tuple[bytes, bytes]:
        body = json.dumps([[[u, "e", "view"] for u in range(100)]]).encode()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(
                b"POST /v1/signal_batch HTTP/1.1\r\nContent-Type: application/json\r\n"
                b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
            )
            interim = s.recv(1024)  # before any byte of the body was sent
            s.sendall(body)
            answer = b""
            while b'"result"' not in answer:
                answer += s.recv(65536)
            return interim, answer

    interim, answer = await asyncio.to_thread(expecting, web.http_address[1])
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    assert answer.startswith(b"HTTP/1.1 200 OK") and b'"seq":' in answer


async def test_without_a_token_only_requests_to_an_address_are_answered(web: Server) -> None:
    """DNS rebinding: another site's name, pointed at 127.0.0.1, makes a browser treat this
    server as that site; without a token, a request addressed to a name is refused."""
    port = web.http_address[1]
    for host, status in [
        ("evil.example", 401),
        (f"evil.example:{port}", 401),
        (f"localhost:{port}", 200),
        (f"127.0.0.1:{port}", 200),
        (f"[::1]:{port}", 200),
    ]:
        code, _, answer = await asyncio.to_thread(
            request, port, "/v1/ping", [], headers={"Host": host}
        )
        assert code == status, (host, answer)
    code, _, _ = await asyncio.to_thread(request, port, "/health", headers={"Host": "evil.example"})
    assert code == 200  # the probes are open to all
