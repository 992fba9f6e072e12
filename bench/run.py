"""``make bench``: tidal side by side with Redis and the bare stack limit, in one run.

Every system gets the same shapes from the same load generator, ``tidal bench``:
MessagePack-RPC for tidal and the bare stack, the same requests as Redis commands
(RESP, ``--redis-sha``) for Redis. Each server starts on a fresh database, one
after the other, and its CPU time over each run is read from /proc. Only ratios
within one run mean much: absolute figures on a shared 2-core machine drift.

Writes bench/results.json, docs/BENCHMARKS.md and docs/benchmarks.png.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as bench/run.py
from bench.report import plot, report
from bench.scenarios import run_all
from bench.systems import ROOT, ensure_redis


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each shape (median)")
    parser.add_argument("--report-only", action="store_true", help="rewrite docs from results")
    args = parser.parse_args()
    results_path = ROOT / "bench" / "results.json"
    if args.report_only:
        results = json.loads(results_path.read_text())
    else:
        ensure_redis()
        results = run_all(args.scale, args.repeats)
        results_path.write_text(json.dumps(results, indent=1) + "\n")
    (ROOT / "docs" / "BENCHMARKS.md").write_text(report(results))
    plot(results, ROOT / "docs" / "benchmarks.png")
    print("wrote docs/BENCHMARKS.md and docs/benchmarks.png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
