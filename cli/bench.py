"""``tidal bench``: a load generator in the manner of redis-benchmark.

It must not be what it measures, so every request is encoded before the clock
starts, replies are only counted and timed (never turned into objects), and
each connection keeps exactly ``pipeline`` requests in flight: a reply frees
its slot, and the slot's next request goes out in the same write as the others
freed by that chunk of input.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import random
import signal
import sys
import time
from collections.abc import Callable
from typing import Any

import msgpack

from . import httpwire
from . import resp as resp_wire
from .cleanup import Made, clean_up
from .pipeline import Load
from .results import BenchResult, result_of
from .workload import (
    BATCHES,
    COHORT,
    USER_BASE,
    WORKLOADS,
    BenchConfig,
    made,
    requests,
    too_many,
)


async def _setup(cfg: BenchConfig) -> tuple[BenchConfig, bool]:
    """A cohort to match, and the users who have left, before the clock starts; whether
    it defined the cohort (its clean-up drops it then, and only then).

    Its users USER_BASE + 0..users*left_fraction leave; that makes exactly that fraction
    of the signals gated. With ``own_users``, the partitions the node serves, from its
    ``partition_map``. A server that holds data is refused unless ``allow_data``.
    """
    from tidal.client import Client

    left = int(cfg.users * cfg.left_fraction)
    mine = range(USER_BASE, USER_BASE + left)
    if cfg.redis_sha is not None:
        if left:
            await resp_wire.add_to_set(cfg.host, cfg.port, "left", mine)
        return cfg, False  # signal.lua knows its one cohort
    async with await Client.connect(cfg.host, cfg.port, timeout=300, token=cfg.token) as client:
        cohorts = await client.cohorts()
        if not cfg.allow_data:
            held = _held((await client.stats())["ledger_rows"], await client.left_users(limit=1),
                         cohorts)  # fmt: skip
            if held:
                raise ValueError(
                    f"the server holds data ({held}): run bench against an empty database, or"
                    " pass --allow-data (bench then uses users, entities and a cohort of its"
                    " own, and removes them after)"
                )
        if cfg.own_users:
            served = await client.call("partition_map")
            parts = {p for p, (node, _) in enumerate(served["owners"]) if node == served["node"]}
            if not parts:
                raise ValueError("--own-users: the node serves no partition (is it a cluster's?)")
            cfg = dataclasses.replace(cfg, only=(frozenset(parts), served["partitions"]))
        defined = COHORT not in cohorts
        if defined:
            await client.define_cohort(COHORT, {"country": "DE"})
        for start in range(0, left, 1000):
            await asyncio.gather(*(client.leave(u) for u in mine[start : start + 1000]))
    return cfg, defined


def _held(ledger_rows: int, left: Any, cohorts: dict[str, Any]) -> str:
    """What data the server holds, in words; "" if none."""
    held = []
    if ledger_rows:
        held.append(f"{ledger_rows:,} ledger rows")
    if left.users:
        held.append("Left users")
    if cohorts:
        held.append(f"{len(cohorts)} cohorts")
    return ", ".join(held)


async def run(cfg: BenchConfig, progress: Callable[[int, int], None] | None = None) -> BenchResult:
    """A run, then its clean-up (unless ``cfg.keep``)."""
    result, made = await measure(cfg, progress)
    if cfg.redis_sha is None and not cfg.keep:  # after the clock: not measured
        print(f"tidal bench: {await clean_up(cfg, made)}", file=sys.stderr)
    return result


async def measure(
    cfg: BenchConfig, progress: Callable[[int, int], None] | None = None
) -> tuple[BenchResult, Made]:
    """A run: what it measured, and what it made (for ``clean_up``)."""
    if cfg.clients < 1 or cfg.pipeline < 1 or cfg.requests < 1:
        raise ValueError("clients, pipeline and requests must be at least 1")
    if cfg.workload not in WORKLOADS:
        raise ValueError(f"workload: one of {', '.join(WORKLOADS)}")
    if (refused := too_many(cfg)) is not None:
        raise ValueError(refused)
    cfg, cohort = await _setup(cfg)
    users = {USER_BASE + u for u in range(int(cfg.users * cfg.left_fraction))}
    rng = random.Random(cfg.seed)
    loop = asyncio.get_running_loop()
    packer = msgpack.Packer(use_bin_type=True)
    per_client = [cfg.requests // cfg.clients + (i < cfg.requests % cfg.clients)
                  for i in range(cfg.clients)]  # fmt: skip
    conns: list[Load] = []
    latencies: list[float] = []
    finished = asyncio.Event()
    remaining = cfg.clients

    def one_done() -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0:
            finished.set()

    auth = packer.pack([0, -1, "auth", [cfg.token]]) if cfg.token and not cfg.http_port else b""
    sha = cfg.redis_sha
    replies = cfg.batch_size if cfg.workload in BATCHES else 1
    #: per connection, per slot, the users each request in its queue writes for
    writes: list[list[list[list[int]]]] = []
    for count in per_client:
        queues, planned = _encoded(cfg, rng, count, packer)
        writes.append(planned)
        delimited = (
            resp_wire.Replies() if sha is not None
            else httpwire.Replies() if cfg.http_port is not None
            else None
        )  # fmt: skip
        load = functools.partial(Load, queues, latencies, one_done, auth, delimited, replies)
        _, conn = await loop.create_connection(load, cfg.host, cfg.http_port or cfg.port)
        conns.append(conn)
    cpu_before = _cpu_seconds(cfg.server_pid)
    began = time.perf_counter()
    for conn in conns:
        conn.start()
    reporter = asyncio.create_task(_report(conns, cfg.requests, progress)) if progress else None
    interrupted = await _until(finished)
    seconds = time.perf_counter() - began
    cpu = _cpu_seconds(cfg.server_pid) - cpu_before
    answered = sum(c.answered for c in conns) if interrupted else cfg.requests
    if reporter is not None:
        reporter.cancel()
        progress(answered, cfg.requests)  # type: ignore[misc]
    for conn in conns:
        conn.transport.close()
    lost = [c.lost for c in conns if c.lost is not None]
    if lost and not interrupted:
        raise ConnectionError(f"{len(lost)} connections lost during the run: {lost[0]}")
    users.update(_written(conns, writes))
    result = result_of(cfg, conns, latencies, answered, seconds, cpu, interrupted)
    return result, Made(frozenset(users), cohort)


def _written(conns: list[Load], writes: list[list[list[list[int]]]]) -> set[int]:
    """The users the requests sent wrote for: not those planned, which an interrupted
    run did not all send."""
    users: set[int] = set()
    for conn, slots in zip(conns, writes, strict=True):
        for slot, planned in enumerate(slots):
            for written in planned[: len(planned) - len(conn.queues[slot])]:
                users.update(written)
    return users


def _encoded(
    cfg: BenchConfig, rng: random.Random, count: int, packer: msgpack.Packer
) -> tuple[list[list[bytes]], list[list[list[int]]]]:
    """One connection's ``count`` requests, encoded before the clock starts: a queue per
    pipeline slot; and, per slot, the users each request writes for (``clean_up``)."""
    sha = cfg.redis_sha
    queues: list[list[bytes]] = [[] for _ in range(cfg.pipeline)]
    writes: list[list[list[int]]] = [[] for _ in range(cfg.pipeline)]
    for i, (method, params) in enumerate(requests(cfg, rng, count)):
        slot = i % cfg.pipeline
        writes[slot].append(made(method, params))
        if sha is not None:
            queues[slot].append(resp_wire.equivalent(sha, method, params)[0])
        elif cfg.http_port is not None:
            queues[slot].append(httpwire.request(method, params, cfg.host, cfg.token))
        else:
            queues[slot].append(packer.pack([0, slot, method, params]))
    return queues, writes


async def _until(finished: asyncio.Event) -> bool:
    """Waits for the run to finish; True if Ctrl-C (SIGINT) stopped it first: what was
    measured until then is reported, not a traceback."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    try:
        loop.add_signal_handler(signal.SIGINT, stop.set)
    except (NotImplementedError, RuntimeError):  # no signals here (not the main thread)
        await finished.wait()
        return False
    waits = [asyncio.ensure_future(finished.wait()), asyncio.ensure_future(stop.wait())]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()
        loop.remove_signal_handler(signal.SIGINT)
    return not finished.is_set()


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of process ``pid`` (all its threads), from /proc (Linux)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _report(conns: list[Load], total: int, progress: Callable[[int, int], None]) -> None:
    while True:
        progress(sum(c.answered for c in conns), total)
        await asyncio.sleep(0.2)  # a display refresh, not synchronisation
