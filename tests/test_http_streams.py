"""The change feed and the consumer groups over Server-Sent Events: ids that resume a
stream with ``Last-Event-ID``, heartbeats as comments, a group's share acknowledged
over plain requests, and a reader that stops reading cut off at no one else's cost."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

import pytest

from tidal.client import Client
from tidal.server import Config, Server

from .conftest import Database
from .http_peer import EventStream, call, request


async def serving(target: str, **settings: Any) -> Server:
    config = Config(host="127.0.0.1", port=0, db=target, http="127.0.0.1:0", **settings)
    server = Server(config)
    await server.start()
    return server


def stream(server: Server, path: str, **headers: str) -> EventStream:
    return EventStream(server.http_address[1], path, headers)


@pytest.mark.both_backends
async def test_the_feed_streams_and_resumes_from_the_last_event_id(database: Database) -> None:
    server = await serving(database.target, feed_heartbeat=0.05)
    port = server.http_address[1]
    try:
        for user in range(5):
            await asyncio.to_thread(call, port, "leave", user)
        await asyncio.to_thread(call, port, "purge", 2)
        everything = await asyncio.to_thread(stream, server, "/v1/events?from=0")
        assert everything.status == 200
        assert everything.headers["content-type"] == "text/event-stream"
        hello = await asyncio.to_thread(everything.next)
        assert hello["event"] == "subscribed" and '"last_id":"6"' in hello["data"]
        got = await asyncio.to_thread(everything.events, 6)
        assert [e["id"] for e in got] == ["1", "2", "3", "4", "5", "6"]
        assert [e["event"] for e in got] == ["leave"] * 5 + ["purge"]
        assert got[0]["data"]["user_id"] == "0" and got[5]["data"]["purged"] == 0
        # live: a leave answered is already written to the stream
        await asyncio.to_thread(call, port, "leave", 2**64 - 1)
        (live,) = await asyncio.to_thread(everything.events, 1)
        assert live["id"] == "7" and live["data"]["user_id"] == str(2**64 - 1)
        # a quiet feed sends comments, which every client skips
        assert "heartbeat last_id=7" in (await asyncio.to_thread(everything.next))["comment"]
        everything.close()
        # an EventSource reconnecting says where it was; only what came after is sent
        resumed = await asyncio.to_thread(
            stream, server, "/v1/events?from=0&events=leave", **{"Last-Event-ID": "4"}
        )
        await asyncio.to_thread(resumed.next)  # subscribed
        got = await asyncio.to_thread(resumed.events, 2)
        assert [(e["id"], e["event"]) for e in got] == [("5", "leave"), ("7", "leave")]
        resumed.close()
        refused = await asyncio.to_thread(stream, server, "/v1/events?from=99")
        assert (
            refused.status == 400 and "past the last event id" in refused.error["error"]["message"]
        )
        refused = await asyncio.to_thread(stream, server, "/v1/events?events=nothing")
        assert (
            refused.status == 400 and "'nothing' is no event" in refused.error["error"]["message"]
        )
    finally:
        await server.shutdown()


def curl_events(port: int, n: int) -> list[str]:
    """``curl -N``: the first ``n`` id lines it prints."""
    with subprocess.Popen(
        ["curl", "-sN", f"http://127.0.0.1:{port}/v1/events?from=0"],
        stdout=subprocess.PIPE,
        text=True,
    ) as curl:
        assert curl.stdout is not None
        ids = []
        for line in curl.stdout:
            if line.startswith("id: "):
                ids.append(line.strip())
                if len(ids) == n:
                    break
        curl.kill()
    return ids


def curl(port: int, method: str, body: str) -> str:
    done = subprocess.run(
        ["curl", "-sS", "--fail-with-body", "--json", body, f"http://127.0.0.1:{port}/v1/{method}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, (method, done.stdout, done.stderr)
    return done.stdout


async def test_curl_calls_each_method_class_and_follows_the_feed(database: Database) -> None:
    server = await serving(database.target)
    port = server.http_address[1]
    try:
        for method, body, fragment in [
            ("signal", '{"user_id": 1, "entity": "song", "kind": "view"}', '"seq":1'),
            ("signal_batch", '[[[2, "song", "view"], [3, "song", "view"]]]', '"seq":3'),
            ("leave", '{"user_id": "42"}', '"status":"left"'),
            ("status", "[42]", '"user_id":"42"'),
            ("counts", '["song"]', '"count":3'),
            ("define_cohort", '["eu", {"region": ["eu"]}]', '"result":true'),
            ("purge", "[1]", '"purged":1'),
            ("group_create", '["audit"]', '"name":"audit"'),
            ("receipt", "[42]", '"optouts"'),
            ("stats", "[]", '"signals":3'),
        ]:
            out = await asyncio.to_thread(curl, port, method, body)
            assert fragment in out, (method, out)
        ids = await asyncio.to_thread(curl_events, port, 3)
        assert ids == ["id: 1", "id: 2", "id: 3"]
    finally:
        await server.shutdown()


@pytest.mark.both_backends
async def test_a_groups_share_streams_and_is_acknowledged_over_http(database: Database) -> None:
    server = await serving(database.target)
    port = server.http_address[1]
    try:
        await asyncio.to_thread(call, port, "group_create", "audit", {"from": 0})
        for user in range(3):
            await asyncio.to_thread(call, port, "leave", user)
        consumer = await asyncio.to_thread(stream, server, "/v1/groups/audit/events")
        hello = await asyncio.to_thread(consumer.next)
        assert hello["event"] == "subscribed"
        me = __import__("json").loads(hello["data"])["consumer"]
        got = await asyncio.to_thread(consumer.events, 3)
        assert [e["id"] for e in got] == ["1", "2", "3"]
        assert all(e["data"]["group"] == "audit" and e["data"]["deliveries"] == 1 for e in got)
        ack = {"ids": [1, 2], "consumer": me}
        code, _, answer = await asyncio.to_thread(request, port, "/v1/groups/audit/ack", ack)
        assert code == 200 and answer["result"] == {"acked": 2, "cursor": "2"}
        nack = {"ids": [3], "consumer": me, "options": {"delay": 0}}
        code, _, answer = await asyncio.to_thread(request, port, "/v1/groups/audit/nack", nack)
        assert code == 200, answer
        (again,) = await asyncio.to_thread(consumer.events, 1)
        assert again["id"] == "3" and again["data"]["deliveries"] == 2
        for wrong, fragment in [
            ({"ids": [3], "consumer": "someone"}, "no stream of group 'audit'"),
            ({"ids": [99], "consumer": me}, "not pending"),
            ({"ids": [3]}, "consumer is the id"),
        ]:
            code, _, answer = await asyncio.to_thread(request, port, "/v1/groups/audit/ack", wrong)
            assert code == 400 and fragment in answer["error"]["message"], answer
        code, _, answer = await asyncio.to_thread(
            request, port, "/v1/groups/audit/ack", {"ids": [3], "consumer": me}
        )
        assert code == 200 and answer["result"]["cursor"] == "3"
        (group,) = await asyncio.to_thread(call, port, "groups")
        assert group["pending"] == 0 and group["acknowledged"] == 3
        assert (await asyncio.to_thread(call, port, "receipt", 1))["optouts"][0]["groups"]["audit"][
            "state"
        ] == "acknowledged"
        consumer.close()
    finally:
        await server.shutdown()


async def test_a_stream_that_never_reads_is_cut_off_at_no_one_elses_cost(db_path: Any) -> None:
    server = await serving(str(db_path))
    try:
        lazy = await asyncio.to_thread(stream, server, "/v1/events")
        await asyncio.to_thread(lazy.next)  # subscribed; from now on it reads nothing
        async with await Client.connect(*server.address) as c:
            sent = 0
            while (await c.stats())["subscribers"]:
                await asyncio.gather(*(c.leave(sent + i) for i in range(500)))
                await asyncio.gather(*(c.rejoin(sent + i) for i in range(500)))
                sent += 500
                assert sent < 200_000, "the stream that does not read was never cut off"
                # others are answered meanwhile, over both edges
                assert await asyncio.to_thread(call, server.http_address[1], "ping") == "pong"
        frames = []
        try:
            while True:
                frames.append(await asyncio.to_thread(lazy.next))
        except EOFError:
            pass
        assert frames[-1]["event"] == "lagging", frames[-1]  # told why, then closed
    finally:
        await server.shutdown()


async def test_health_and_ready_for_probes(db_path: Any) -> None:
    server = await serving(str(db_path))
    try:
        for path in ("/health", "/ready"):
            code, _, answer = await asyncio.to_thread(request, server.http_address[1], path)
            assert code == 200 and answer["status"] == "ok"
    finally:
        await server.shutdown()
