"""``tidal``'s command line: a parser per command, each added by its own function, their
flags from the settings where they are settings (``settings``)."""

from __future__ import annotations

import argparse
from typing import Any, TypeAlias

from tidal.protocol.schemas import WINDOW_ALIASES, WINDOWS
from tidal.server import kinds
from tidal.server.kinds import Range
from tidal.server.version import VERSION, build

from . import calls, cluster, groups, watch
from .settings import Parser, Settings, client_options, rule, serve_options
from .workload import WORKLOADS

#: ``tidal``'s subcommands, each added by its own function below
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def tidal_parser() -> tuple[argparse.ArgumentParser, Settings]:
    parser: argparse.ArgumentParser = Parser(
        prog="tidal", description="tidal: a signal server with an instant, durable leave switch."
    )
    parser.add_argument("--version", action="version", version=f"tidal {VERSION} ({build()})")
    commands = parser.add_subparsers(dest="command", required=True)
    settings = Settings()
    serve_options(settings, commands.add_parser("serve", help="run the server"))
    _call(commands, settings)
    _backup(commands, settings)
    _status_and_stats(commands, settings)
    _top(commands, settings)
    _catalog(commands, settings)
    client_options(settings, watch.add(commands))
    groups.add(commands, settings)
    _health(commands, settings)
    cluster.add(commands, settings)
    _bench(commands, settings)
    return parser, settings


