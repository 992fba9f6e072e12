"""``tidal bench``: the load generator make bench races tidal and Redis with."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tidal.cli import httpwire, resp
from tidal.cli.bench import run
from tidal.cli.workload import BenchConfig
from tidal.client import Client, Signal
from tidal.server import Config, Server

BARE = Path(__file__).resolve().parent.parent / "bench" / "bare_server.py"


async def test_bench_drives_a_server_and_reads_its_cpu(server: Server) -> None:
    host, port = server.address
    # enough load for /proc's clock ticks (10 ms): 400 signals took 12 ms, and read 0 ticks
    cfg = BenchConfig(
        host=host, port=port, clients=4, pipeline=8, requests=8000, server_pid=os.getpid()
    )
    result = await run(cfg)
    assert (result.signals, result.errors) == (8000, 0)
    assert result.p50_ms > 0 and result.server_cpu_us is not None and result.server_cpu_us > 0
    async with await Client.connect(host, port) as client:
        assert (await client.stats())["signals"] == 8000


async def test_bench_drives_the_bare_stack_make_bench_compares_against() -> None:
    """``bench/bare_server.py``, the floor every table of make bench is measured against,
    answers the set-up's reads as an empty tidal would: once bench read the cohorts first,
    the bare stack answered that read like a signal, and make bench stopped at its first
    run."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(BARE), "--port", "0", stderr=asyncio.subprocess.PIPE
    )
    try:
        assert proc.stderr is not None
        line = (await proc.stderr.readline()).decode()
        assert line.startswith("listening on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        for cfg, signals in (
            (BenchConfig(requests=2000), 2000),
            (BenchConfig(requests=8, workload="batch"), 8000),
        ):
            cfg = dataclasses.replace(
                cfg, port=port, clients=2, pipeline=4, allow_data=True, keep=True,
                server_pid=proc.pid,
            )  # fmt: skip
            result = await run(cfg)
            assert (result.signals, result.errors) == (signals, 0), cfg.workload
    finally:
        proc.kill()
        await proc.wait()


async def test_bench_drives_the_http_edge_with_the_same_requests(tmp_path: Path) -> None:
    """``--http-port``: the same signals as JSON over keep-alive HTTP, pipelined; the
    set-up (the Left users, the cohort) through MessagePack."""
    server = Server(Config(port=0, db=str(tmp_path / "t.db"), http="127.0.0.1:0"))
    await server.start()
    try:
        host, port = server.address
        cfg = BenchConfig(
            host=host, port=port, http_port=server.http_address[1], clients=4, pipeline=8,
            requests=4000, users=1000, left_fraction=0.5, server_pid=os.getpid(),
        )  # fmt: skip
        result = await run(cfg)
        assert (result.signals, result.errors) == (4000, 0)
        async with await Client.connect(host, port) as client:
            stats = await client.stats()
        assert stats["signals"] == 4000 and 0 < stats["gated"] < 4000  # the Left half gated
    finally:
        await server.shutdown()


def test_http_replies_are_counted_in_order_however_they_are_cut() -> None:
    ok = b'HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n{"result":1}'
    bad = b'HTTP/1.1 400 Bad Request\r\ncontent-length: 11\r\n\r\n{"error":1}'
    stream = ok + bad + ok
    for cut in range(1, len(stream)):
        replies = httpwire.Replies()
        for slot in (3, 1, 2):
            replies.sent(slot, 1)
        answered = replies.feed(stream[:cut]) + replies.feed(stream[cut:])
        assert answered == [(3, None), (1, '{"error":1}'), (2, None)], cut


def test_resp_requests_are_the_same_work_as_tidal_s() -> None:
    signal = [7, "e3", "view", 1.0, {"communities": ["c7"], "attrs": {"country": "JP"}}]
    data, replies = resp.equivalent("abc", "signal", signal)
    assert replies == 1
    # EVALSHA sha 0 user entity community country: signal.lua's ARGV
    args = [b"EVALSHA", b"abc", b"0", b"7", b"e3", b"c7", b"JP"]
    assert data == b"*7\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)
    batch, replies = resp.equivalent("abc", "signal_batch", [[signal] * 3])
    assert (batch, replies) == (data * 3, 3)
    assert resp.equivalent("abc", "leave", [5]) == (resp.command("SADD", "left", "5"), 1)


