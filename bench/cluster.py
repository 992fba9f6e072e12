"""Cluster mode's costs on this machine, every system on the same PostgreSQL and driven by
the same load generator (``tidal bench``, 16 connections x 16 in flight):

- a node's CPU per signal against one tidal not in cluster mode: one node serving every
  partition (the cost of cluster mode itself: the ownership check, the fence, the commit
  log), in alternating rounds and in rounds loading both at once; then each of three
  nodes taking a third of the users (``--own-users``), all three loaded at once (each
  also applies the other two's commit log records);
- ``counts`` and ``top`` one at a time, against one tidal and against a node of three
  (which first reads the commit log to its end);
- a takeover: kill -9 of one of three nodes, until the other two serve every partition;
- the commit log over a long history: its rows after each third of the signals (it is
  pruned below checkpoints), and a node's boot after that history against its boot after
  a tenth of it, with a board of the same shape (the same users, entities, communities).

Two cores run the three nodes, PostgreSQL and the load generators here: the three-node
throughput is not what three machines give. ``model`` works that out from the per-node
CPU figures. Run alone: ``python bench/cluster.py`` prints the figures as JSON.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as bench/cluster.py
from bench import nodes as started
from bench.cluster_log import history, history_report
from bench.nodes import SHAPE
from bench.systems import TIDAL, postgres_cpu_s, stop
from tidal.cli.child import Child, start
from tidal.testing.postgres import Cluster


def _signals(pg: Cluster, nodes: list[Child], requests: int, *extra: str) -> dict[str, Any]:
    """Every node loaded at once; each node's figures, and the database's CPU per signal."""
    before = postgres_cpu_s(pg)
    runs = [started.bench(n, requests // len(nodes), *extra) for n in nodes]
    results = [started.result(r) for r in runs]
    signals = sum(r["signals_per_s"] * r["seconds"] for r in results)
    cpu = sum(r["server_cpu_us"] * r["signals_per_s"] * r["seconds"] for r in results)
    return {
        "nodes": results,
        "signals_per_s": sum(r["signals_per_s"] for r in results),
        "tidal_cpu_us": cpu / signals,
        "database_cpu_us": (postgres_cpu_s(pg) - before) * 1e6 / signals,
    }


def _reads(node: Child, workload: str, requests: int) -> dict[str, Any]:
    run = subprocess.run(
        [TIDAL, "bench", "--port", str(node.port), "-c", "1", "-P", "1", "-n", str(requests),
         "--workload", workload, "--json", "--server-pid", str(node.proc.pid), "--allow-data",
         "--keep"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    result: dict[str, Any] = json.loads(run.stdout)
    return {k: result[k] for k in ("requests_per_s", "p50_ms", "p99_ms", "server_cpu_us")}


#: rounds of each, alternating: one tidal, then one node, and again
ROUNDS = 3


def _alternating(pg: Cluster, single: Child, one: Child, requests: int) -> dict[str, Any]:
    """One tidal and one cluster node serving every partition, both running, loaded in
    turn (one tidal, one node, one tidal, ...): what drifts on a shared machine drifts for
    both alike. Each one's median round by CPU per signal, and every round's ratio."""
    singles, nodes = [], []
    for _ in range(ROUNDS):
        singles.append(_signals(pg, [single], requests // ROUNDS))
        nodes.append(_signals(pg, [one], requests // ROUNDS, "--own-users"))

    def median(rounds: list[dict[str, Any]]) -> dict[str, Any]:
        return sorted(rounds, key=lambda r: r["tidal_cpu_us"])[len(rounds) // 2]

    ratios = [n["tidal_cpu_us"] / s["tidal_cpu_us"] for s, n in zip(singles, nodes, strict=True)]
    return {"single": median(singles), "one_node": median(nodes), "cost_ratios": ratios}


#: rounds of both loaded at once
AT_ONCE_ROUNDS = 8


def _at_once(single: Child, one: Child, requests: int) -> list[float]:
    """The same two, loaded at the same time, round after round: each round's ratio of
    CPU per signal, node to tidal. This machine's speed drifts by 10-20% from one round to
    the next (a shared virtual machine); loaded in the same seconds, both see the same
    drift, and the ratios spread by a few percent only."""
    ratios = []
    for _ in range(AT_ONCE_ROUNDS):
        runs = [
            started.bench(single, requests // AT_ONCE_ROUNDS),
            started.bench(one, requests // AT_ONCE_ROUNDS, "--own-users"),
        ]
        cpu = [started.result(r)["server_cpu_us"] for r in runs]
        ratios.append(cpu[1] / cpu[0])
    return ratios


def cluster_figures(scale: float = 1.0) -> dict[str, Any]:
    requests = max(20_000, int(200_000 * scale))
    reads = max(500, int(2_000 * scale))
    pg = Cluster()
    figures: dict[str, Any] = {"shape": "x".join(SHAPE), "requests": requests}
    try:
        with started.database(pg) as single_url, started.database(pg) as node_url:
            single = start([TIDAL, "serve", "--port", "0", "--db", single_url])
            one = started.node(node_url)
            try:
                started.served([one])
                figures.update(_alternating(pg, single, one, requests))
                figures["at_once_ratios"] = _at_once(single, one, requests)
                figures["single_counts"] = _reads(single, "counts", reads)
                figures["single_top"] = _reads(single, "top", reads)
            finally:
                stop(single)
                stop(one)
        with started.database(pg) as url:
            three = [started.node(url) for _ in range(3)]
            try:
                figures["settled_s"] = started.served(three)
                figures["three_nodes"] = _signals(pg, three, requests, "--own-users")
                figures["cluster_counts"] = _reads(three[1], "counts", reads)
                figures["cluster_top"] = _reads(three[1], "top", reads)
                killed = time.monotonic()
                os.kill(three[2].proc.pid, signal.SIGKILL)
                three[2].proc.wait()
                started.served(three[:2])
                figures["takeover_s"] = time.monotonic() - killed
            finally:
                for n in three:
                    if n.proc.poll() is None:
                        stop(n)
        long = max(60_000, int(300_000 * scale))
        figures["short_history"] = history(pg, long // 10, thirds=False)
        figures["long_history"] = history(pg, long, thirds=True)
    finally:
        pg.destroy()
    figures["model"] = model(figures)
    return figures


def model(f: dict[str, Any]) -> dict[str, Any]:
    """Three nodes on three machines, from the per-node figures: each node's core spends
    its own signals' CPU (``one_node``) and applies the others' log records (what
    ``three_nodes`` costs a node past that, per signal of the cluster); the database's
    CPU per signal is the same wherever the load comes from."""
    own = f["one_node"]["tidal_cpu_us"]
    three = f["three_nodes"]["tidal_cpu_us"]  # per signal, each node counting its own
    # a node of three spends `three` per own signal, of which `own` is its own work and the
    # rest the two others' records: per record-signal applied
    apply = max(0.0, (three - own) / 2)
    per_node = {n: 1e6 / (own + (n - 1) * apply) for n in (1, 2, 3, 4, 8)}
    return {
        "own_us": own,
        "apply_us_per_signal": apply,
        "node_signals_per_s": {n: round(per_node[n]) for n in per_node},
        "cluster_signals_per_s": {n: round(n * per_node[n]) for n in per_node},
        "database_cpu_us": f["three_nodes"]["database_cpu_us"],
    }


def cluster_report(f: dict[str, Any] | None) -> list[str]:
    if not f:
        return []
    single, one, three, m = f["single"], f["one_node"], f["three_nodes"], f["model"]
    nodes = ", ".join(f"{n['server_cpu_us']:.1f}" for n in three["nodes"])
    rows = [
        ("one tidal, not in cluster mode", single),
        ("one cluster node serving every partition", one),
        ("three cluster nodes, a third of the users each, loaded at once", three),
    ]
    return [
        "",
        "## More than one node",
        "",
        f"`bench/cluster.py`: {f['requests']:,} signals at {f['shape']} on one PostgreSQL, the"
        " same load generator for each; CPU from `/proc`, tidal's per signal (three nodes: their"
        " sum over the cluster's signals) and the database's.",
        "",
        "| | signals/s | tidal CPU µs/signal | PostgreSQL CPU µs/signal |",
        "|---|---:|---:|---:|",
        *(
            f"| {name} | {r['signals_per_s']:,.0f} | {r['tidal_cpu_us']:.1f}"
            f" | {r['database_cpu_us']:.1f} |"
            for name, r in rows
        ),
        "",
        f"Cluster mode on one node: {one['tidal_cpu_us'] / single['tidal_cpu_us']:.2f}x the CPU"
        f" per signal of one tidal (median rounds; round by round, alternating:"
        f" {', '.join(f'{r:.2f}x' for r in f.get('cost_ratios', []))}); both loaded at once,"
        f" round after round, {statistics.median(f['at_once_ratios']):.2f}x (median of"
        f" {', '.join(f'{r:.2f}x' for r in f['at_once_ratios'])}). Each of three nodes"
        f" ({nodes} µs per own signal) also applies the other two's commit log records:"
        f" {m['apply_us_per_signal']:.1f} µs per signal applied.",
        "",
        "| read, one at a time | requests/s | p50 ms | p99 ms | server CPU µs/request |",
        "|---|---:|---:|---:|---:|",
        *(
            f"| {name} | {r['requests_per_s']:,.0f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f}"
            f" | {r['server_cpu_us']:.0f} |"
            for name, r in (
                ("`counts`, one tidal", f["single_counts"]),
                ("`counts`, a node of three", f["cluster_counts"]),
                ("`top`, one tidal", f["single_top"]),
                ("`top`, a node of three", f["cluster_top"]),
            )
        ),
        "",
        f"kill -9 of one of three nodes → every partition served by the other two:"
        f" {f['takeover_s']:.2f} s.",
        *history_report(f.get("short_history"), f.get("long_history")),
        "",
        "Three machines, modelled from the per-node CPU (each node's core spends its own"
        f" signals' {m['own_us']:.1f} µs and {m['apply_us_per_signal']:.1f} µs per signal of each"
        " other node):",
        "",
        "| nodes | signals/s per node | cluster signals/s |",
        "|---:|---:|---:|",
        *(
            f"| {n} | {m['node_signals_per_s'][n]:,} | {m['cluster_signals_per_s'][n]:,} |"
            for n in m["node_signals_per_s"]
        ),
    ]


if __name__ == "__main__":
    print(json.dumps(cluster_figures(float(sys.argv[1]) if len(sys.argv) > 1 else 1.0), indent=1))
