"""The change feed's cost to writers: leaves with no subscriber, then with 100 connected,
side by side on one server, rounds alternating, driven by ``tidal bench``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import msgpack
import uvloop

from bench.systems import tidal_bench, tidal_server
from tidal.client import SyncClient

SUBSCRIBERS = 100
ROUNDS = 5


class _Subscriber(asyncio.Protocol):
    """Subscribes, then reads what comes as fast as it comes (counting bytes only, so that
    this machine's two cores go to the server, not to decoding here)."""

    def __init__(self) -> None:
        self.received = 0
        self.lost = False  # the server closed it: it lagged

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without subclassing it
        cast(asyncio.Transport, transport).write(msgpack.packb([0, 1, "subscribe", []]))

    def data_received(self, data: bytes) -> None:
        self.received += len(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


@contextmanager
def subscribers(port: int, count: int) -> Iterator[list[_Subscriber]]:
    """``count`` subscribers on a loop of their own (a thread), for as long as the block."""
    # the lighter loop: this machine's cores go to the server
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    ready = threading.Event()
    subs: list[_Subscriber] = []
    transports: list[asyncio.BaseTransport] = []

    async def connect() -> None:
        for _ in range(count):
            transport, sub = await loop.create_connection(_Subscriber, "127.0.0.1", port)
            subs.append(sub)
            transports.append(transport)
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(connect(), loop).result(60)
    ready.wait(60)
    try:
        yield subs
    finally:

        def close() -> None:
            for transport in transports:
                transport.close()
            loop.call_soon(loop.stop)  # after the closes it schedules

        loop.call_soon_threadsafe(close)
        thread.join(60)
        loop.close()


def feed_figures(scale: float) -> dict[str, Any]:
    """Leaves and rejoins (``--workload leave``) from one client, one at a time, with no
    subscriber and with 100 reading every event; five rounds of each, alternating, on one
    server. Each event costs the server a socket write per subscriber (a loopback send: 5-7 µs
    of CPU here, whatever writes it), so a load of nothing but leaves from many clients, which
    saturates this machine's two cores, slows by that much: this measures one leave's wait."""
    n = max(2_000, int(10_000 * scale))
    runs: dict[str, list[dict[str, Any]]] = {"none": [], "subscribed": []}
    with tidal_server("full") as srv:
        for _ in range(ROUNDS):
            runs["none"].append(tidal_bench(srv, 1, 1, n, workload="leave"))
            with subscribers(srv.port, SUBSCRIBERS) as subs:
                runs["subscribed"].append(tidal_bench(srv, 1, 1, n, workload="leave"))
                with SyncClient("127.0.0.1", srv.port) as c:
                    assert c.stats()["subscribers"] >= SUBSCRIBERS
                # every one kept up: none was closed for lagging
                assert not any(s.lost for s in subs)
    ratios = [
        s["p99_ms"] / o["p99_ms"] for s, o in zip(runs["subscribed"], runs["none"], strict=True)
    ]
    out: dict[str, Any] = {"requests": n, "subscribers": SUBSCRIBERS, "runs": runs}
    for name, rs in runs.items():
        out[name] = sorted(rs, key=lambda r: r["p99_ms"])[len(rs) // 2]
    out["p99_ratio"] = sorted(ratios)[len(ratios) // 2]
    out["p99_ratio_range"] = [min(ratios), max(ratios)]
    return out


def feed_report(feed: dict[str, Any] | None) -> list[str]:
    if not feed:
        return []
    many = f"{feed['subscribers']} subscribers"
    none, subscribed = feed["none"], feed["subscribed"]
    per_sub = (subscribed["server_cpu_us"] - none["server_cpu_us"]) / feed["subscribers"]
    rows = [("no subscriber", none), (many, subscribed)]
    return [
        "",
        "## The change feed",
        "",
        f"{feed['requests']:,} leaves and rejoins (`--workload leave`, one client, one at a time)"
        f" on one server, with no subscriber, then with {feed['subscribers']} connected and"
        " reading every event (`bench/feed.py`), rounds alternating; the median round of each."
        f" Each subscriber cost the server {per_sub:.1f} µs of CPU per request: one socket write"
        " per event, before the ack (a loopback send costs 5-7 µs on this machine, whoever makes"
        " it), and the wait for those writes is most of what a leave's p50 gains.",
        "",
        "| | requests/s | p50 ms | p99 ms | server CPU µs/request |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {r['requests_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f}"
            f" | {r['server_cpu_us']:.0f} |"
            for name, r in rows
        ),
    ]
