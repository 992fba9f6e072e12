"""Issue 9's attacks with legal or nearly legal traffic: each costs the server a bounded
amount of memory (read from /proc) and loop time (seen by an honest client beside it)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import msgpack

from tidal.client import Client

from .conftest import ServerProcess
from .rawrpc import RawPeer
from .test_hostile import rss_kib

MIB = 1024


async def pings_while(port: int, work: asyncio.Future[Any]) -> float:
    """The longest ping an honest client waited while ``work`` ran."""
    async with await Client.connect("127.0.0.1", port, timeout=60) as honest:
        longest = 0.0
        while not work.done():
            began = time.perf_counter()
            assert await honest.ping() == "pong"
            longest = max(longest, time.perf_counter() - began)
        return longest


async def test_array_headers_before_auth_hold_no_memory(db_path: Path) -> None:
    """Before: 100 connections of 1,008 bytes of array headers held 1.3 GB."""
    proc = await ServerProcess(db_path, "--token", "a-token-of-16-chars").start()
    assert proc.proc is not None
    try:
        before = rss_kib(proc.proc.pid)
        writers = []
        for _ in range(50):
            _, writer = await asyncio.open_connection("127.0.0.1", proc.port)
            writer.write(b"\xdd\x00\x00\x3e\x80" * 200)
            writers.append(writer)
        for writer in writers:
            await writer.drain()
        async with await proc.connect_with(token="a-token-of-16-chars") as honest:
            assert await honest.ping() == "pong"  # every header was read by now
        grown = rss_kib(proc.proc.pid) - before
        assert grown < 32 * MIB, f"50 connections of 1 KB of headers cost {grown} KiB"
        for writer in writers:
            writer.close()
    finally:
        await proc.stop()


async def test_auth_pipelined_with_a_larger_request_is_answered(db_path: Path) -> None:
    """Pre-auth bytes are counted per message: before, the segment was, and both were lost."""
    proc = await ServerProcess(db_path, "--token", "a-token-of-16-chars").start()
    try:
        peer = await RawPeer.open(("127.0.0.1", proc.port))
        batch = [[i, "e", "view"] for i in range(300)]
        peer.writer.write(
            msgpack.packb([0, 1, "auth", ["a-token-of-16-chars"]])
            + msgpack.packb([0, 2, "signal_batch", [batch]])
        )
        assert await peer.receive() == [1, 1, None, True]
        reply = await peer.receive()
        assert reply is not None and reply[2] is None and len(reply[3]) == 300
        peer.writer.close()
    finally:
        await proc.stop()


async def test_a_stalled_partial_message_is_closed_after_the_message_timeout(
    db_path: Path,
) -> None:
    """Before: 20 almost-whole 4 MB messages pinned 212 MB until the 300 s idle timeout."""
    proc = await ServerProcess(db_path, "--message-timeout", "1").start()
    try:
        peer = await RawPeer.open(("127.0.0.1", proc.port))
        whole = msgpack.packb([0, 1, "signal_batch", [[[i, "e" * 200, "v"] for i in range(9000)]]])
        peer.writer.write(whole[:-1])
        began = time.monotonic()
        with contextlib.suppress(ConnectionError):
            assert await peer.receive(timeout=10) is None
        assert time.monotonic() - began < 5
        assert any(b"is not whole after 1.0s" in line for line in proc.log)
    finally:
        await proc.stop()


async def test_a_header_that_cannot_fit_is_answered_and_closed_at_once(db_path: Path) -> None:
    """Before: an array header of 2**32-1 elements was held for --message-timeout (30 s),
    as a message that might still come whole."""
    proc = await ServerProcess(db_path).start()  # --message-timeout: its default, 30 s
    try:
        for header in (b"\xdd\xff\xff\xff\xff", b"\xdb" + (9 << 20).to_bytes(4, "big")):
            peer = await RawPeer.open(("127.0.0.1", proc.port))
            peer.send_raw(b"\x94\x00\x07\xa6signal\x93\x01\xa1e" + header)
            began = time.monotonic()
            reply = await peer.receive(timeout=10)
            assert reply[:2] == [1, 7], reply
            assert reply[2][0] == 3, reply  # too large
            assert "the limit is 8388608 bytes" in reply[2][1], reply
            assert await peer.closed(timeout=10)
            assert time.monotonic() - began < 5
        async with await proc.connect() as honest:  # and nobody else noticed
            assert await honest.ping() == "pong"
    finally:
        await proc.stop()


async def test_near_miss_cohorts_do_not_freeze_the_loop(db_path: Path) -> None:
    """Before: with 1,000 cohorts of 64 attributes that nearly match, each signal took
    6.5 ms and one batch froze every client; now matching is bit-parallel, and a request
    carries at most 50,000 attributes."""
    proc = await ServerProcess(db_path).start()
    try:
        peer = await RawPeer.open(("127.0.0.1", proc.port))
        attrs = {f"a{i}": "x" for i in range(64)}
        for c in range(1000):
            predicate: dict[str, Any] = dict(attrs)
            predicate[f"a{c % 64}"] = ["y", f"z{c}"]  # all but one attribute match
            peer.writer.write(msgpack.packb([0, c, "define_cohort", [f"c{c}", predicate]]))
        for _ in range(1000):
            assert (await peer.receive())[2] is None
        batch = [[i, f"e{i % 10}", "view", 1.0, {"attrs": attrs}] for i in range(780)]
        work = asyncio.ensure_future(peer.call("signal_batch", batch, msgid=5000))
        longest = await pings_while(proc.port, work)
        reply = work.result()
        assert reply[2] is None and not any(ack["forwarded"] is not True for ack in reply[3]), (
            reply[2]
        )
        assert longest < 0.5, f"an honest ping waited {longest:.3f} s"
        async with await proc.connect() as check:
            assert (await check.counts("e1")).cohorts == {}  # near misses match nothing
        too_many = [[i, "e", "view", 1.0, {"attrs": attrs}] for i in range(800)]
        error = (await peer.call("signal_batch", too_many, msgid=5001))[2]
        assert error[0] == -32602 and "at most 50000 attributes" in error[1], error
        peer.writer.close()
    finally:
        await proc.stop()


async def test_a_client_that_reads_everything_gets_every_acknowledgement(db_path: Path) -> None:
    """Before: 150 pipelined batches of 10,000 from a client reading all the while got 22
    replies, then the server called it a slow reader and dropped it (here the output limit
    is 1 MiB, so that a few batches' replies in one commit pass it)."""
    proc = await ServerProcess(db_path, "--max-output-buffer", str(1 << 20)).start()
    assert proc.proc is not None
    try:
        peer = await RawPeer.open(("127.0.0.1", proc.port))
        request = msgpack.packb(
            [0, 0, "signal_batch", [[[i, f"e{i % 1000}", "v"] for i in range(10_000)]]]
        )
        count = 40
        peak = 0

        async def send() -> None:
            for _ in range(count):
                peer.writer.write(request)
                await peer.writer.drain()

        sender = asyncio.ensure_future(send())
        acks = 0
        while acks < count:
            reply = await peer.receive(timeout=60)
            assert reply is not None, f"disconnected after {acks} of {count} replies"
            assert reply[2] is None and len(reply[3]) == 10_000
            acks += 1
            assert proc.proc is not None
            peak = max(peak, rss_kib(proc.proc.pid))
        await sender
        assert peak < 600 * MIB, f"RSS peaked at {peak} KiB"
        async with await proc.connect() as check:
            assert (await check.stats())["signals"] == count * 10_000
        peer.writer.close()
    finally:
        await proc.stop()


async def test_notifications_count_in_flight(db_path: Path) -> None:
    """Before: four clients sending signal_batch notifications grew RSS by 530 MB in 12 s,
    and a status read got no answer in 15 s."""
    proc = await ServerProcess(db_path).start()
    assert proc.proc is not None
    try:
        before = rss_kib(proc.proc.pid)
        notification = msgpack.packb(
            [2, "signal_batch", [[[i, f"e{i % 1000}", "v"] for i in range(10_000)]]]
        )
        stop = asyncio.Event()

        async def flood() -> None:
            _, writer = await asyncio.open_connection("127.0.0.1", proc.port)
            with contextlib.suppress(ConnectionError):
                while not stop.is_set():
                    writer.write(notification)
                    await writer.drain()
            writer.close()

        floods = [asyncio.ensure_future(flood()) for _ in range(3)]
        async with await proc.connect() as honest:
            for _ in range(5):
                began = time.perf_counter()
                await asyncio.wait_for(honest.status(7), 10)
                assert time.perf_counter() - began < 5
            grown = rss_kib(proc.proc.pid) - before
        stop.set()
        await asyncio.gather(*floods)
        assert grown < 300 * MIB, f"RSS grew {grown} KiB under the flood"
    finally:
        await proc.stop()


async def test_a_busy_entity_is_read_in_pages_that_fit_a_message(db_path: Path) -> None:
    """Before: counts of an entity with 384,000 community tallies was over 16 MiB and its
    reader was dropped; a cohorts list of 12 MB was sent over the 8 MiB limit."""
    proc = await ServerProcess(db_path).start()
    try:
        peer = await RawPeer.open(("127.0.0.1", proc.port))
        pad = "x" * 30
        for r in range(3):
            batch = [
                [i, "hot", "view", 1.0, {"communities": [f"{pad}-{r}-{i}-{j}" for j in range(64)]}]
                for i in range(2000)
            ]
            assert (await peer.call("signal_batch", batch, msgid=r))[2] is None
        reply = await peer.call("counts", "hot", msgid=10)
        assert reply[2] is None
        page = reply[3]
        assert 0 < len(page["communities"]) < 384_000 and "more" in page
        assert len(msgpack.packb(reply)) <= 8 * 1024 * 1024
        # the first define commits with the checkpoint of 384,000 aggregates and their
        # buckets (about 15 s here): the wait is the writer's, not the paging's
        async with await proc.connect_with(timeout=120) as client:
            counts = await client.counts("hot")
            assert len(counts.communities) == 3 * 2000 * 64
            assert counts.ledger["view"].count == 6000
            assert all(t["view"].count == 1 for t in counts.communities.values())
            for c in range(200):
                values = [f"{c}-{v}-{pad}{pad}" for v in range(15)]
                predicate = {f"a{i}": [f"{i}{value}" for value in values] for i in range(60)}
                assert await client.define_cohort(f"cohort-{c}", predicate)
            error = (await peer.call("cohorts", msgid=11))[2]
            assert error[0] == -32602 and "read them in pages" in error[1], error
            cohorts = await client.cohorts()
            assert len(cohorts) == 200 and len(cohorts["cohort-7"]) == 60
        peer.writer.close()
    finally:
        await proc.stop()


async def test_fan_out_is_bounded_per_request_and_checkpointed_by_size(db_path: Path) -> None:
    """Before: with 1,000 cohorts {} defined, 3 requests of 0.3 MB added 572 MB of RSS (the
    board, which ranks from memory, now keeps 1.5 M aggregates in about 900 MB)."""
    proc = await ServerProcess(db_path).start()
    assert proc.proc is not None
    try:
        peer = await RawPeer.open(("127.0.0.1", proc.port))
        for c in range(1000):
            peer.writer.write(msgpack.packb([0, c, "define_cohort", [f"all{c}", {}]]))
        for _ in range(1000):
            assert (await peer.receive())[2] is None
        before = rss_kib(proc.proc.pid)
        for r in range(6):
            batch = [
                [i, f"e{r}-{i}", "v", 1.0, {"communities": [f"c{j}" for j in range(64)]}]
                for i in range(230)
            ]
            # each after the first commits with the checkpoint of the 245,000 aggregates of
            # the one before, and their buckets (a fraction of a second: docs/DESIGN.md)
            peer.send([0, 5000 + r, "signal_batch", [batch]])
            reply = await peer.receive(timeout=120)
            assert reply[2] is None, reply[2]
        grown = rss_kib(proc.proc.pid) - before
        # the board keeps every aggregate (about 660 bytes each, its windows and its
        # decayed sum included: docs/DESIGN.md), and is checkpointed by size
        assert grown < 1200 * MIB, f"1.5 M tallies cost {grown} KiB"
        batch = [[i, "e", "v", 1.0, {"communities": ["c"]}] for i in range(300)]
        error = (await peer.call("signal_batch", batch, msgid=6000))[2]
        assert error[0] == -32602 and "at most 250000 per request" in error[1], error
        peer.writer.close()
    finally:
        await proc.stop()


async def test_a_message_of_millions_of_empty_arrays_is_decoded_in_slices(db_path: Path) -> None:
    """Before: 8 MiB of empty arrays was decoded, and freed, in one go (the GC running
    again and again over what was built): an honest ping waited 4.1 s."""
    proc = await ServerProcess(db_path).start()
    try:
        count = (8 << 20) - 64
        message = b"\x94\x00\x01\xa4ping\x91\xdd" + count.to_bytes(4, "big") + b"\x90" * count
        peer = await RawPeer.open(("127.0.0.1", proc.port))

        async def attack() -> Any:
            peer.send_raw(message)
            return await peer.receive(timeout=60)

        work = asyncio.ensure_future(attack())
        longest = await pings_while(proc.port, work)
        error = work.result()[2]
        assert error[0] == -32602 and "ping takes 0 params" in error[1], error
        assert longest < 1.5, f"an honest ping waited {longest:.3f} s"
        peer.close()
    finally:
        await proc.stop()
