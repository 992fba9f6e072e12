"""Node's built-in fetch, and an EventSource from npm (the eventsource package, pinned in
tests/node), against a tidal that is killed (kill -9) and started again: the EventSource
reconnects by itself with Last-Event-ID and misses no event, nor sees one twice."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tidal.testing.postgres import free_port

from .conftest import Database, ServerProcess

NODE = Path(__file__).parent / "node"
TOKEN = "node-token"


def installed() -> None:
    """tests/node's packages, as its lock file pins them (npm ci, once per checkout)."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.fail(
            "this test needs Node.js 18 or later and npm (Debian: apt-get install nodejs npm)"
        )
    if (NODE / "node_modules" / "eventsource" / "package.json").exists():
        return
    done = subprocess.run(
        ["npm", "ci", "--no-audit", "--no-fund"], cwd=NODE, capture_output=True, text=True,
        timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"npm ci in tests/node failed:\n{done.stderr}"


async def lines(proc: asyncio.subprocess.Process) -> Any:
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 60)
    assert line, "the Node client exited early"
    return json.loads(line)


@pytest.mark.both_backends
async def test_node_fetches_and_its_eventsource_resumes_across_a_kill(database: Database) -> None:
    await asyncio.to_thread(installed)
    http = free_port()
    port = free_port()
    server = ServerProcess(
        database.target, "--port", str(port), "--http", f"127.0.0.1:{http}", "--token", TOKEN
    )
    await server.start()
    client = await server.connect_with(token=TOKEN)
    for user in range(5):
        await client.leave(user)
    node = await asyncio.create_subprocess_exec(
        "node", "client.mjs", f"http://127.0.0.1:{http}", TOKEN, "10",
        cwd=NODE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        signal = await lines(node)
        assert (
            signal["signal"]["status"] == 200 and signal["signal"]["answer"]["result"]["seq"] == 1
        )
        status = (await lines(node))["status"]
        assert status["answer"]["result"]["user_id"] == str(2**64 - 1)  # exact, as a string
        refused = (await lines(node))["refused"]
        assert refused["status"] == 400 and refused["answer"]["error"]["code"] == -32602
        first = [await lines(node) for _ in range(5)]
        assert [e["event"] for e in first] == ["1", "2", "3", "4", "5"]
        await client.close()
        await server.kill9()
        await server.start()  # the same ports, the same database
        client = await server.connect_with(token=TOKEN)
        for user in range(5, 10):
            await client.leave(user)
        rest: list[Any] = []
        while len(rest) < 5:
            line = await lines(node)
            if "event" in line:
                rest.append(line)
            else:
                assert "reconnecting" in line, line
        assert [e["event"] for e in rest] == ["6", "7", "8", "9", "10"]  # none lost, none twice
        assert [e["data"]["user_id"] for e in first + rest] == [str(u) for u in range(10)]
        assert await asyncio.wait_for(node.wait(), 30) == 0
    finally:
        if node.returncode is None:
            node.kill()
            await node.wait()
        await client.close()
        await server.stop()
