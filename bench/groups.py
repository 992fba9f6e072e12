"""Consumer groups' cost: leaves with no group, then with 10 groups of 4 consumers each
acknowledging every event, side by side on one server, rounds alternating; and signals
with and without those groups (signals are not events: they should cost the same).
Driven by ``tidal bench``; the consumers run on a loop of their own (a thread)."""

from __future__ import annotations

import asyncio
import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import msgpack
import uvloop

from bench.systems import tidal_bench, tidal_server
from tidal.client import SyncClient

GROUPS = 10
CONSUMERS = 4  # per group
ROUNDS = 5


class _Consumer(asyncio.Protocol):
    """Joins a group, then acknowledges what it is sent as it comes, one ack per read."""

    def __init__(self, group: str) -> None:
        self.group = group
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        self.transport: asyncio.Transport | None = None
        self.acked = 0
        self.msgid = 1

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(msgpack.packb([0, 1, "subscribe", [{"group": self.group}]]))

    def data_received(self, data: bytes) -> None:
        self.unpacker.feed(data)
        ids = [m[2][0]["id"] for m in self.unpacker if m[0] == 2 and m[1] == "event"]
        if ids and self.transport is not None:
            self.msgid += 1
            self.transport.write(msgpack.packb([0, self.msgid, "ack", [ids]]))
            self.acked += len(ids)


def _same(consumer: _Consumer) -> _Consumer:
    return consumer


@contextmanager
def consumers(port: int) -> Iterator[list[_Consumer]]:
    """``CONSUMERS`` consumers of each of ``GROUPS`` groups, made from the feed's end."""
    with SyncClient("127.0.0.1", port) as c:
        for g in range(GROUPS):
            c.group_create(f"bench-{g}", ack_wait=60)
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    made: list[_Consumer] = []
    transports: list[asyncio.BaseTransport] = []

    async def connect() -> None:
        for g in range(GROUPS * CONSUMERS):
            consumer = _Consumer(f"bench-{g % GROUPS}")
            transport, _ = await loop.create_connection(functools.partial(_same, consumer),
                                                        "127.0.0.1", port)  # fmt: skip
            made.append(consumer)
            transports.append(transport)

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(connect(), loop).result(60)
    try:
        with SyncClient("127.0.0.1", port) as c:
            joined = sum(len(g["consumers"]) for g in c.groups())
            assert joined == GROUPS * CONSUMERS, f"{joined} consumers joined"
        yield made
    finally:

        def close() -> None:
            for transport in transports:
                transport.close()
            loop.call_soon(loop.stop)

        loop.call_soon_threadsafe(close)
        thread.join(60)
        loop.close()
        with SyncClient("127.0.0.1", port) as c:
            for g in range(GROUPS):
                c.group_drop(f"bench-{g}")


def group_figures(scale: float) -> dict[str, Any]:
    """Five rounds, alternating: leaves (``--workload leave``, one client, one at a time)
    with no group and with the groups; then signals (16 clients, 16 deep) the same way."""
    n = max(2_000, int(10_000 * scale))
    signals = max(20_000, int(100_000 * scale))
    names = ("none", "grouped", "signals", "signals_grouped")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    acked: list[int] = []
    with tidal_server("full") as srv:
        for _ in range(ROUNDS):
            runs["none"].append(tidal_bench(srv, 1, 1, n, workload="leave"))
            runs["signals"].append(tidal_bench(srv, 16, 16, signals))
            with consumers(srv.port) as made:
                runs["grouped"].append(tidal_bench(srv, 1, 1, n, workload="leave"))
                runs["signals_grouped"].append(tidal_bench(srv, 16, 16, signals))
                acked.append(sum(m.acked for m in made))
    out: dict[str, Any] = {"requests": n, "signal_requests": signals, "groups": GROUPS,
                           "consumers": CONSUMERS, "runs": runs, "acked": acked}  # fmt: skip
    for name, rs in runs.items():
        out[name] = sorted(rs, key=lambda r: r["p99_ms"])[len(rs) // 2]
    pairs = zip(runs["grouped"], runs["none"], strict=True)
    ratios = sorted(g["p99_ms"] / o["p99_ms"] for g, o in pairs)
    out["p99_ratio"], out["p99_ratio_range"] = ratios[len(ratios) // 2], [ratios[0], ratios[-1]]
    pairs = zip(runs["signals_grouped"], runs["signals"], strict=True)
    cpu = sorted(g["server_cpu_us"] / o["server_cpu_us"] for g, o in pairs)
    out["signal_cpu_ratio"], out["signal_cpu_range"] = cpu[len(cpu) // 2], [cpu[0], cpu[-1]]
    # the server's CPU the groups added per request, over the events acknowledged per request
    rounds = zip(runs["grouped"], runs["none"], acked, strict=True)
    per = sorted((g["server_cpu_us"] - o["server_cpu_us"]) * n / a for g, o, a in rounds if a)
    out["cpu_us_per_ack"] = per[len(per) // 2]
    return out


def group_report(groups: dict[str, Any] | None) -> list[str]:
    if not groups:
        return []
    grouped = f"{groups['groups']} groups of {groups['consumers']}"
    rows = [
        ("leaves, no group", groups["none"]),
        (f"leaves, {grouped}", groups["grouped"]),
        ("signals, no group", groups["signals"]),
        (f"signals, {grouped}", groups["signals_grouped"]),
    ]
    return [
        "",
        "## Consumer groups",
        "",
        f"{groups['requests']:,} leaves and rejoins (`--workload leave`, one client, one at a"
        f" time), then {groups['signal_requests']:,} signals (16 clients, 16 deep), on one"
        f" server with no group, then with {grouped} consumers each acknowledging every"
        " event as it comes (`bench/groups.py`, on a thread of the driver: this machine's"
        " two cores are shared with them), rounds alternating; the median round of each."
        " Each event is sent once per group (its count written in the commit that records"
        " it) and acknowledged (a request, and a write in a later group commit): the server"
        f" spent {groups['cpu_us_per_ack']:.0f} µs of CPU per event acknowledged, sending"
        " and acknowledgement together. One leave at a time is the worst case for it: each"
        " leave waits while the loop reads the ten acknowledgements of the one before and"
        " pushes its own ten events; the acknowledgements wait up to 2 ms for the next leave"
        " and ride in its commit (`engine/linger.py`), rather than make one of their own"
        f" before it. The p99 of a leave with the groups is {groups['p99_ratio']:.1f}x"
        f" ({groups['p99_ratio_range'][0]:.1f}-{groups['p99_ratio_range'][1]:.1f}x over the"
        " rounds) of one with none. Signals are not events: their CPU with the groups"
        f" present is {groups['signal_cpu_ratio']:.2f}x of without.",
        "",
        "| | requests/s | p50 ms | p99 ms | server CPU µs/request |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {r['requests_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f}"
            f" | {r['server_cpu_us']:.0f} |"
            for name, r in rows
        ),
    ]
