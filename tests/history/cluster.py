"""The fault-history checker's cluster target: three ``tidal serve --cluster`` nodes on one
PostgreSQL, each at an address of its own that it keeps across restarts, and the faults
a cluster meets:

- ``kill9``: a node SIGKILLed, then started again with its own address (its partitions
  are taken by the others meanwhile, and it takes its share back);
- ``term``: the same with SIGTERM (a rolling restart's step);
- ``pause``: a node SIGSTOPped under load, now and then past ``--db-idle-timeout``, so
  that its session ends and the others take its partitions while it cannot know;
- ``join``: a node added (up to ``MOST``); ``leave``: one stopped for good (down to
  ``LEAST``), its partitions handed to the others;
- ``pg_restart``: PostgreSQL stopped with ``-m immediate`` under load, then started.

Clients route each user's requests to the node serving it (``RoutedClient``), through
every node; reads and the feed are checked on every node.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
from collections import Counter
from typing import Any

from tidal.client import Client, ClusterClient, ConnectionLost, Moved
from tidal.protocol.partitions import GROUPS
from tidal.testing.postgres import Cluster, free_port

from ..conftest import Database, ServerProcess
from .nemesis import restart_postgresql
from .record import SENDING, History

NEMESIS = ("kill9", "term", "pause", "join", "leave", "pg_restart")
NODES, LEAST, MOST = 3, 2, 4
#: a node silent this long has its session ended, and its partitions go to the others
IDLE_TIMEOUT = 2.0
#: the methods about one user, sent to the node serving that user
USER_METHODS = frozenset({"signal", "leave", "rejoin", "purge", "erase", "status", "history"})


class RoutedClient:
    """A ``Client``'s ``call``, sent to the node serving the request's user (``home``'s
    for a request about no user: a probe's reads go where its writes went, and answer as of
    their place in that connection's order). ``pinned``: each call sent once, to the node
    the map names, never again elsewhere (a probe's calls keep their order)."""

    def __init__(self, routed: ClusterClient, home: int, pinned: bool) -> None:
        self.routed = routed
        self.home = home
        self.pinned = pinned
        self.closed = False

    @classmethod
    async def connect(cls, seeds: str, home: int, timeout: float, pinned: bool) -> RoutedClient:
        return cls(await ClusterClient.connect(seeds, timeout=timeout), home, pinned)

    @property
    def is_connected(self) -> bool:
        return not self.closed

    async def call(self, method: str, *params: Any) -> Any:
        if method in USER_METHODS:
            user = params[0]
        elif method == "signal_batch":
            user = params[0][0][0]  # the workload's batches are of one user in cluster mode
        else:
            user = self.home
        if not self.pinned:
            return await self.routed.routed(user, lambda client: self._try(client, method, params))
        router = self.routed.router
        try:
            client = await self.routed.node(router.owner(user))
            return await self._try(client, method, params)
        except Moved as exc:
            router.moved(router.part(user), exc.address)
            raise
        except (ConnectionLost, OSError):
            with contextlib.suppress(Exception):
                await self.routed.refresh()
            raise

    async def _try(self, client: Client, method: str, params: tuple[Any, ...]) -> Any:
        """One try, recorded in the operation being sent: which node it went to, and when
        (a node's death bounds what was sent to it, ``History.died``)."""
        op = SENDING.get()
        if op is not None:
            nodes = self.routed._nodes  # which node's client this is: the map may have moved
            op.sent(next((a for a, c in nodes.items() if c is client), "any"))
        return await client.call(method, *params)

    async def close(self) -> None:
        self.closed = True
        await self.routed.close()


class Node:
    """A node at an address of its own, kept across restarts."""

    def __init__(self, target: str, port: int, extra: tuple[str, ...]) -> None:
        self.address = f"127.0.0.1:{port}"
        self.process = ServerProcess(
            target, "--port", str(port), "--cluster", "history", "--advertise", self.address,
            "--db-idle-timeout", str(IDLE_TIMEOUT), *extra,
        )  # fmt: skip
        self.port = port

    async def start(self) -> None:
        await self.process.start()
        assert self.process.port == self.port, (self.process.port, self.port)

    @property
    def running(self) -> bool:
        proc = self.process.proc
        return proc is not None and proc.returncode is None


class ClusterTarget:
    """``NODES`` nodes to start with; the nemesis stops, restarts, adds and removes them."""

    def __init__(self, database: Database, history: History, *extra: str,
                 pg: Cluster | None = None) -> None:  # fmt: skip
        self.database, self.history, self.pg = database, history, pg
        self.extra = extra
        self.nodes = [self._new() for _ in range(NODES)]
        self.up = asyncio.Event()

    def _new(self) -> Node:
        return Node(self.database.target, free_port(), self.extra)

    def seeds(self) -> str:
        return ",".join(n.address for n in self.nodes if n.running)

    async def lead_port(self) -> int:
        """The port of the node serving partition 0, and so the consumer groups, as a
        running node's map says (``ConnectionError`` while none is known)."""
        for node in self.nodes:
            if not node.running:
                continue
            try:
                async with await node.process.connect_with(timeout=2) as c:
                    owner = (await c.call("partition_map"))["owners"][GROUPS][0]
            except Exception:  # starting, or away: another node is asked
                continue
            for serving in self.nodes:
                if serving.address == owner:
                    return serving.port
        raise ConnectionError("no node is known to serve the consumer groups now")

    async def dial(self, home: int, timeout: float, pinned: bool = False) -> RoutedClient:
        return await RoutedClient.connect(self.seeds(), home, timeout, pinned)

    async def start(self) -> None:
        for node in self.nodes:
            if not node.running:
                await node.start()
        await self.settle()
        self.up.set()

    def logs(self, lines: int = 30) -> str:
        out = []
        for node in self.nodes:
            tail = b"".join(node.process.log[-lines:]).decode(errors="replace")
            out.append(f"--- node {node.address}'s last {lines} lines:\n{tail}")
        return "\n".join(out)

    async def close(self) -> None:
        self.up.clear()
        for node in self.nodes:
            if node.running:
                await node.process.kill9()

    async def readers(self) -> list[Client]:
        """A stock client on each node: what each answers is checked."""
        return [await node.process.connect() for node in self.nodes if node.running]

    # -- the faults --------------------------------------------------------

    async def _restart(self, rng: random.Random, signum: int) -> None:
        node = rng.choice(self.nodes)
        self.history.fault(f"{signal.Signals(signum).name} {node.address}")
        await node.process.stop(signum)
        self.history.died(self.history.faults[-1].at, node.address)
        await node.start()
        self.history.fault(f"{node.address} started again")

    async def kill9(self, rng: random.Random) -> None:
        await self._restart(rng, signal.SIGKILL)

    async def term(self, rng: random.Random) -> None:
        await self._restart(rng, signal.SIGTERM)

    async def pause(self, rng: random.Random) -> None:
        node = rng.choice(self.nodes)
        assert node.process.proc is not None
        self.history.fault(f"SIGSTOP {node.address}")
        os.kill(node.process.proc.pid, signal.SIGSTOP)
        await asyncio.sleep(rng.uniform(0.2, 2 * IDLE_TIMEOUT))  # the fault is a span of time
        os.kill(node.process.proc.pid, signal.SIGCONT)
        self.history.fault(f"SIGCONT {node.address}")

    async def join(self, rng: random.Random) -> None:
        if len(self.nodes) >= MOST:
            await self.leave(rng)
            return
        node = self._new()
        self.history.fault(f"{node.address} joins")
        await node.start()
        self.nodes.append(node)

    async def leave(self, rng: random.Random) -> None:
        if len(self.nodes) <= LEAST:
            await self.join(rng)
            return
        node = self.nodes.pop(rng.randrange(len(self.nodes)))
        self.history.fault(f"{node.address} leaves (SIGTERM)")
        await node.process.stop(signal.SIGTERM)

    async def pg_restart(self, rng: random.Random) -> None:
        assert self.pg is not None
        await restart_postgresql(self.pg, self.history, rng)

    def faults(self, names: list[str]) -> list[Any]:
        kinds = []
        for name in names:
            if name == "pg_restart" and self.pg is None:
                continue
            if name not in NEMESIS:
                raise ValueError(f"TIDAL_HISTORY_NEMESIS: {name!r} is not one of {NEMESIS}")
            kinds += [getattr(self, name)] * (2 if name == "kill9" else 1)
        return kinds

    async def settle(self, within: float = 60) -> None:
        """Returns once every node running says every partition is served by a node
        running, all alike (a state, polled): a check reads a settled cluster."""
        for node in self.nodes:  # as a supervisor would: one that stopped by itself (away
            if not node.running:  # while the others pruned the log) is started again
                code = await node.process.wait()
                self.history.fault(f"{node.address} exited {code} by itself; started again")
                await node.start()
        wanted = {node.address for node in self.nodes}
        deadline = time.monotonic() + within
        maps: list[Any] = []
        while time.monotonic() < deadline:
            maps = []
            for node in self.nodes:
                try:
                    async with await node.process.connect() as c:
                        maps.append(await c.call("partition_map"))
                except Exception as exc:  # starting, or away: asked again
                    maps.append(repr(exc))
            owners = [m["owners"] if isinstance(m, dict) else None for m in maps]
            first = owners[0]
            same = first is not None and all(o == first for o in owners)
            if same and first is not None and all(owner in wanted for owner, _ in first):
                return
            await asyncio.sleep(0.1)  # other processes' state, polled: a pace
        served = [Counter(o for o, _ in m["owners"]) if isinstance(m, dict) else m for m in maps]
        raise AssertionError(f"the cluster did not settle in {within:.0f} s: {served}")