def test_resp_replies_are_counted_per_request_however_they_are_cut() -> None:
    """Request 0 is four commands, request 1 one: each is answered when all its replies
    are in, in any chunking of the stream; an error reply marks its request."""
    stream = b":1\r\n+OK\r\n$3\r\nabc\r\n*2\r\n:1\r\n$-1\r\n-ERR no script\r\n"
    for cut in range(1, len(stream)):
        replies = resp.Replies()
        replies.sent(0, 4)
        replies.sent(1, 1)
        answered = replies.feed(stream[:cut]) + replies.feed(stream[cut:])
        assert answered == [(0, None), (1, "redis error")], cut


async def test_bench_beside_real_data_changes_nothing_it_did_not_make(server: Server) -> None:
    """200 real users have left; a cohort and signals are there. bench refuses the server
    in one line; told it may run, it uses users, entities and a cohort of its own, and
    once done, every count, Left user and cohort is as before (issue 39, item 6: a run
    rejoined 80 of the 200, and left its cohort and entities behind)."""
    host, port = server.address
    real = range(1, 201)
    async with await Client.connect(host, port) as c:
        await c.define_cohort("de", {"country": "DE"})
        await c.signal_batch([Signal(u, "real", "view", attrs={"country": "DE"}) for u in real])
        await asyncio.gather(*(c.leave(u) for u in real))

        async def state() -> tuple[Any, ...]:
            top = await c.top("ledger", None, "view", limit=100)
            return (
                (await c.stats())["ledger_rows"],
                (await c.left_users()).users,
                await c.cohorts(),
                await c.counts("real"),
                [(r.entity, r.count) for r in top.entities],
            )

        before = await state()
        assert len(before[1]) == 200

        def bench(*extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "tidal.cli", "bench", "--port", str(port), "--workload",
                 "mixed", "--users", "200", "-n", "4000", "-c", "2", "-P", "4", *extra],
                capture_output=True, text=True, check=False, timeout=300,
            )  # fmt: skip

        refused = await asyncio.to_thread(bench)
        assert refused.returncode == 2 and refused.stdout == "", refused
        assert refused.stderr.startswith("tidal bench: the server holds data (")
        assert refused.stderr.count("\n") == 1 and "--allow-data" in refused.stderr
        assert await state() == before

        done = await asyncio.to_thread(bench, "--allow-data", "--left-fraction", "0.2")
        assert done.returncode == 0, done.stderr
        assert "erased and rejoined its" in done.stderr and "dropped cohort bench-de" in done.stderr
        assert await state() == before
        assert (await c.stats())["signals"] > 200  # it did run


async def test_a_batch_run_counts_signals_by_default_and_refuses_what_will_not_fit(
    server: Server,
) -> None:
    """A batch run's default is 100,000 signals, not 100,000 batches (100 million
    signals, encoded for minutes before its clock started); a run too big to encode is
    refused in one line before it connects, and its clean-up is quick (issue 55: one of
    ~92,000 users took 4 min 25 s, each erasure's chunk scanning every queued one)."""
    host, port = server.address

    def bench(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tidal.cli", "bench", "--port", str(port), "--workload",
             "batch", "--json", *extra],
            capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip

    refused = await asyncio.to_thread(bench, "-n", "20000")
    assert refused.returncode == 2 and refused.stdout == "", refused
    assert refused.stderr == (
        "tidal bench: requests: 20,000 requests of batch are 20,000,000 signals, all encoded"
        " before the clock starts; at most 10,000,000\n"
    )
    done = await asyncio.to_thread(
        bench, "-c", "4", "-P", "4", "--batch-size", "5000", "--users", "2000"
    )
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    assert (measured["requests"], measured["signals"], measured["errors"]) == (20, 100_000, 0)
    assert "erased and rejoined its" in done.stderr
    async with await Client.connect(host, port) as c:
        stats = await c.stats()
    assert stats["signals"] == 100_000 and stats["ledger_rows"] == 0  # all of it erased
