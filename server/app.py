"""The server's life: boot from disk, listen, and shut down in order.

Start: check the settings, bind the port, take the database's lock, and only
then open the database, so that a mistake fails before anything on disk changes
(PostgreSQL's lock is taken on the connection that opens it, before any write).
Boot loads leave state from the database before any request is applied, so none is
ever gated by a half-loaded map (meanwhile only ``ping`` and ``health`` are
answered). Shutdown: stop accepting, stop reading, commit and answer what was
read, close the connections, close the database, let go of the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import ssl
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tidal.server.engine.engine import Engine
from tidal.server.engine.health import Booting, Standby
from tidal.server.net.connection import ServerConnection
from tidal.server.net.shared import Served, ServerState
from tidal.server.net.sweep import sweep_idle
from tidal.server.net.tls import protect, tls_context
from tidal.server.storage.backends import open_storage
from tidal.server.storage.interface import Storage, is_url
from tidal.server.storage.sqlite.dblock import DatabaseLock
from tidal.server.web.connection import HttpConnection
from tidal.server.web.consumers import Consumers

from . import host, kinds, ports, validity
from .config import Config, redact
from .errors import StartupError
from .metrics import Metrics
from .starting import build_engine, loaded

if TYPE_CHECKING:
    from tidal.server.cluster import Node

log = logging.getLogger("tidal.server")


class Server:
    def __init__(self, config: Config, *, clock: Callable[[], int] = time.time_ns) -> None:
        """``clock``: wall-clock nanoseconds (leave times, the idempotency window)."""
        self.config = config
        self._clock = clock
        self.state: ServerState[Served] = ServerState(Booting(), None)
        self._server: asyncio.Server | None = None
        self._http: asyncio.Server | None = None
        self._lock: DatabaseLock | None = None
        self._storage: Storage | None = None
        self._engine: Engine | None = None
        self._node: Node | None = None  # cluster mode
        self._stopped = False
        #: set if the last commits at shutdown did not all commit: ``run`` then exits 1
        self.unclean: str | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._metrics_server: Any = None

    @property
    def connections(self) -> set[Served]:
        return self.state.connections

    @property
    def metrics(self) -> Metrics | None:
        return self.state.metrics

    @property
    def engine(self) -> Engine:
        assert self._engine is not None, "server not started"
        return self._engine

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens; with port 0, the port the system picked."""
        assert self._server is not None, "server not started"
        return ports.bound(self._server)

    @property
    def http_address(self) -> tuple[str, int]:
        """Where the HTTP edge listens (``--http``)."""
        assert self._http is not None, "--http is off"
        return ports.bound(self._http)

    async def start(self) -> None:
        """Check, bind, lock, then load: what can fail without touching the disk fails first.

        The socket answers from the moment it is bound: ``health`` says ``starting``
        and every request that needs state gets error 2 until the load is done.
        """
        config = self.config
        validity.check(config)
        log.debug("%r", config)  # the token shows as ***
        protect(config)
        tls = tls_context(config)
        try:
            await self._listen(tls)
            if not is_url(config.db):  # PostgreSQL: an advisory lock, taken as it opens
                self._lock = DatabaseLock.acquire(config.db)
            log.info("bound %s:%d; loading %s", *self.address, redact(config.db))
            engine = await self._boot()
        except BaseException:
            await self._close()
            raise
        self._engine = engine
        engine.start()
        if self._node is not None:
            self._node.start(engine, self._clock)
        self.state.handler = engine
        log.info(
            "listening on %s:%d%s%s",
            *self.address,
            " (TLS)" if config.tls_cert else "",
            "" if config.token else " (no token)",
        )

    async def _listen(self, tls: ssl.SSLContext | None) -> None:
        config = self.config
        state = self.state
        state.metrics = Metrics() if config.metrics_port is not None else None

        def factory() -> ServerConnection:
            return ServerConnection(state, config)

        where = f"{config.host}:{config.port}"
        self._server = await ports.listen(
            factory, (config.host, config.port), config, tls, f"cannot listen on {where}"
        )
        sweep = sweep_idle(self.connections, config.idle_timeout, config.message_timeout)
        self._sweeper = asyncio.get_running_loop().create_task(sweep, name="tidal-idle-sweeper")
        if state.metrics is not None:
            self._serve_metrics(state.metrics)
        if config.http is not None:
            await self._listen_http(config.http, tls)

    async def _listen_http(self, where: str, tls: ssl.SSLContext | None) -> None:
        """The HTTP edge, over the same state: its connections count with the TCP port's,
        are held by the same switch, swept by the same clock, drained by the same shutdown."""
        consumers = Consumers()
        state, config = self.state, self.config

        def factory() -> HttpConnection:
            return HttpConnection(state, config, consumers)

        self._http = await ports.listen(
            factory, kinds.split(where), config, tls, f"cannot serve HTTP on {where}"
        )
        log.info("HTTP on %s://%s:%d/", "https" if tls else "http", *self.http_address[:2])

    async def _boot(self) -> Engine:
        """Leave state from disk into memory, before any request that needs it is taken.
        The collector is off meanwhile: what boot makes all lives, and a million aggregates
        walked again at each collection took a third of the boot (``host.settle_gc``)."""
        gc.disable()
        try:
            return await self._load()
        finally:
            gc.enable()

    async def _load(self) -> Engine:
        config = self.config
        began = time.perf_counter()
        standby = None
        if config.standby:
            self.state.handler = waiting = Standby(redact(config.db))

            def standby(holder: str) -> None:
                waiting.holder = holder

        self._storage = await open_storage(config, standby)
        self.state.handler = Booting()  # the lock is taken: loading
        if config.standby:
            began = time.perf_counter()  # the wait is not the load
        window_ns = int(config.idempotency_window * 1e9)
        if config.cluster:
            from tidal.server.cluster import Node  # asyncpg, only once chosen

            self._node = node = await Node.join(self._storage, config)
            snapshot = await node.load(config.half_lives(), self._clock())
        else:
            snapshot = await self._storage.load(
                self._clock() - window_ns,
                config.idempotency_max_keys,
                config.half_lives(),
                self._clock(),
            )
        read = time.perf_counter()
        engine = build_engine(
            config, self._storage, snapshot, metrics=self.metrics, clock=self._clock,
            connections=lambda: len(self.connections), hold=self.state.hold,
            owners=None if self._node is None else self._node.owners,
        )  # fmt: skip
        host.settle_gc()
        done = time.perf_counter()
        loaded(self._storage, snapshot, engine, (done - began, read - began, done - read))
        return engine

    def _serve_metrics(self, metrics: Metrics) -> None:
        """prometheus-client's HTTP server, on its own thread: scrapes never wait on the loop."""
        assert self.config.metrics_port is not None

        def engine() -> Engine | None:
            return self._engine

        def waiting() -> bool:
            return isinstance(self.state.handler, Standby)

        metrics.bind(engine, lambda: len(self.connections), waiting, self.config.standby)
        try:
            self._metrics_server = metrics.serve(self.config.host, self.config.metrics_port)
        except OSError as exc:
            where = f"{self.config.host}:{self.config.metrics_port}"
            raise StartupError(f"cannot serve metrics on {where}: {host.why(exc)}") from None
        log.info("metrics on http://%s:%d/metrics", self.config.host, self.metrics_port)

    @property
    def metrics_port(self) -> int:
        assert self._metrics_server is not None, "metrics are off"
        port: int = self._metrics_server.server_port
        return port

    async def shutdown(self) -> None:
        """Stop accepting and reading, commit and answer what was read, then close everything."""
        if self._server is None or self._stopped:
            return
        await self._close()
        log.info("stopped")

    async def _close(self) -> None:
        """In order, whatever ``start`` got as far as: the lock is let go of last, once
        nothing of this server can write."""
        self._stopped = True
        if self._server is not None:
            self._server.close()
        if self._http is not None:
            self._http.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        for conn in list(self.connections):
            conn.drain()
        if self._node is not None:
            await self._node.stop()
        if self._engine is not None:
            try:
                await asyncio.wait_for(self._engine.close(), self.config.shutdown_timeout)
            except TimeoutError:
                self.unclean = f"pending commits did not finish in {self.config.shutdown_timeout}s"
            committer = self._engine.committer
            failed = committer.outage.failed_for_good or committer.outage.last_failed
            if self.unclean is None and failed:
                self.unclean = f"the last commit failed ({failed})"
            if self.unclean is not None:
                log.error(
                    "shutdown: %s; what was acknowledged is on disk, and the next boot replays"
                    " the ledger past the last checkpoint",
                    self.unclean,
                )
        for conn in list(self.connections):
            conn.transport.close()  # sends what is buffered, then closes
        if self._storage is not None:
            await self._storage.close()
        if self._lock is not None:
            self._lock.release()

    async def serve(self, stop: asyncio.Event) -> int:
        """Serve until ``stop``; 0 if everything read was committed at the end, else 1; 3 if
        another tidal took the database over (this one must not write again: a supervisor
        restarts it, as a standby if it was started as one).

        A standby waits in ``start`` for the database: ``stop`` ends the wait."""
        starting = asyncio.ensure_future(self.start())
        stopping = asyncio.ensure_future(stop.wait())
        deposed: asyncio.Future[str] | None = None
        try:
            await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                if self._engine is None and self.config.standby:
                    starting.cancel()  # still waiting for the lock: nothing to finish
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
            else:
                await starting  # raises what stopped it
                deposed = self.engine.committer.outage.deposed
                assert deposed is not None  # the engine has started
                await asyncio.wait((stopping, deposed), return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            await self.shutdown()
        if deposed is not None and deposed.done():
            log.critical("stopping: %s", deposed.result())
            return 3
        return 1 if self.unclean else 0
