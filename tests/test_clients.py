"""The bundled client, a third-party MessagePack-RPC client, and the ``tidal`` CLI."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import aio_msgpack_rpc
import pytest

from tidal.client import (
    CallTimeout,
    Client,
    ClusterClient,
    ConnectFailed,
    ConnectionLost,
    InvalidArgument,
    InvalidParams,
    MethodNotFound,
    RequestTooLarge,
    ServerError,
    Signal,
    SyncClient,
    SyncClusterClient,
    TidalError,
)
from tidal.client.addresses import Address, Hosts, parse
from tidal.server import Server

from .conftest import ServerProcess
from .test_security import started


async def test_pipelined_calls_on_one_connection_match_their_replies(client: Client) -> None:
    users = list(range(300))
    results = await asyncio.gather(*(client.leave(u) if u % 2 else client.status(u) for u in users))
    for user, membership in zip(users, results, strict=True):
        assert membership.user_id == user
        assert membership.status == ("left" if user % 2 else "active")


async def test_signal_batch_is_one_durable_unit_in_order(client: Client) -> None:
    await client.leave(2)
    acks = await client.signal_batch(
        [
            Signal(1, "album", "play", 2.0, communities=["rock"]),
            Signal(2, "album", "play", communities=["rock"]),
            Signal(3, "album", "skip", attrs={"premium": True}),
        ]
    )
    assert [a.forwarded for a in acks] == [True, False, True]
    assert [a.seq for a in acks] == sorted(a.seq for a in acks)
    counts = await client.counts("album")
    assert counts.ledger["play"].count == 2 and counts.ledger["play"].weight == 3.0
    assert counts.communities["rock"]["play"].count == 1


async def test_a_compact_ack_says_what_the_full_one_says(client: Client) -> None:
    """Repeats (a key seen before) take no new seq: the compact ack names them, and the
    others count on from first_seq, whatever the mix of left and active users."""
    await client.leave(5)
    first = await client.call(
        "signal_batch",
        [[1, "tune", "view", 1.0, {"id": "k-a"}], [5, "tune", "view", 1.0, {"id": "k-b"}]],
    )
    items = [[u, "tune", "view", 1.0, {"id": f"k-{u}"}] for u in range(2, 12)]
    items[3] = [5, "tune", "view", 1.0, {"id": "k-b"}]  # a repeat, gated when first sent
    items[7] = [1, "tune", "view", 1.0, {"id": "k-a"}]  # a repeat, forwarded
    full = await client.call("signal_batch", items[:5])  # the first five, full acks
    compact = await client.call("signal_batch", items, {"ack": "compact"})
    assert set(compact) == {"first_seq", "forwarded", "repeated"}
    # items 0..2 and 4 were sent in the full batch just before, with the same keys
    assert compact["repeated"] == [
        [0, full[0]["seq"]], [1, full[1]["seq"]], [2, full[2]["seq"]], [3, first[1]["seq"]],
        [4, full[4]["seq"]], [7, first[0]["seq"]],
    ]  # fmt: skip
    assert compact["first_seq"] == full[4]["seq"] + 1
    forwarded = [bool(compact["forwarded"][i // 8] >> (i % 8) & 1) for i in range(10)]
    assert forwarded == [u != 5 for u, *_ in items]
    assert len(compact["forwarded"]) == 2  # ten bits
    # the bundled client asks for the compact ack and gives one SignalAck per signal
    acks = await client.signal_batch(
        [Signal(5, "tune", "like"), Signal(1, "tune", "view", key="k-a"), Signal(6, "tune", "like")]
    )
    seq = compact["first_seq"] + 4  # items 5, 6, 8 and 9 were new in the compact batch
    assert [(a.seq, a.forwarded) for a in acks] == [
        (seq, False), (first[0]["seq"], True), (seq + 1, True),
    ]  # fmt: skip
    assert (await client.counts("tune")).ledger["like"].count == 2


async def test_errors_are_raised_by_code(client: Client) -> None:
    with pytest.raises(InvalidParams, match=r"entity: must be 1\.\.256 bytes") as info:
        await client.signal(1, "", "view")
    assert info.value.code == -32602
    assert isinstance(info.value, ServerError) and isinstance(info.value, TidalError)
    with pytest.raises(MethodNotFound):
        await client.call("nothing")


async def test_cohorts_define_list_replace_and_drop(client: Client) -> None:
    assert await client.define_cohort("eu", {"country": ["DE", "FR"], "adult": True})
    assert await client.cohorts() == {"eu": {"country": ["DE", "FR"], "adult": True}}
    await client.signal(1, "film", "view", attrs={"country": "FR", "adult": True})
    await client.signal(1, "film", "view", attrs={"country": "FR", "adult": 1})  # 1 is not true
    await client.signal(1, "film", "view", attrs={"country": "US", "adult": True})
    assert (await client.counts("film")).cohorts == {"eu": {"view": (await_tally(1, 1.0))}}
    # the same rule again keeps counting; a new rule starts from zero
    assert await client.define_cohort("eu", {"adult": True, "country": ["FR", "DE"]})
    assert (await client.counts("film")).cohorts["eu"]["view"].count == 1
    assert await client.define_cohort("eu", {"country": "US"})
    assert (await client.counts("film")).cohorts == {}
    assert await client.drop_cohort("eu") is True
    assert await client.drop_cohort("eu") is False
    assert await client.cohorts() == {}


def await_tally(count: int, weight: float) -> object:
    from tidal.client import Tally

    return Tally(count, weight)


async def test_pending_calls_fail_with_connection_lost(process: ServerProcess) -> None:
    await process.start()
    c = await Client.connect("127.0.0.1", process.port, reconnect=2)
    batch = [Signal(i, "e", "view") for i in range(10_000)]
    calls = [asyncio.ensure_future(c.signal_batch(batch)) for _ in range(30)]
    await asyncio.wait(calls, return_when=asyncio.FIRST_COMPLETED)
    await process.kill9()
    results = await asyncio.gather(*calls, return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors and all(isinstance(e, ConnectionLost) for e in errors)
    with pytest.raises(ConnectionLost, match="could not reconnect"):  # the server is gone
        await c.ping()
    await c.close()


async def test_a_call_times_out_with_its_own_error(server: Server) -> None:
    # a listener that accepts and never answers
    never = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = never.sockets[0].getsockname()[1]
    async with await Client.connect("127.0.0.1", port, timeout=5) as c:
        with pytest.raises(CallTimeout, match=r"ping: no reply in 0\.05s"):
            await c.call("ping", timeout=0.05)
        with pytest.raises(TimeoutError):
            await c.call("ping", timeout=0.05)
    never.close()


async def test_a_third_party_msgpack_rpc_client_works(server: Server) -> None:
    host, port = server.address
    reader, writer = await asyncio.open_connection(host, port)
    rpc = aio_msgpack_rpc.Client(reader, writer, response_timeout=10)
    try:
        assert await rpc.call("ping") == "pong"
        left = await rpc.call("leave", 2**64 - 1)
        assert left["status"] == "left" and left["user_id"] == 2**64 - 1
        status = await rpc.call("status", 2**64 - 1)
        assert status == left
        with pytest.raises(aio_msgpack_rpc.error.RPCResponseError) as info:
            await rpc.call("status", -1)
        assert info.value.args[0][0] == -32602
    finally:
        rpc.close()


def run_cli(port: int, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidal.cli", "call", "--port", str(port), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_tidal_call_prints_json_and_fails_on_errors(process: ServerProcess) -> None:
    await process.start()
    port = process.port
    done = await asyncio.to_thread(run_cli, port, "leave", "42")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "left"
    done = await asyncio.to_thread(
        run_cli, port, "signal", "42", "song", "view", "1.5", '{"communities": ["x"]}'
    )
    assert json.loads(done.stdout)["forwarded"] is False
    done = await asyncio.to_thread(run_cli, port, "leave", "-1")
    assert done.returncode == 1
    assert "error -32602: user_id" in done.stderr
    await process.stop()
    done = await asyncio.to_thread(run_cli, port, "ping")
    assert done.returncode == 2 and "cannot reach tidal" in done.stderr


async def test_every_error_a_call_can_raise_is_a_tidal_error(server: Server) -> None:
    async with await Client.connect(*server.address) as c:
        with pytest.raises(RequestTooLarge, match="exceeds the limit") as large:
            await c.signal(1, "x" * 9_000_000, "view")
        with pytest.raises(InvalidArgument, match="user_id") as huge:
            await c.status(2**64)
        with pytest.raises(InvalidArgument, match="cannot encode") as odd:
            await c.call("signal", 1, "e", "view", 1.0, {"attrs": {"a": object()}})
        for error in (large, huge, odd):
            assert isinstance(error.value, TidalError)
        assert isinstance(huge.value, ValueError)  # what it was before, still true
        assert await c.ping() == "pong"  # nothing was sent: the connection is fine
    with pytest.raises(ConnectFailed) as refused:
        await Client.connect("127.0.0.1", closed_port())
    assert isinstance(refused.value, TidalError) and isinstance(refused.value, ConnectionError)


async def test_the_server_s_reason_for_closing_reaches_the_caller(
    db_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = await started(db_path, max_connections=1)
    try:
        async with await Client.connect(*server.address) as first:
            assert await first.ping() == "pong"
            async with await Client.connect(*server.address, reconnect=1) as second:
                with pytest.raises(ConnectionLost, match="too many connections"):
                    await second.leave(1)
        assert any("too many connections" in r.getMessage() for r in caplog.records)
    finally:
        await server.shutdown()


async def test_reads_recover_after_the_server_restarts(process: ServerProcess) -> None:
    process.extra = ("--port", str(closed_port()))
    await process.start()
    async with await process.connect() as c:
        assert (await c.leave(7)).status == "left"
        await process.stop()
        await process.start()
        assert (await c.status(7)).status == "left"
        assert (await c.counts("e")).ledger == {}


def closed_port() -> int:
    """A port nothing listens on (just now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        ("db1", [("db1", 7411)]),
        ("h1,h2:7412", [("h1", 7411), ("h2", 7412)]),
        (" h1 , [::1]:7413, ::1", [("h1", 7411), ("::1", 7413), ("::1", 7411)]),
        ([("h1", 1), ("h2", "2")], [("h1", 1), ("h2", 2)]),
    ],
)
def test_a_client_takes_one_address_or_several(hosts: Hosts, expected: list[Address]) -> None:
    assert parse(hosts, 7411) == expected


@pytest.mark.parametrize(
    ("hosts", "rule"),
    [
        ("h1,,h2", "an empty address"),
        ("h1:http", "the port must be a number"),
        ("h1:0", "the port must be 1 to 65535"),
        ([], "at least one address"),
        (["h1"], "(host, port) pairs"),
    ],
)
def test_a_bad_address_list_names_the_rule(hosts: Hosts, rule: str) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(rule)):
        parse(hosts, 7411)


async def test_a_misspelt_connect_option_is_a_type_error_in_every_face() -> None:
    """The faces share their options (``ConnectOptions``): a name none of them takes is
    refused before anything is dialled, as a keyword a function does not take is."""
    bad = {"tiemout": 3}
    with pytest.raises(TypeError, match="tiemout"):
        await Client.connect("127.0.0.1", 1, **bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tiemout"):
        await ClusterClient.connect("127.0.0.1", 1, **bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tiemout"):
        SyncClient("127.0.0.1", 1, **bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tiemout"):
        SyncClusterClient("127.0.0.1", 1, **bad)  # type: ignore[arg-type]
