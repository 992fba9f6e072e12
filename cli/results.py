"""What a ``tidal bench`` run measured (``bench``), and how it is shown: a table, one JSON
object, or a progress bar meanwhile."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass

from .pipeline import Load
from .workload import BATCHES, BenchConfig


@dataclass(frozen=True, slots=True)
class BenchResult:
    workload: str
    clients: int
    pipeline: int
    requests: int
    signals: int
    errors: int
    seconds: float
    requests_per_s: float
    signals_per_s: float
    p50_ms: float
    p99_ms: float
    p999_ms: float
    #: the server's CPU time (user + system) per signal, or per request for other
    #: workloads, in microseconds; None without ``server_pid``
    server_cpu_us: float | None = None
    #: stopped by Ctrl-C: the figures are of the requests answered until then
    interrupted: bool = False


def percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, int(q * len(sorted_values)))
    return sorted_values[index] * 1000


def result_of(
    cfg: BenchConfig,
    conns: list[Load],
    latencies: list[float],
    answered: int,
    seconds: float,
    cpu: float,
    interrupted: bool,
) -> BenchResult:
    latencies.sort()
    signals_per_request = (
        cfg.batch_size
        if cfg.workload in BATCHES
        else {"signal": 1, "mixed": 0.95}.get(cfg.workload, 0)
    )
    signals = int(answered * signals_per_request)
    server_cpu_us = round(cpu / (signals or answered or 1) * 1e6, 2) if cfg.server_pid else None
    return BenchResult(
        workload=cfg.workload,
        clients=cfg.clients,
        pipeline=cfg.pipeline,
        requests=answered,
        signals=signals,
        errors=sum(c.errors for c in conns),
        seconds=round(seconds, 4),
        requests_per_s=round(answered / seconds, 1),
        signals_per_s=round(signals / seconds, 1),
        p50_ms=round(percentile(latencies, 0.5), 3),
        p99_ms=round(percentile(latencies, 0.99), 3),
        p999_ms=round(percentile(latencies, 0.999), 3),
        server_cpu_us=server_cpu_us,
        interrupted=interrupted,
    )


def progress_bar(done: int, total: int) -> None:
    width = 40
    filled = width * done // max(total, 1)
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done >= total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def format_result(result: BenchResult, as_json: bool) -> str:
    if as_json:
        return json.dumps(asdict(result))
    r = result
    lines = [
        f"workload {r.workload}: {r.clients} clients x {r.pipeline} pipelined,"
        f" {r.requests} requests",
        f"  {r.requests_per_s:,.0f} requests/s"
        + (f", {r.signals_per_s:,.0f} signals/s" if r.signals else ""),
        f"  latency p50 {r.p50_ms:.3f} ms, p99 {r.p99_ms:.3f} ms, p99.9 {r.p999_ms:.3f} ms",
        f"  {r.errors} errors, {r.seconds:.2f} s",
    ]
    if r.interrupted:
        lines.insert(0, f"interrupted (Ctrl-C): the {r.requests} requests answered until then")
    if r.server_cpu_us is not None:
        per = "signal" if r.signals else "request"
        lines.append(f"  server CPU {r.server_cpu_us:.2f} µs per {per}")
    return "\n".join(lines)
