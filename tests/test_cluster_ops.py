"""Cluster mode as an operator runs it: a rolling restart and a node leaving for good under
load, and ``tidal cluster status`` read from the database the nodes share, while they serve
and after one is killed. Real processes, a real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import pytest

from tidal.client import ClusterClient

from .conftest import Database, ServerProcess
from .test_cluster import PARTITIONS, Load, Nodes

pytestmark = [pytest.mark.parametrize("backend", ["postgresql"]), pytest.mark.timeout(180)]


@pytest.fixture
async def cluster(database: Database) -> Any:
    nodes = Nodes(database)
    yield nodes
    await nodes.stop()


async def status(database: Database, *extra: str) -> tuple[int, str, str]:
    """``tidal cluster status``: its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidal.cli", "cluster", "status", "--db", database.target, *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return await proc.wait(), out.decode(), err.decode()


async def as_json(database: Database) -> tuple[int, dict[str, Any]]:
    code, out, err = await status(database, "--json")
    assert err == "", err
    return code, json.loads(out)


async def test_cluster_status_shows_nodes_partitions_lag_and_a_dead_node(
    cluster: Nodes, database: Database
) -> None:
    nodes = cluster
    a, b = await nodes.serving(2)
    async with await ClusterClient.connect("127.0.0.1", a.port, timeout=10) as c:
        for u in range(40):
            await c.signal(u, "e", "view")
    code, found = await as_json(database)
    assert code == 0
    assert found["partitions"] == PARTITIONS and found["unserved"] == 0
    assert found["head"] > 0 and found["log_rows"] >= 1
    by_node = {n["node"]: n for n in found["nodes"]}
    assert set(by_node) == {nodes.address(a), nodes.address(b)}
    assert all(n["live"] for n in by_node.values())
    assert sorted(n["partitions"] for n in by_node.values()) == [PARTITIONS // 2] * 2
    assert all(n["epochs"][0] >= 1 for n in by_node.values())
    assert all(n["applied"] <= found["head"] for n in by_node.values())

    code, text, _ = await status(database)  # readable: a line per node
    assert code == 0
    assert f"cluster test: {PARTITIONS} partitions, 2 nodes (2 live)" in text
    assert any(line.startswith(nodes.address(a)) and " yes " in line for line in text.splitlines())

    await b.kill9()
    await nodes.settled([a])  # its partitions taken over by a
    code, found = await as_json(database)
    by_node = {n["node"]: n for n in found["nodes"]}
    assert code == 0 and found["unserved"] == 0
    assert by_node[nodes.address(b)]["live"] is False
    assert by_node[nodes.address(b)]["partitions"] == 0
    assert by_node[nodes.address(a)]["partitions"] == PARTITIONS

    await a.kill9()  # no node left: every partition unserved, and the exit status says so
    for _ in range(100):  # until PostgreSQL has ended its session (at once, as a rule)
        code, text, _ = await status(database)
        if code != 0:
            break
    assert code == 1, text
    assert f"{PARTITIONS} partitions have no live node" in text


async def test_cluster_status_of_no_cluster_or_no_database_is_one_line(
    database: Database, tmp_path: Any
) -> None:
    code, _, err = await status(database)  # the test's database: no node has made a cluster
    assert (code, err.strip()) == (2, "tidal cluster status: the database holds no cluster")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidal.cli", "cluster", "status",
        "--db", "postgresql://nobody@127.0.0.1:1/none",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    _, err_bytes = await proc.communicate()
    lines = err_bytes.decode().strip().splitlines()
    assert await proc.wait() == 2 and len(lines) == 1, lines
    assert "cannot connect" in lines[0] and "Traceback" not in lines[0]


async def test_a_rolling_restart_then_a_node_leaving_loses_nothing_acknowledged(
    cluster: Nodes, database: Database
) -> None:
    nodes = cluster
    """What docs/SCALING.md tells operators to do: restart one node at a time, each with its
    own address (SIGTERM, then the same command), waiting for ``cluster status`` to show
    every partition served before the next; to take a node away for good, SIGTERM it. Four
    routing clients write throughout, and every acknowledged signal and leave is checked."""
    serving = await nodes.serving(3)
    load = await Load.on(serving)
    await load.more(200)
    for node in serving:
        await node.stop()  # SIGTERM: it commits what it read, then lets its partitions go
        await node.start()
        await nodes.settled(serving)
        code, found = await as_json(database)
        assert code == 0 and found["unserved"] == 0, found
        await load.more(200)  # writes go on between restarts, through every node
    gone = serving.pop()
    await gone.stop()
    await nodes.settled(serving)
    await load.more(200)
    code, found = await as_json(database)
    assert code == 0 and {n["node"]: n["live"] for n in found["nodes"]} == {
        nodes.address(serving[0]): True, nodes.address(serving[1]): True,
        nodes.address(gone): False,
    }  # fmt: skip
    checked = await load.stop(database, serving)
    print(f"rolling restart of three, then one left: {checked} acknowledged checked,"
          f" {load.refused} refusals retried")  # fmt: skip


async def test_a_cluster_and_a_single_tidal_on_two_databases_of_one_server_both_serve(
    cluster: Nodes, database: Database, request: pytest.FixtureRequest
) -> None:
    """Advisory locks are per database, and so is what a node reads of them: a tidal not
    in cluster mode serving another database of the same PostgreSQL server is not this
    cluster's business (a node refused to start, naming that tidal as serving its own)."""
    pg = request.getfixturevalue("pg_cluster")
    other = ServerProcess(pg.url(await pg.create()))
    await other.start()
    try:
        node = await cluster.start()  # listening: it joined its cluster
        async with await node.connect() as c:
            assert await c.ping() == "pong"
        async with await other.connect() as c:
            assert (await c.signal(1, "e", "view")).seq == 1
    finally:
        await other.stop()
