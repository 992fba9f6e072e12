"""Cluster nodes and one tidal on a PostgreSQL for ``bench/cluster.py``, each started as
``tidal serve`` and driven by ``tidal bench``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.systems import TIDAL, free_port
from tidal.cli.child import Child, start
from tidal.client import Client
from tidal.testing.postgres import Cluster

SHAPE = ("16", "16")  # clients, pipeline


def bench(node: Child, requests: int, *extra: str) -> subprocess.Popen[str]:
    cmd = [TIDAL, "bench", "--port", str(node.port), "-c", SHAPE[0], "-P", SHAPE[1]]
    cmd += ["-n", str(requests), "--json", "--server-pid", str(node.proc.pid), "--allow-data"]
    cmd += ["--keep", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def result(run: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = run.communicate(timeout=900)
    if run.returncode != 0:
        raise RuntimeError(f"tidal bench failed: {err}")
    result: dict[str, Any] = json.loads(out)
    return result


@contextmanager
def database(pg: Cluster) -> Iterator[str]:
    name = asyncio.run(pg.create())
    try:
        yield pg.url(name)
    finally:
        asyncio.run(pg.drop(name))


def node(url: str, port: int | None = None, *extra: str) -> Child:
    port = port or free_port()
    return start(
        [TIDAL, "serve", "--port", str(port), "--db", url, "--cluster", "bench",
         "--advertise", f"127.0.0.1:{port}", *extra]
    )  # fmt: skip


def served(nodes: list[Child], within: float = 30.0) -> float:
    """Seconds until the first of ``nodes`` reports every partition served by ``nodes``, in
    fair shares."""

    async def wait() -> float:
        began = time.monotonic()
        wanted = {f"127.0.0.1:{n.port}" for n in nodes}
        async with await Client.connect("127.0.0.1", nodes[0].port, timeout=10) as c:
            while True:
                owners = [o for o, _ in (await c.call("partition_map"))["owners"]]
                counts = {o: owners.count(o) for o in set(owners)}
                if set(counts) == wanted and max(counts.values()) - min(counts.values()) <= 1:
                    return time.monotonic() - began
                if time.monotonic() - began > within:
                    raise RuntimeError(f"not served in {within}s: {counts}")
                await asyncio.sleep(0.01)  # another process's state: polled

    return asyncio.run(wait())
