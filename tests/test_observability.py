"""Prometheus metrics, scraped for real, and structured logs."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tidal.client import Client, InvalidParams, MethodNotFound, Signal
from tidal.protocol import METHODS
from tidal.server import Config, Server
from tidal.server.version import VERSION

from .conftest import ServerProcess
from .rawrpc import RawPeer


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
        return text


def value(text: str, sample: str) -> float:
    match = re.search(rf"^{re.escape(sample)} (\S+)$", text, re.MULTILINE)
    assert match, f"{sample} not in the scrape"
    return float(match.group(1))


async def test_the_metrics_port_serves_metrics_and_404_for_the_rest(db_path: Path) -> None:
    """It answered 200, with the metrics, for every path."""
    server = Server(Config(port=0, db=str(db_path), metrics_port=0))
    await server.start()
    try:
        assert "tidal_signals_total" in await asyncio.to_thread(scrape, server.metrics_port)
        for path in ("/", "/metricsx", "/favicon.ico", "/admin"):
            url = f"http://127.0.0.1:{server.metrics_port}{path}"
            with pytest.raises(urllib.error.HTTPError) as refused:
                await asyncio.to_thread(urllib.request.urlopen, url, timeout=10)
            assert refused.value.code == 404, path
            assert b"/metrics" in refused.value.read()
    finally:
        await server.shutdown()


async def test_metrics_count_what_happened(db_path: Path) -> None:
    server = Server(Config(port=0, db=str(db_path), metrics_port=0))
    await server.start()
    try:
        peer = await RawPeer.open(server.address)
        assert (await peer.call("subscribe"))[3] == {"last_id": 0}
        async with await Client.connect(*server.address) as c:
            await c.leave(1)
            await c.signal(1, "e", "view")
            await c.signal(2, "e", "view")
            await c.signal_batch([Signal(3, "e", "view")] * 3)
            await c.leave(4)
            await c.rejoin(4)
            await c.signal(5, "e", "view")
            await c.signal(5, "e", "like")
            assert (await c.purge(5)).signals == 2
            await c.signal(6, "e", "view")
            assert (await c.erase(6)).signals == 1
            with pytest.raises(InvalidParams):
                await c.call("signal", -1, "e", "view")
            for name in ("junkA", "junkB", "junkC"):  # made-up methods add no series
                with pytest.raises(MethodNotFound):
                    await c.call(name)
            for _ in range(1000):  # the erased row leaves the ledger as its rewrite commits
                if (await c.stats())["ledger_rewriting"] == 0:
                    break
                await asyncio.sleep(0.01)
            text = await asyncio.to_thread(scrape, server.metrics_port)
        peer.close()
    finally:
        await server.shutdown()
    assert value(text, "tidal_subscribers") == 1
    assert value(text, "tidal_events_sent_total") == 5  # 2 leaves, 1 rejoin, 1 purge, 1 erase
    assert value(text, "tidal_last_event_id") == 5
    assert value(text, "tidal_subscribers_lagging_total") == 0
    assert value(text, "tidal_signals_total") == 8
    assert value(text, "tidal_forwarded_total") == 7
    assert value(text, "tidal_gated_total") == 1
    assert value(text, "tidal_leaves_total") == 3  # an erasure leaves too
    assert value(text, "tidal_rejoins_total") == 1
    assert value(text, "tidal_purges_total") == 1
    assert value(text, "tidal_erasures_total") == 1
    assert value(text, "tidal_withdrawn_signals_total") == 3
    assert value(text, "tidal_ledger_rows") == 7  # 8 signals, the erased user's row gone
    assert value(text, "tidal_database_bytes") > 0
    assert value(text, 'tidal_errors_total{code="-32602",name="invalid_params"}') == 1
    assert value(text, 'tidal_errors_total{code="-32601",name="method_not_found"}') == 3
    version = re.search(r'^tidal_build_info\{compiled="(true|false)",version="([^"]+)"\} 1\.0$',
                        text, re.MULTILINE)  # fmt: skip
    assert version is not None and version[2] == VERSION, text[:300]
    assert value(text, "tidal_users_left") == 2  # 1, and 6 (erased)
    assert value(text, "tidal_connections") == 2  # the client, the subscriber
    assert value(text, 'tidal_request_seconds_count{method="signal"}') == 6
    assert value(text, 'tidal_request_seconds_count{method="signal_batch"}') == 1
    assert value(text, 'tidal_request_seconds_count{method="other"}') == 3
    assert "junk" not in text
    # the one list of names metrics label by is the server's own table, and auth
    assert set(server.engine._methods) | {"auth"} == METHODS
    assert value(text, "tidal_commit_batch_size_count") >= 1
    # 8 signals, 2 leaves, 1 rejoin, a purge, and an erasure (its leave and itself)
    assert value(text, "tidal_commit_batch_size_sum") == 14
    assert value(text, 'tidal_commit_seconds_bucket{le="+Inf"}') >= 1


async def test_json_logs_one_object_a_line_and_no_token(db_path: Path) -> None:
    token = "very-secret-token"
    proc = ServerProcess(db_path, "--log-format", "json", "--log-level", "debug", "--token", token)
    await proc.start()
    async with await proc.connect_with(token=token) as c:
        with pytest.raises(InvalidParams):
            await c.call("leave", -5)
    await proc.stop()
    entries = [json.loads(line) for line in proc.log]
    assert all({"time", "level", "logger", "message"} <= e.keys() for e in entries)
    messages = [(e["level"], e["message"]) for e in entries]
    assert any(level == "debug" and m.startswith("connection from") for level, m in messages)
    assert any(level == "warning" and "user_id" in m for level, m in messages)
    assert any(m.startswith("listening on") for _, m in messages)
    assert token not in "".join(m for _, m in messages)


async def test_each_group_has_its_series(db_path: Path) -> None:
    """Lag, pending, dead letters, redeliveries, lost events and the opt-outs unconfirmed
    past an hour, labelled by group, as the group's state says."""
    server = Server(Config(port=0, db=str(db_path), metrics_port=0))
    await server.start()
    try:
        async with await Client.connect(*server.address) as c:
            await c.group_create("index", ack_wait=3600)
            await c.group_create("idle")
            consumer = await RawPeer.open(server.address)
            assert (await consumer.call("subscribe", {"group": "index"}))[2] is None
            await c.leave(1)
            await c.leave(2)
            sent = [await consumer.receive(), await consumer.receive()]
            assert [m[1] for m in sent] == ["event", "event"]
            consumer.send([0, 2, "nack", [[sent[0][2][0]["id"]], {"dead": True}]])
            assert (await consumer.receive())[2] is None
            text = await asyncio.to_thread(scrape, server.metrics_port)
            consumer.close()
    finally:
        await server.shutdown()
    assert value(text, 'tidal_group_lag_events{group="index"}') == 1  # the one still out
    assert value(text, 'tidal_group_pending{group="index"}') == 1
    assert value(text, 'tidal_group_dead_letters{group="index"}') == 1
    assert value(text, 'tidal_group_lag_events{group="idle"}') == 2
    assert value(text, 'tidal_group_pending{group="idle"}') == 0
    assert value(text, 'tidal_group_redeliveries_total{group="index"}') == 0
    assert value(text, 'tidal_group_lost_events_total{group="index"}') == 0
    assert value(text, 'tidal_group_optouts_unconfirmed{group="index"}') == 0  # not an hour old
    assert value(text, 'tidal_group_oldest_unacked_seconds{group="index"}') >= 0
