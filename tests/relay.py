"""A TCP relay to PostgreSQL whose path can be made to fail as networks and proxies do,
for the tests of a database gone silent and for the fault-history checker's nemesis."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess

import pytest

from tidal.testing.postgres import free_port


class Relay:
    """A TCP relay to PostgreSQL on a port of its own, whose packets the kernel can be told
    to drop (iptables): a network that goes silent, as a host's power loss or a partition
    looks, with no reset and no FIN. Or it stops passing bytes on, holding them, while both
    of its connections stay up (``mute``): a hung pgbouncer, HAProxy or load balancer."""

    def __init__(self, target_port: int) -> None:
        self.port = free_port()
        self.target = target_port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.silent = False
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.mute_on: bytes | None = None  # mute as these bytes go by towards the database

    @property
    def closed(self) -> bool:
        return self._server is None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:  # the database is down: so is this connection
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    if up and self.mute_on is not None and self.mute_on in data:
                        self.mute_on = None
                        self.flowing.clear()
                    await self.flowing.wait()
                    dst.write(data)
                    await dst.drain()
            dst.close()

        for task in (pipe(reader, up_writer, True), pipe(up_reader, writer, False)):
            t = asyncio.create_task(task)
            self._tasks.add(t)
            t.add_done_callback(self._tasks.discard)

    def _rules(self, action: str) -> None:
        for match in (["--dport", str(self.port)], ["--sport", str(self.port)]):
            done = subprocess.run(
                ["iptables", action, "INPUT", "-i", "lo", "-p", "tcp", *match, "-j", "DROP"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                pytest.fail(f"this test drops packets with iptables, as root: {done.stderr}")

    def go_silent(self) -> None:
        self._rules("-A")
        self.silent = True

    def speak(self) -> None:
        if self.silent:
            self._rules("-D")
            self.silent = False

    def mute(self, on: bytes) -> None:
        """Stop passing bytes on, in both directions, from the first that hold ``on``."""
        self.mute_on = on

    def unmute(self) -> None:
        self.mute_on = None
        self.flowing.set()

    async def close(self) -> None:
        self.unmute()
        self.speak()
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._tasks):
            task.cancel()