def _call(commands: Commands, settings: Settings) -> None:
    """tidal call METHOD ARGS..."""
    call = commands.add_parser(
        "call",
        help="call one method and print its result as JSON",
        description='Each argument is read as JSON where it parses (42, true, [1], {"a": 1},'
        ' "17"), as a string otherwise; one that starts like JSON ({, [ or ") must parse.'
        """ To send digits as a string, quote them as JSON: '"17"'. The number and kind"""
        " of arguments are checked before anything is sent. Binary values (a top"
        " cursor) are printed in base64, and read back from base64 where a method takes"
        " them. Exit status 1 on an error reply; 2 when the server cannot be reached or"
        " an argument cannot be sent.",
        epilog=calls.listing(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    call.add_argument("method")
    call.add_argument("args", nargs="*")
    client_options(settings, call)


def _backup(commands: Commands, settings: Settings) -> None:
    """tidal backup DEST"""
    backup = commands.add_parser(
        "backup",
        help="copy the database, consistently, while the server runs",
        description="Takes a consistent snapshot with SQLite's backup API while the server keeps"
        " serving and writing; run it where the database file is (e.g. docker compose exec tidal"
        " tidal backup /data/backup.db). Restore: stop the server, put the copy in place of the"
        " database (removing its -wal and -shm files), start the server.",
    )
    backup.add_argument("dest", help="the file to create (never overwritten)")
    settings.add(backup, "--db", "TIDAL_DB", "./tidal.db", "the database to copy")


def _status_and_stats(commands: Commands, settings: Settings) -> None:
    """tidal status USER_ID, tidal stats"""
    for name, text in (("status", "a user's membership"), ("stats", "the server's figures")):
        sub = commands.add_parser(name, help=f"print {text}, readably")
        if name == "status":
            sub.add_argument("user_id", type=USER_ID, help="0 to 2**64-1")
        sub.add_argument("--json", action="store_true", help="print the reply as one JSON object")
        client_options(settings, sub)


def _top(commands: Commands, settings: Settings) -> None:
    """tidal top LAYER [NAME] KIND"""
    top = commands.add_parser(
        "top",
        help="print a ranking: what is most viewed, liked or trending in a layer",
        description="tidal top community jazz view --window 24h; tidal top ledger view;"
        " tidal top cohort germany like --by trend --half-life 6h. Exit status 1 on an"
        " error reply (an unknown cohort, a half-life the server does not rank by).",
    )
    top.add_argument("layer", choices=("ledger", "cohort", "community"))
    top.add_argument(
        "name_and_kind",
        nargs="+",
        metavar="[NAME] KIND",
        help="the cohort's or community's name (none for the ledger), then the kind",
    )
    top.add_argument("--by", choices=("count", "weight", "trend"), default="count")
    top.add_argument("--window", choices=WINDOWS[1:] + tuple(WINDOW_ALIASES) + WINDOWS[:1],
                     help="(default all)")  # fmt: skip
    top.add_argument("--half-life", help="with --by trend: one of the server's --trend-half-lives")
    top.add_argument(
        "--limit",
        type=rule(kinds.count, Range(1, 1000)),
        default=10,
        help="entities, 1..1000 (default 10)",
    )
    top.add_argument(
        "--after",
        help="the next page: as the table printed it below the page before (N:cursor, the"
        " ranks going on from N+1), or the 'next' that --json printed (base64)",
    )
    top.add_argument(
        "--json", action="store_true", help="print the reply as one JSON object (next in base64)"
    )
    client_options(settings, top)


def _catalog(commands: Commands, settings: Settings) -> None:
    """tidal catalog [LAYER]"""
    catalog = commands.add_parser(
        "catalog",
        help="list what is stored: the communities, cohorts or the ledger's kinds, counted",
        description="tidal catalog; tidal catalog cohort; tidal catalog ledger (its kinds)."
        " A page at a time in name order, each name with its aggregates (the entities and"
        " kinds it counts) and the signals they count; the command for the next page is"
        " printed below.",
    )
    catalog.add_argument(
        "layer", nargs="?", default="community", choices=("community", "cohort", "ledger")
    )
    catalog.add_argument("--after", help="the next page: the name the page before ended on")
    catalog.add_argument(
        "--limit", type=rule(kinds.count, Range(1, 1000)), default=20, help="1..1000 (default 20)"
    )
    catalog.add_argument("--json", action="store_true", help="print the reply as one JSON object")
    client_options(settings, catalog)


def _health(commands: Commands, settings: Settings) -> None:
    """tidal health"""
    health = commands.add_parser(
        "health",
        help="exit 0 if the server is ready and its storage takes writes, 1 otherwise",
        description="For health checks (Docker's HEALTHCHECK, Kubernetes' exec probes): prints"
        " ok, starting (the database is still loading) or failing (and why), and exits 0 only"
        " for ok. A server that cannot be reached, or does not answer within --timeout, is"
        " unhealthy too (exit 1).",
    )
    client_options(settings, health)


def _bench(commands: Commands, settings: Settings) -> None:
    """tidal bench"""
    bench = commands.add_parser(
        "bench",
        help="measure throughput and latency against a running server",
        description="Like redis-benchmark: CLIENTS connections each keep PIPELINE requests in"
        " flight until REQUESTS have been answered. Its users (ids from 2**48), entities"
        " (bench:e0 ..), communities (bench:c0 ..) and cohort (bench-de) are its own, and"
        " it erases and rejoins its users and drops its cohort after the run (--keep: not)."
        " It refuses a server that holds data, unless --allow-data. --left-fraction makes"
        " its first USERS*F users leave first.",
    )
    client_options(settings, bench, tls=False)
    bench.add_argument(
        "--clients", "-c", type=_some(10_000), default=50, help="connections (default 50)"
    )
    bench.add_argument(
        "--pipeline",
        "-P",
        type=_some(100_000),
        default=1,
        help="requests in flight per connection (1)",
    )
    bench.add_argument(
        "--requests",
        "-n",
        type=_some(10**9),
        default=None,
        help="total (100000; with the batch workloads, 100000 signals: 100 batches of 1000)",
    )
    bench.add_argument(
        "--workload",
        choices=WORKLOADS,
        default="signal",
        help="mixed: 95%% signal, 4%% status, 1%% leave/rejoin; batch_compact: signal_batch"
        " with the compact ack; top, top_window (24h) and top_trend: the top 10 of"
        " community bench:c0 (default signal)",
    )
    bench.add_argument(
        "--batch-size", type=_some(100_000), default=1000, help="signals per batch (1000)"
    )
    bench.add_argument(
        "--users", type=_some(2**40), default=100_000, help="distinct users (100000)"
    )
    bench.add_argument(
        "--entities", type=_some(10**9), default=1000, help="distinct entities (1000)"
    )
    bench.add_argument(
        "--left-fraction",
        type=rule(kinds.number, Range(0, 1)),
        default=0.0,
        help="share of users who leave first, 0 to 1 (0)",
    )
    _bench_run(bench)


def _bench_run(bench: argparse.ArgumentParser) -> None:
    """``tidal bench``'s options about the run, not the load: what it measures and drives,
    and what it may touch."""
    bench.add_argument(
        "--server-pid",
        type=_some(2**31),
        help="the server's process id, when it runs here: its CPU time per signal is reported",
    )
    bench.add_argument(
        "--redis-sha",
        help="drive a Redis server instead, through the SHA of bench/signal.lua loaded there"
        " (SCRIPT LOAD): the same requests, as Redis commands",
    )
    bench.add_argument(
        "--http-port",
        type=_some(65535),
        help="send the requests to tidal's HTTP edge (--http) on this port, as JSON; the"
        " set-up and clean-up go through --port",
    )
    bench.add_argument(
        "--own-users",
        action="store_true",
        help="cluster mode: only users of the partitions the node serves (no moved answers)",
    )
    bench.add_argument(
        "--allow-data",
        action="store_true",
        help="run on a server that holds other data (bench touches only what it makes)",
    )
    bench.add_argument(
        "--keep",
        action="store_true",
        help="leave what the run made (a throwaway database): no erase and rejoin after",
    )
    bench.add_argument("--json", action="store_true", help="print one JSON object")


USER_ID = rule(kinds.count, Range(0, 2**64 - 1))


def _some(most: int) -> Any:
    """A count from 1 to ``most``."""
    return rule(kinds.count, Range(1, most))
