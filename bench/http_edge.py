"""HTTP/JSON beside MessagePack-RPC: the same signals from the same load generator
(``tidal bench``, with ``--http-port`` for the HTTP row), to one server that serves both,
at 16 keep-alive connections one request deep and 16 deep, in rounds that alternate the
two; the server's CPU per signal from /proc, and their ratio per round."""

from __future__ import annotations

import sys
import time
from typing import Any

from bench.systems import free_port, tidal_bench, tidal_server

#: (connections, requests in flight on each)
HTTP_SHAPES = ((16, 1), (16, 16))


def http_figures(scale: float, rounds: int = 3) -> dict[str, Any]:
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d")}
    for c, p in HTTP_SHAPES:
        n = max(4000, int(40_000 * scale))
        runs: dict[str, list[dict[str, Any]]] = {"msgpack": [], "http": []}
        port = free_port()
        with tidal_server("full", extra=("--http", f"127.0.0.1:{port}")) as srv:
            for _ in range(rounds):
                runs["msgpack"].append(tidal_bench(srv, c, p, n))
                runs["http"].append(tidal_bench(srv, c, p, n, http_port=port))
        ratios = sorted(
            h["server_cpu_us"] / m["server_cpu_us"]
            for m, h in zip(runs["msgpack"], runs["http"], strict=True)
        )
        shape = f"{c}x{p}"
        out[shape] = {
            "msgpack": _median(runs["msgpack"]),
            "http": _median(runs["http"]),
            "cpu_ratio": ratios[len(ratios) // 2],
            "cpu_ratio_range": [ratios[0], ratios[-1]],
            "requests": n,
        }
        print(f"http {shape}: CPU ratio {out[shape]['cpu_ratio']:.2f}", file=sys.stderr)
    return out


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ordered = sorted(runs, key=lambda r: float(r["server_cpu_us"]))
    return ordered[len(ordered) // 2]


def http_report(figures: dict[str, Any] | None) -> list[str]:
    if not figures:
        return []
    lines = [
        "",
        "## HTTP/JSON beside MessagePack-RPC",
        "",
        "The same signals from the same load generator (`tidal bench`, `--http-port` for"
        " HTTP: `POST /v1/signal` with a JSON body, keep-alive, pipelined as deep as the"
        " shape says) to one tidal serving both ports, rounds alternating the two; the"
        f" median round of each (`bench/http_edge.py`, on {figures['date']}: compare within this"
        " section). The target: HTTP's"
        " CPU per signal within 2x of MessagePack's.",
        "",
        "| shape | MessagePack signals/s | HTTP signals/s | MessagePack CPU µs | HTTP CPU µs"
        " | HTTP / MessagePack CPU (range) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for shape, f in figures.items():
        if shape == "date":
            continue
        m, h = f["msgpack"], f["http"]
        low, high = f["cpu_ratio_range"]
        lines.append(
            f"| {shape} | {m['signals_per_s']:,.0f} | {h['signals_per_s']:,.0f}"
            f" | {m['server_cpu_us']:.1f} | {h['server_cpu_us']:.1f}"
            f" | {f['cpu_ratio']:.2f}x ({low:.2f}-{high:.2f}) |"
        )
    return lines
