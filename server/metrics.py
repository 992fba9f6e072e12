"""Prometheus metrics: counted on the request path with plain integers, rendered when scraped.

prometheus-client's own Histogram takes a lock and several calls per
observation; the loop thread is the only writer here, so a bisect and two
additions do, and a collector turns them into metric families at scrape time.
"""

from __future__ import annotations

import socket
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterator
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import (
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    make_wsgi_app,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector, CollectorRegistry

from tidal.protocol import METHODS, ErrorCode

from .engine_metrics import Engine, counter, engine_metrics
from .group_metrics import group_metrics
from .version import VERSION, compiled

LATENCY_BUCKETS: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
BATCH_BUCKETS: Final = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000)
COMMIT_BUCKETS: Final = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class Histogram:
    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
        return out


class Metrics:
    """What the server counts; live state (users left, health) is read from the engine,
    which is None while the database loads."""

    def __init__(self) -> None:
        self.errors: dict[int, int] = {}
        self.leaves = 0
        self.rejoins = 0
        self.purges = 0
        self.erasures = 0
        self.withdrawn = 0  # signals purged or erased
        self.latency: dict[str, Histogram] = {}
        self.batch_size = Histogram(BATCH_BUCKETS)
        self.commit_seconds = Histogram(COMMIT_BUCKETS)
        self.engine: Callable[[], Engine | None] = lambda: None
        self.connections: Callable[[], int] = lambda: 0
        self.waiting: Callable[[], bool] = lambda: False  # as a standby, for the lock
        self.standby_enabled = False  # started with --standby

    def serve(self, host: str, port: int) -> Any:
        """prometheus-client's HTTP server for ``registry()``, on its own thread: scrapes
        never wait on the loop. Raises ``OSError`` if it cannot listen."""
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]

        class Server(ThreadingWSGIServer):
            address_family = family

        app = _only(PATH, make_wsgi_app(self.registry()))
        server = make_server(host, port, app, Server, handler_class=_Quiet)
        threading.Thread(target=server.serve_forever, name="tidal-metrics", daemon=True).start()
        return server

    def bind(self, engine: Callable[[], Engine | None], connections: Callable[[], int],
             waiting: Callable[[], bool], standby_enabled: bool) -> None:  # fmt: skip
        self.engine, self.connections = engine, connections
        self.waiting, self.standby_enabled = waiting, standby_enabled

    def observe_latency(self, method: str, seconds: float) -> None:
        """Labelled by method for tidal's methods only: any other name a client sends is
        ``other``, so that no stranger adds series to every scrape."""
        if method not in METHODS:
            method = "other"
        histogram = self.latency.get(method)
        if histogram is None:
            histogram = self.latency[method] = Histogram(LATENCY_BUCKETS)
        histogram.observe(seconds)

    def error(self, code: int) -> None:
        self.errors[code] = self.errors.get(code, 0) + 1

    def registry(self) -> CollectorRegistry:
        """tidal's metrics, and prometheus-client's own: process_* (CPU, memory, open
        files), python_gc_* and python_info."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        return registry


class _Collector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.m
        engine = m.engine()
        signals, forwarded = (engine.signals, engine.forwarded) if engine else (0, 0)
        storage = engine.health()["storage"] if engine else "loading"
        yield InfoMetricFamily(
            "tidal_build",
            "tidal's version, and whether its hot modules run compiled (mypyc).",
            value={"version": VERSION, "compiled": str(compiled()).lower()},
        )
        yield GaugeMetricFamily(
            "tidal_ready",
            "1 once the database is loaded and requests are served.",
            value=int(engine is not None),
        )
        yield GaugeMetricFamily(
            "tidal_standby",
            "1 while this process waits as a standby for the serving tidal's lock.",
            value=int(m.waiting()),
        )
        yield GaugeMetricFamily(
            "tidal_standby_enabled",
            "1 if started with --standby: its deployment keeps a standby beside the one that"
            " serves.",
            value=int(m.standby_enabled),
        )
        yield GaugeMetricFamily(
            "tidal_storage_up",
            "1 while storage takes writes; 0 while loading, after a failed commit, with the"
            " disk full, or with the database out of reach.",
            value=int(storage == "ok"),
        )
        if engine is not None:
            backend = GaugeMetricFamily(
                "tidal_storage_backend", "The storage backend in use: 1.", labels=["backend"]
            )
            backend.add_metric([engine.storage.backend], 1)
            yield backend
        yield from _traffic(m, signals, forwarded)
        yield GaugeMetricFamily("tidal_connections", "Open connections.", value=m.connections())
        yield from engine_metrics(engine)
        yield from group_metrics(engine.groups if engine else None)


def _traffic(m: Metrics, signals: int, forwarded: int) -> Iterator[Metric]:
    """What came in and what was answered: signals, leaves, errors, latencies, commits."""
    yield counter("tidal_signals", "Signals committed to the ledger.", signals)
    yield counter("tidal_forwarded", "Signals fanned out to cohorts and communities.", forwarded)
    yield counter("tidal_gated", "Signals of users who had left: ledger only.", signals - forwarded)
    yield counter("tidal_leaves", "Leaves committed.", m.leaves)
    yield counter("tidal_rejoins", "Rejoins committed.", m.rejoins)
    yield counter("tidal_purges", "Purges committed (a leave with purge among them).", m.purges)
    yield counter("tidal_erasures", "Erasures committed.", m.erasures)
    yield counter(
        "tidal_withdrawn_signals", "Signals purged or erased: taken off every aggregate.",
        m.withdrawn,
    )  # fmt: skip
    errors = CounterMetricFamily(
        "tidal_errors", "Error replies, by code and its name.", labels=["code", "name"]
    )
    for code, count in sorted(m.errors.items()):
        errors.add_metric([str(code), error_name(code)], count)
    yield errors
    latency = HistogramMetricFamily(
        "tidal_request_seconds",
        "From reading a request to writing its reply, by method.",
        labels=["method"],
    )
    for method, histogram in sorted(m.latency.items()):
        latency.add_metric([method], histogram.buckets(), histogram.total)
    yield latency
    yield _histogram("tidal_commit_batch_size", "Writes per group commit.", m.batch_size)
    yield _histogram("tidal_commit_seconds", "Duration of a group commit.", m.commit_seconds)


def error_name(code: int) -> str:
    """The error code's name (PROTOCOL.md), lower case: ``invalid_params``, ``unavailable``."""
    try:
        return ErrorCode(code).name.lower()
    except ValueError:
        return "other"


def _histogram(name: str, doc: str, histogram: Histogram) -> HistogramMetricFamily:
    return HistogramMetricFamily(name, doc, buckets=histogram.buckets(), sum_value=histogram.total)


#: the one path the metrics port serves; every other one is 404, as a scraper or a person
#: who mistyped it should be told (prometheus-client answers 200 with the metrics on any)
PATH: Final = "/metrics"


def _only(path: str, app: Any) -> Any:
    def serve(environ: dict[str, Any], start_response: Any) -> Any:
        if environ.get("PATH_INFO") != path:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"not found: tidal's metrics are at {path}\n".encode()]
        return app(environ, start_response)

    return serve


class _Quiet(WSGIRequestHandler):
    """No line per scrape on stderr."""

    def log_message(self, format: str, *args: Any) -> None:
        pass
