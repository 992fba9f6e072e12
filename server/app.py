"""The server's life: boot from disk, listen, and shut down in order.

Boot loads leave state from SQLite *before* the socket opens, so no request is
ever gated by a half-loaded map. Shutdown: stop accepting, stop reading, commit
and answer what was read, close the connections, close the database.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import socket
import ssl
import time
from collections.abc import Callable
from typing import Any

from prometheus_client import start_http_server

from .config import Config
from .connection import ServerConnection
from .engine import Engine
from .metrics import Metrics
from .storage import Storage

log = logging.getLogger("tidal.server")


class Server:
    def __init__(self, config: Config) -> None:
        self.config = config
        self.connections: set[ServerConnection] = set()
        self._server: asyncio.Server | None = None
        self._storage: Storage | None = None
        self._engine: Engine | None = None
        self._stopped = asyncio.Event()
        self._sweeper: asyncio.Task[None] | None = None
        self.metrics: Metrics | None = None
        self._metrics_server: Any = None

    @property
    def engine(self) -> Engine:
        assert self._engine is not None, "server not started"
        return self._engine

    @property
    def address(self) -> tuple[str, int]:
        """Where it listens; with port 0, the port the system picked."""
        assert self._server is not None, "server not started"
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def start(self) -> None:
        config = self.config
        config.check()
        if not (config.token or config.insecure or _is_loopback(config.host)):
            raise ProtectedMode(
                f"refusing to listen on {config.host!r} without a token: anyone who can reach it"
                " could change who has left. Set --token (or TIDAL_TOKEN), or pass --insecure"
                " if the network in front of it is trusted."
            )
        began = time.perf_counter()
        self._storage = await Storage.open(config.db, config.durability)
        try:
            window_ns = int(config.idempotency_window * 1e9)
            snapshot = await self._storage.load(
                time.time_ns() - window_ns, config.idempotency_max_keys
            )
            self.metrics = Metrics() if config.metrics_port is not None else None
            engine = Engine(
                self._storage,
                snapshot,
                metrics=self.metrics,
                connections=lambda: len(self.connections),
                checkpoint_signals=config.checkpoint_signals,
                checkpoint_seconds=config.checkpoint_seconds,
                key_window_ns=window_ns,
                max_keys=config.idempotency_max_keys,
            )
        except BaseException:
            await self._storage.close()
            raise
        log.info(
            "loaded %s in %.3fs: %d leave records, %d cohorts, next seq %d,"
            " %d ledger rows replayed past the aggregates checkpoint",
            config.db,
            time.perf_counter() - began,
            len(snapshot.left) + len(snapshot.rejoined),
            len(snapshot.cohorts),
            snapshot.next_seq,
            len(snapshot.ledger_tail),
        )
        self._engine = engine
        engine.start()
        loop = asyncio.get_running_loop()

        def factory() -> ServerConnection:
            return ServerConnection(engine, config, self.connections)

        try:
            tls = _tls(config)
            self._server = await loop.create_server(
                factory,
                config.host,
                config.port,
                reuse_address=True,
                ssl=tls,
                ssl_handshake_timeout=10.0 if tls else None,
            )
        except BaseException:
            await engine.close()
            await self._storage.close()
            raise
        for sock in self._server.sockets:
            if sock.family in (socket.AF_INET, socket.AF_INET6):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sweeper = loop.create_task(self._sweep_idle(), name="tidal-idle-sweeper")
        if self.metrics is not None:
            self._serve_metrics(engine, self.metrics)
        host, port = self.address
        log.info(
            "listening on %s:%d%s%s",
            host,
            port,
            " (TLS)" if config.tls_cert else "",
            "" if config.token else " (no token)",
        )

    def _serve_metrics(self, engine: Engine, metrics: Metrics) -> None:
        """prometheus-client's HTTP server, on its own thread: scrapes never wait on the loop."""
        assert self.config.metrics_port is not None
        metrics.signals = lambda: (engine.signals, engine.forwarded)
        metrics.gauges = lambda: (len(self.connections), len(engine.members))
        server, _thread = start_http_server(
            self.config.metrics_port, self.config.host, registry=metrics.registry()
        )
        self._metrics_server = server
        log.info("metrics on http://%s:%d/metrics", self.config.host, server.server_port)

    @property
    def metrics_port(self) -> int:
        assert self._metrics_server is not None, "metrics are off"
        port: int = self._metrics_server.server_port
        return port

    async def _sweep_idle(self) -> None:
        """Close connections that have nothing in flight and sent nothing for idle_timeout."""
        timeout = self.config.idle_timeout
        while True:
            await asyncio.sleep(timeout / 4)  # a schedule, not a synchronisation
            cutoff = time.monotonic() - timeout
            for conn in list(self.connections):
                if conn.last_active < cutoff and conn.inflight == 0:
                    log.info("closing %s: idle for over %ss", conn.peer, timeout)
                    conn.transport.close()

    async def shutdown(self) -> None:
        """Stop accepting and reading, commit and answer what was read, then close everything."""
        if self._server is None or self._stopped.is_set():
            return
        self._stopped.set()
        self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        for conn in list(self.connections):
            conn.drain()
        try:
            await asyncio.wait_for(self.engine.close(), self.config.shutdown_timeout)
        except TimeoutError:
            log.error(
                "shutdown: pending commits did not finish in %ss", self.config.shutdown_timeout
            )
        for conn in list(self.connections):
            conn.transport.close()  # sends what is buffered, then closes
        assert self._storage is not None
        await self._storage.close()
        log.info("stopped")

    async def serve(self, stop: asyncio.Event) -> None:
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.shutdown()


def _tls(config: Config) -> ssl.SSLContext | None:
    if not (config.tls_cert or config.tls_key):
        return None
    if not (config.tls_cert and config.tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(config.tls_cert, config.tls_key)
    return context


class ProtectedMode(Exception):
    """The server would listen beyond loopback with no token."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a name that might resolve anywhere


def run(config: Config) -> None:
    """Serve until SIGINT or SIGTERM, on uvloop when it is installed."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        await Server(config).serve(stop)

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(main())


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency; this is for odd platforms
        log.warning("uvloop is not installed; using asyncio's default event loop")
        return None
    return uvloop.new_event_loop
