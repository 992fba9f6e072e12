"""The report ``make bench`` writes: docs/BENCHMARKS.md, with each ratio measured side
by side in one run, and docs/benchmarks.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.big_ranking import ranking_report
from bench.cluster import cluster_report
from bench.feed import feed_report
from bench.goals import goals, targets
from bench.groups import group_report
from bench.http_edge import http_report
from bench.past import past_report
from bench.scenarios import SHAPES
from bench.systems import PG

#: bench/past.py's writer time, median, on the page the purge issue left (docs/BENCHMARKS.md)


def _span(result: dict[str, Any]) -> str:
    low, high = result.get("range", [result["signals_per_s"]] * 2)
    digits = 1 if high < 10_000 else 0
    return f"{low / 1000:.{digits}f}k-{high / 1000:.{digits}f}k"


def cpu_cell(result: dict[str, Any]) -> str:
    values = [r["server_cpu_us"] for r in result.get("runs", []) if r.get("server_cpu_us")]
    if not values:
        return "n/a"
    return f"{result['server_cpu_us']:.1f} ({min(values):.1f}-{max(values):.1f})"


def report(results: dict[str, Any]) -> str:
    return "\n".join(
        [
            *_header(results),
            *_tables(results["shapes"]),
            *goals(results),
            *targets(results),
            *_other_shapes(results),
            *past_report(results.get("past")),
            *ranking_report(results.get("big_ranking")),
            *feed_report(results.get("feed")),
            *group_report(results.get("groups")),
            *http_report(results.get("http")),
            *cluster_report(results.get("cluster")),
            *_footer(),
        ]
    )


def _header(results: dict[str, Any]) -> list[str]:
    m = results["machine"]
    return [
        "# Benchmarks",
        "",
        f"One run of `make bench` on {m['date']}: {m['cores']} cores,",
        f"Python {m['python']}, Redis {m['redis']}, tidal {m.get('build', 'as installed')}.",
        f"Each figure is the median of {results.get('repeats', 1)} runs, in rounds that alternate",
        "between the systems; the range of the runs is in brackets. Compare within this page",
        "only: absolute figures on this shared machine drift (by up to 2x between runs).",
        "",
        "**One load generator for every system**: `tidal bench` (Python, closed loop, every",
        "request encoded before the clock starts), on the same machine. It speaks",
        "MessagePack-RPC to tidal and the bare stack, and sends Redis the same requests as",
        "RESP commands (`--redis-sha`): a signal calls `bench/signal.lua` (ledger counter,",
        "`SISMEMBER` gate, community and cohort counters), with AOF on. The server's CPU",
        "time (user + system, all threads, from `/proc/PID/stat`) is read around each run.",
        "",
        "Workload: `signal` with one community and one attribute, a cohort defined on that",
        "attribute, 100,000 users, 1,000 entities.",
        "",
        f"`{PG}`: PostgreSQL 15 from Debian, started by the run (`initdb` in a temporary",
        "directory, default settings, `synchronous_commit` on), on the same two cores; a new",
        "database for each run. Its CPU is tidal's and the PostgreSQL server's processes'",
        "together (on SQLite the database's work is inside tidal's process); tidal's own",
        "share is in square brackets.",
        "",
    ]


def _tables(shapes: dict[str, Any]) -> list[str]:
    """Throughput, latency and CPU per signal: a row per system, a column per shape."""
    systems = ["bare stack", "tidal full", PG, "tidal normal", "redis always", "redis everysec"]
    labels = [f"{c}x{p}" for c, p in SHAPES]

    def sps(system: str, shape: str) -> float:
        value: float = shapes[system][shape]["signals_per_s"]
        return value

    lines = [
        "## Signals per second (C clients x P pipelined)",
        "",
        "| system | " + " | ".join(labels) + " |",
        "|---|" + "---:|" * len(labels),
    ]
    for system in systems:
        cells = [f"{sps(system, s):,.0f} ({_span(shapes[system][s])})" for s in labels]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines += ["", "## Latency p50 / p99 (ms)", "", "| system | " + " | ".join(labels) + " |"]
    lines.append("|---|" + "---:|" * len(labels))
    for system in systems:
        cells = [
            f"{shapes[system][s]['p50_ms']:.2f} / {shapes[system][s]['p99_ms']:.2f}" for s in labels
        ]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    lines += ["", "## Server CPU per signal (µs, user + system, from /proc)", ""]
    lines += ["| system | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
    for system in systems:
        cells = [cpu_cell(shapes[system][s]) for s in labels]
        if system == PG:
            cells = [
                f"{cell} [{shapes[system][s].get('tidal_cpu_us') or 0:.1f}]"
                for cell, s in zip(cells, labels, strict=True)
            ]
        lines.append(f"| {system} | " + " | ".join(cells) + " |")
    return lines


def _other_shapes(results: dict[str, Any]) -> list[str]:
    extra, counts = results["extra"], results["counts"]
    lines: list[str] = []
    lines += [
        "",
        "## Other shapes",
        "",
        "| run | signals/s (range) | p50 ms | p99 ms |",
        "|---|---:|---:|---:|",
    ]
    for name, r in extra.items():
        rate = (
            f"{r['signals_per_s']:,.0f} ({_span(r)})"
            if r["signals_per_s"]
            else f"{r['requests_per_s']:,.0f} req/s"
        )
        lines.append(f"| {name} | {rate} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |")
    for name, r in counts.items():
        lines.append(
            f"| counts, ledger of {name} (16x16) | {r['requests_per_s']:,.0f} req/s"
            f" | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |"
        )
    return lines


def _footer() -> list[str]:
    return [
        "",
        "Redis has no `signal_batch`: its batch row sends 1,000 script calls in one write, and"
        " counts the request answered when all 1,000 replies are in.",
        "The mixed load is 95% signal, 4% status, 1% leave/rejoin: for Redis, `signal.lua`,"
        " `SISMEMBER`, `SADD` and `SREM`.",
        "",
        "![throughput against concurrency](benchmarks.png)",
        "",
    ]


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{c}x{p}" for c, p in SHAPES]
    fig, ax = plt.subplots(figsize=(8, 5))
    for system, by_shape in results["shapes"].items():
        ax.plot(labels, [by_shape[s]["signals_per_s"] for s in labels], marker="o", label=system)
    ax.set_xlabel("clients x pipelined requests")
    ax.set_ylabel("signals per second")
    ax.set_yscale("log")
    ax.set_title("Throughput against concurrency (one run of make bench)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
