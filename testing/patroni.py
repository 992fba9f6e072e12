"""PostgreSQL under Patroni, for the failover tests: one etcd and two PostgreSQL 15 nodes,
from Debian's ``etcd-server``, ``patroni`` and ``postgresql-15``, on loopback.

Patroni runs with ``synchronous_mode`` and ``synchronous_mode_strict``: a COMMIT
returns only once the synchronous standby has its WAL, and none returns while no
standby is up, so that a promoted standby holds every acknowledged commit. Short
``loop_wait`` and ``primary_start_timeout: 0`` make a crashed primary fail over at
once rather than be restarted in place. Patroni and PostgreSQL run as the ``postgres``
user when the tests run as root.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .postgres import PASSWORD, Missing, bindir, free_port

SCOPE = "tidal-ha"
#: how long a cluster may take to come up, or to settle after a failover
SETTLE = 120.0


def _need(tool: str, package: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise Missing(
            f"the failover tests need Debian's {package} ({tool}): `make test` installs it when"
            f" run as root; otherwise apt-get install {package}"
        )
    return found


@dataclass
class Node:
    name: str
    port: int  # PostgreSQL's
    rest: int  # Patroni's REST API
    data: Path
    proc: subprocess.Popen[bytes] | None = None

    def postmaster_pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])


class HaCluster:
    """etcd and two Patroni nodes; ``url`` names both hosts, for the one that takes writes."""

    def __init__(self) -> None:
        self.etcd_exe = _need("etcd", "etcd-server")
        self.patroni_exe = _need("patroni", "patroni")
        self.bin = bindir()
        self.dir = Path(tempfile.mkdtemp(prefix="tidal-ha-"))
        self._user: str | None = None
        if os.getuid() == 0:  # PostgreSQL will not run as root
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise Missing("running as root, these tests need the postgres user") from None
            self._user = "postgres"
            shutil.chown(self.dir, "postgres", "postgres")
        self.etcd_port = free_port()
        self._etcd = self._spawn("etcd", self._etcd_command())
        self.nodes = [
            Node(name, free_port(), free_port(), self.dir / name) for name in ("n1", "n2")
        ]
        try:
            for node in self.nodes:
                self._write_config(node)
                node.proc = self._spawn(node.name, [self.patroni_exe, str(self._config(node))])
                if node is self.nodes[0]:  # the first bootstraps alone: it is the leader
                    self.wait(lambda: self.leader() is not None, "a leader")
            self.settled()
        except BaseException:
            self.destroy()
            raise

    # -- starting ----------------------------------------------------------

    def _etcd_command(self) -> list[str]:
        peer = free_port()
        return [
            self.etcd_exe, "--name", "e1", "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"e1=http://127.0.0.1:{peer}",
        ]  # fmt: skip

    def _spawn(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        if self._user is not None:
            command = ["runuser", "-u", self._user, "--", *command]
        log = (self.dir / f"{name}.log").open("ab")
        with log:
            return subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )

    def _config(self, node: Node) -> Path:
        return self.dir / f"{node.name}.yml"

    def _write_config(self, node: Node) -> None:
        local = f"127.0.0.1:{node.port}"
        config: dict[str, Any] = {
            "scope": SCOPE,
            "namespace": "/tidal-test/",
            "name": node.name,
            "log": {"level": "INFO"},
            "restapi": {
                "listen": f"127.0.0.1:{node.rest}",
                "connect_address": f"127.0.0.1:{node.rest}",
            },
            "etcd3": {"hosts": [f"127.0.0.1:{self.etcd_port}"]},
            "bootstrap": {
                "dcs": {
                    "ttl": 20,
                    "loop_wait": 1,
                    "retry_timeout": 5,
                    "primary_start_timeout": 0,
                    "synchronous_mode": True,
                    "synchronous_mode_strict": True,
                    "postgresql": {
                        "use_pg_rewind": True,
                        "use_slots": True,
                        "parameters": {"wal_log_hints": "on", "max_connections": 100},
                    },
                },
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}],
                "pg_hba": [
                    "local all all trust",
                    "host replication replicator 127.0.0.1/32 scram-sha-256",
                    "host all all 127.0.0.1/32 scram-sha-256",
                ],
            },
            "postgresql": {
                "listen": local,
                "connect_address": local,
                "data_dir": str(node.data),
                "bin_dir": str(self.bin),
                "pgpass": str(self.dir / f"{node.name}.pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": PASSWORD},
                    "replication": {"username": "replicator", "password": PASSWORD},
                    "rewind": {"username": "postgres", "password": PASSWORD},
                },
                "parameters": {
                    "unix_socket_directories": str(self.dir),
                    "password_encryption": "scram-sha-256",
                },
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
        }
        path = self._config(node)
        path.write_text(json.dumps(config))  # JSON is YAML
        if self._user is not None:
            shutil.chown(path, self._user)

    # -- what Patroni says -------------------------------------------------

    def members(self) -> list[dict[str, Any]]:
        for node in self.nodes:
            with contextlib.suppress(OSError, ValueError):
                url = f"http://127.0.0.1:{node.rest}/cluster"
                with urllib.request.urlopen(url, timeout=2) as reply:
                    found: list[dict[str, Any]] = json.load(reply)["members"]
                    return found
        return []

    def role(self, role: str) -> Node | None:
        for member in self.members():
            if member.get("role") == role and member.get("state") in ("running", "streaming"):
                return self._node(member["name"])
        return None

    def leader(self) -> Node | None:
        return self.role("leader")

    def _node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def wait(self, done: Any, what: str, timeout: float = SETTLE) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"Patroni: no {what} in {timeout:.0f}s: {self.members()}")
            time.sleep(0.2)  # Patroni's state, polled as patronictl does

    def settled(self) -> Node:
        """The leader, once the other node is its synchronous standby."""
        self.wait(lambda: self.leader() and self.role("sync_standby"), "synchronous standby")
        leader = self.leader()
        assert leader is not None
        return leader

    def url(self, database: str) -> str:
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return (
            f"postgresql://postgres:{PASSWORD}@{hosts}/{database}?target_session_attrs=read-write"
        )

    def leader_url(self, database: str) -> str:
        leader = self.leader()
        assert leader is not None
        return f"postgresql://postgres:{PASSWORD}@127.0.0.1:{leader.port}/{database}"

    # -- faults --------------------------------------------------------------

    def kill_postmaster(self, node: Node) -> None:
        os.kill(node.postmaster_pid(), signal.SIGKILL)

    def switchover(self, leader: Node, candidate: Node) -> None:
        body = json.dumps({"leader": leader.name, "candidate": candidate.name}).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{leader.rest}/switchover", body, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            if reply.status != 200:
                raise AssertionError(f"switchover refused: {reply.read()!r}")

    # -- stopping ------------------------------------------------------------

    def destroy(self) -> None:
        for proc in [n.proc for n in getattr(self, "nodes", []) if n.proc] + [self._etcd]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # Patroni stops its PostgreSQL
        for proc in [n.proc for n in getattr(self, "nodes", []) if n.proc] + [self._etcd]:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for node in getattr(self, "nodes", []):  # a postmaster Patroni lost track of
            with contextlib.suppress(OSError, ValueError, IndexError):
                os.kill(node.postmaster_pid(), signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def logs(self) -> str:
        return "\n".join(
            f"--- {path.name}\n" + path.read_text(errors="replace")[-4000:]
            for path in sorted(self.dir.glob("*.log"))
        )
