"""Accepted means storable, on both backends: arbitrary values over a raw socket to a real
server, each refused at the edge with -32602 or committed, checkpointed, restarted and read
back equal. The signal path's inline checks are only a pre-filter; this sends what they
could miss (NUL, unusual Unicode, bin strings, the longest names, int64 and u64 edges,
-0.0 and denormals, predicates at their bounds)."""

from __future__ import annotations

import asyncio
import math
from collections import defaultdict
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidal.client import Client, Signal
from tidal.protocol import ErrorCode
from tidal.protocol.limits import ENTITY_MAX_BYTES, KIND_MAX_BYTES, NAME_MAX_BYTES
from tidal.testing.postgres import Cluster

from .conftest import Database, ServerProcess
from .rawrpc import RawPeer

EDGE_TEXT = [
    "x" * ENTITY_MAX_BYTES,
    "é" * (NAME_MAX_BYTES // 2),
    "é" * 65,
    "😀" * 16,
    "k" * KIND_MAX_BYTES,
]
TEXT = st.one_of(
    st.text(max_size=12),
    st.text(st.characters(codec="utf-8"), max_size=6),
    st.sampled_from(["\x00", "a\x00b", "\u2028", "\ufeff", "é", "\U0010ffff", *EDGE_TEXT]),
    st.binary(max_size=8),  # bin strings: UTF-8 or not
)
INTS = st.one_of(
    st.sampled_from([0, -1, 2**63 - 1, -(2**63), 2**63, 2**64 - 1]),
    st.integers(-(2**63), 2**64 - 1),
)
FLOATS = st.one_of(
    st.sampled_from([-0.0, 5e-324, 2.2250738585072014e-308, 1e12, -1e12]), st.floats()
)
SCALARS = st.one_of(TEXT, INTS, FLOATS, st.booleans())
SIGNALS = st.tuples(
    st.integers(0, 2**64 - 1),
    TEXT,
    TEXT,
    st.one_of(FLOATS, INTS),
    st.fixed_dictionaries(
        {},
        optional={
            "communities": st.lists(TEXT, max_size=3),
            "attrs": st.dictionaries(TEXT, SCALARS, max_size=3),
            "id": TEXT,
        },
    ),
)
COHORTS = st.tuples(
    TEXT,
    st.dictionaries(
        TEXT, st.one_of(SCALARS, st.lists(SCALARS, min_size=1, max_size=3)), max_size=3
    ),
)


def as_text(value: str | bytes) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else value


class Expected:
    """What the accepted signals add up to: entity -> (layer, name, kind) -> [count, weight]."""

    def __init__(self) -> None:
        self.counts: dict[str, dict[tuple[str, str, str], list[Any]]] = defaultdict(dict)
        self.cohorts: dict[str, Any] = {}

    def add(self, signal: tuple[Any, ...]) -> None:
        _, entity, kind, weight, context = signal
        slots = [("ledger", "", as_text(kind))]
        names = dict.fromkeys(as_text(c) for c in context.get("communities", ()))
        slots += [("community", name, as_text(kind)) for name in names]
        mine = self.counts[as_text(entity)]
        for slot in slots:
            tally = mine.setdefault(slot, [0, 0.0])
            tally[0] += 1
            tally[1] += float(weight)


async def check(port: int, expected: Expected) -> None:
    peer = await RawPeer.open(("127.0.0.1", port))
    try:
        for entity, slots in expected.counts.items():
            reply = await peer.call("counts", entity)
            assert reply[2] is None, reply
            found = reply[3]
            assert "more" not in found
            got = {("ledger", "", k): v for k, v in found["ledger"].items()}
            for name, kinds in found["communities"].items():
                got.update({("community", name, k): v for k, v in kinds.items()})
            assert set(got) == set(slots), (entity, got, slots)
            for slot, (count, weight) in slots.items():
                assert got[slot]["count"] == count, (entity, slot)
                assert math.isclose(got[slot]["weight"], weight, rel_tol=1e-9, abs_tol=1e-9)
        listed = await peer.call("cohorts")
        assert listed[2] is None and listed[3] == expected.cohorts, listed
        health = await peer.call("health")
        assert health[3]["status"] == "ok", health
    finally:
        peer.close()


async def scenario(target: str, cohorts: list[Any], signals: list[Any]) -> None:
    expected = Expected()
    process = await ServerProcess(target, "--checkpoint-signals", "4").start()
    try:
        peer = await RawPeer.open(("127.0.0.1", process.port))
        try:
            for name, predicate in cohorts:
                reply = await peer.call("define_cohort", name, predicate)
                if reply[2] is not None:
                    assert reply[2][0] == ErrorCode.INVALID_PARAMS, reply
                else:  # defined, or redefined
                    expected.cohorts[as_text(name)] = plain(predicate)
            seqs: set[int] = set()
            for signal in signals:
                reply = await peer.call("signal", *signal)
                if reply[2] is not None:
                    assert reply[2][0] == ErrorCode.INVALID_PARAMS, (signal, reply)
                elif reply[3]["seq"] not in seqs:  # else a retry of a key: counted once
                    seqs.add(reply[3]["seq"])
                    expected.add(signal)
        finally:
            peer.close()
        await check(process.port, expected)
        assert await process.stop() == 0  # the last checkpoint commits
        await process.start()  # and boot reads it all back
        await check(process.port, expected)
        assert await process.stop() == 0
    finally:
        if process.proc is not None and process.proc.returncode is None:
            await process.kill9()


def plain(value: Any) -> Any:
    """A value as the server keeps it: bin strings as the text they hold."""
    if isinstance(value, dict):
        return {as_text(k): plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return as_text(value) if isinstance(value, bytes) else value


@pytest.mark.timeout(600)
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@given(cohorts=st.lists(COHORTS, max_size=3), signals=st.lists(SIGNALS, min_size=1, max_size=12))
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
def test_what_the_edge_accepts_every_backend_stores(
    backend: str,
    pg_cluster: Cluster,
    tmp_path_factory: pytest.TempPathFactory,
    cohorts: list[Any],
    signals: list[Any],
) -> None:
    if backend == "sqlite":
        target = str(tmp_path_factory.mktemp("storable") / "t.db")
        asyncio.run(scenario(target, cohorts, signals))
        return
    name = asyncio.run(pg_cluster.create())
    try:
        asyncio.run(scenario(pg_cluster.url(name), cohorts, signals))
    finally:
        asyncio.run(pg_cluster.drop(name))


@pytest.mark.both_backends
async def test_a_ledger_row_holds_what_its_signal_said(client: Client, database: Database) -> None:
    """The signal path hands the writer only values SQLite binds without adapting (0 or 1
    for forwarded, -1 for no at_ns, a bytearray context): the file still holds NULL for an
    at_ns not given, 0 for one given as 0, and the context as MessagePack bytes."""
    await client.leave(2)
    a = await client.signal(1, "row", "view")
    b = await client.signal(2, "row", "view", communities=["c"], at_ns=1_700_000_000 * 10**9)
    c, d = await client.signal_batch(
        [Signal(1, "row", "like", attrs={"k": "v"}, at_ns=0), Signal(2, "row", "like")]
    )
    rows = await database.rows("SELECT seq, forwarded, context, at_ns FROM ledger ORDER BY seq")
    assert [(seq, int(fwd), ctx and bytes(ctx), at) for seq, fwd, ctx, at in rows] == [
        (a.seq, 1, None, None),
        (b.seq, 0, msgpack.packb([["c"], {}, []]), 1_700_000_000 * 10**9),
        (c.seq, 1, msgpack.packb([[], {"k": "v"}, []]), 0),
        (d.seq, 0, None, None),
    ]
