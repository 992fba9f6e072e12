"""The HTTP edge in a server's other states: loading (neither alive nor ready), a standby
(alive, not ready), a cluster node that does not serve a user (421, naming the one that
does), and behind TLS."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import ssl
import sys
import urllib.request
from pathlib import Path

import pytest
import trustme

from tidal.cli.child import listening_port
from tidal.protocol.partitions import partition
from tidal.server import Config, Server

from .conftest import Database, ServerProcess, three_nodes
from .http_peer import call, request

HTTP_ON = re.compile(rb"HTTP on http://[^:]+:(\d+)/")


async def test_a_loading_server_is_neither_alive_nor_ready(db_path: Path) -> None:
    """The boot is held up for real: another program holds the database's write lock."""
    made = sqlite3.connect(db_path, isolation_level=None)
    made.execute("PRAGMA journal_mode=DELETE")
    made.execute("BEGIN EXCLUSIVE")  # tidal's switch to WAL waits (up to 5 s) for this
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tidal.cli", "serve", "--port", "0", "--http", "127.0.0.1:0",
        "--db", str(db_path), stdin=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert proc.stderr is not None
    try:
        port = 0
        while not port:
            line = await asyncio.wait_for(proc.stderr.readline(), 30)
            assert line, "tidal serve exited during boot"
            if found := HTTP_ON.search(line):
                port = int(found.group(1))
        for path in ("/health", "/ready"):
            code, headers, answer = await asyncio.to_thread(request, port, path)
            assert code == 503 and headers["retry-after"] == "1", (path, answer)
            assert answer == {"status": "starting", "storage": "loading"}
        code, headers, answer = await asyncio.to_thread(request, port, "/v1/status", [1])
        assert code == 503 and answer["error"]["data"] == {"kind": "starting"}
        made.execute("ROLLBACK")
        made.close()
        while listening_port(await asyncio.wait_for(proc.stderr.readline(), 30)) is None:
            pass
        for path in ("/health", "/ready"):
            code, _, answer = await asyncio.to_thread(request, port, path)
            assert code == 200 and answer["status"] == "ok"
    finally:
        proc.kill()
        await proc.wait()


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_a_standby_is_alive_but_not_ready(database: Database) -> None:
    serving = await ServerProcess(database.target, "--http", "127.0.0.1:0").start()
    waiting = await ServerProcess(database.target, "--standby", "--http", "127.0.0.1:0").start(
        bound=True
    )
    try:
        await waiting.logged("standby: waiting for")
        code, _, answer = await asyncio.to_thread(request, waiting.http_port, "/health")
        assert code == 200 and answer["status"] == "standby"
        code, headers, _ = await asyncio.to_thread(request, waiting.http_port, "/ready")
        assert code == 503 and headers["retry-after"] == "1"
        code, _, answer = await asyncio.to_thread(request, waiting.http_port, "/v1/leave", [1])
        assert code == 503 and answer["error"]["data"] == {"kind": "standby"}
        code, _, _ = await asyncio.to_thread(request, serving.http_port, "/ready")
        assert code == 200
        await serving.kill9()
        await waiting.logged("listening on")  # it took over: now it is ready, and serves
        code, _, _ = await asyncio.to_thread(request, waiting.http_port, "/ready")
        assert code == 200
        left = await asyncio.to_thread(call, waiting.http_port, "leave", 1)
        assert left["status"] == "left"
    finally:
        await waiting.stop()
        if serving.proc is not None and serving.proc.returncode is None:
            await serving.stop()


@pytest.mark.parametrize("backend", ["postgresql"])
async def test_a_node_that_does_not_serve_a_user_says_421_and_who_does(
    database: Database,
) -> None:
    async with three_nodes(database, http=True) as nodes:
        first = nodes[0]
        port = first.http_address[1]
        served = await asyncio.to_thread(call, port, "partition_map")
        mine = f"127.0.0.1:{first.address[1]}"
        owners = [owner for owner, _ in served["owners"]]
        user = next(u for u in range(10_000) if owners[partition(u, len(owners))] != mine)
        owner = owners[partition(user, len(owners))]
        code, headers, answer = await asyncio.to_thread(request, port, "/v1/leave", [user])
        assert code == 421 and headers["tidal-owner"] == owner
        assert answer["error"]["data"]["owner"] == owner
        assert answer["error"]["data"]["user_id"] == str(user)
        there = next(n for n in nodes if f"127.0.0.1:{n.address[1]}" == owner)
        assert (await asyncio.to_thread(call, there.http_address[1], "leave", user))[
            "status"
        ] == "left"


async def test_https_where_tls_is_set(db_path: Path, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    server = Server(
        Config(port=0, db=str(db_path), tls_cert=str(cert_file), tls_key=str(key_file),
               http="127.0.0.1:0")
    )  # fmt: skip
    await server.start()
    port = server.http_address[1]
    try:
        trusting = ssl.create_default_context()
        ca.configure_trust(trusting)

        def over_tls() -> bytes:
            req = urllib.request.Request(
                f"https://127.0.0.1:{port}/v1/ping", data=b"[]", method="POST",
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            with urllib.request.urlopen(req, timeout=30, context=trusting) as r:
                return bytes(r.read())

        assert await asyncio.to_thread(over_tls) == b'{"result":"pong"}'
        with pytest.raises(OSError):  # plain HTTP to a TLS port gets nothing back
            await asyncio.to_thread(request, port, "/health")
    finally:
        await server.shutdown()
