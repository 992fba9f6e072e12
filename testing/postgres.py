"""A real PostgreSQL for tests and benchmarks: Debian's postgresql-15, in a temporary directory.

``initdb`` runs as the ``postgres`` user when the tests run as root (PostgreSQL
refuses root), on a free loopback port, with password authentication, so that
every URL tidal is given carries a password, as in production.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import asyncpg

PASSWORD = "tidal-test-password"


class Missing(RuntimeError):
    """What the machine lacks to start a cluster, and how to get it."""


def bindir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise Missing(
            "these tests start a real PostgreSQL and need Debian's postgresql-15 (initdb and"
            " pg_ctl in /usr/lib/postgresql/15/bin): `make test` installs it when run as root;"
            " otherwise apt-get install postgresql-15"
        )
    return Path(found[-1]).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Cluster:
    """One PostgreSQL server; a database of its own per test."""

    def __init__(self) -> None:
        self.bin = bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="tidal-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self._names = itertools.count(1)
        self._user: str | None = None
        if os.getuid() == 0:  # PostgreSQL will not run as root
            self._user = "postgres"
            try:
                pw = pwd.getpwnam("postgres")
            except KeyError:
                raise Missing(
                    "running as root, these tests need the postgres user (postgresql-15)"
                ) from None
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        secret = self.dir / "pwfile"
        secret.write_text(PASSWORD)
        if self._user is not None:
            shutil.chown(secret, self._user)
        self._run(
            "initdb", "-D", str(self.data), "-U", "postgres", "--auth=scram-sha-256",
            f"--pwfile={secret}", "-E", "UTF8", "--locale=C.UTF-8",
        )  # fmt: skip
        self.start()

    def _run(self, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / tool), *args]
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{tool} failed: {done.stderr.strip() or done.stdout.strip()}")
        return done

    def start(self) -> None:
        options = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1"
        self._run(
            "pg_ctl", "-D", str(self.data), "-w", "-t", "60", "-o", options,
            "-l", str(self.dir / "log"), "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-w", "-m", mode, "stop")

    def destroy(self) -> None:
        with contextlib.suppress(RuntimeError):  # not running
            self.stop("immediate")
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, name: str, *, password: bool = True) -> str:
        secret = f":{PASSWORD}" if password else ""
        return f"postgresql://postgres{secret}@127.0.0.1:{self.port}/{name}"

    async def create(self) -> str:
        """A new, empty database; its name."""
        name = f"t{next(self._names)}"
        conn = await asyncpg.connect(self.url("postgres"))
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()
        return name

    async def drop(self, name: str) -> None:
        conn = await asyncpg.connect(self.url("postgres"))
        try:
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        finally:
            await conn.close()


async def fetch(url: str, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    conn = await asyncpg.connect(url)
    try:
        return [tuple(row) for row in await conn.fetch(sql, *args)]
    finally:
        await conn.close()
