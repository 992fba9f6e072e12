"""``tidal watch``: the change feed, one event per line as it happens (as ``redis-cli
monitor`` shows commands), resuming by itself across reconnects and restarts."""

from __future__ import annotations

import argparse
import json
import ssl
import sys

from tidal.protocol.limits import FEED_EVENTS
from tidal.server import kinds
from tidal.server.kinds import Range

from .settings import rule

EVENT_ID = rule(kinds.count, Range(0, 2**63 - 1))


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    watch = commands.add_parser(
        "watch",
        help="print each leave, rejoin, purge, erase and cohort change as it happens",
        description="One event per line, as the server commits it: its id, time, name and"
        " fields (--json: the event as one JSON object). It resumes by itself after a"
        " dropped connection or a restart, from the last event printed. Exit status 1 when"
        " the events after --from are no longer kept (--event-retention), 2 when the server"
        " cannot be reached.",
    )
    watch.add_argument(
        "--from", dest="from_id", type=EVENT_ID, help="replay the events after this id"
    )
    watch.add_argument(
        "--events", help=f"only these, comma-separated: {','.join(FEED_EVENTS)} (default all)"
    )
    watch.add_argument("--json", action="store_true", help="print each event as JSON")
    return watch


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from tidal.client import ClientError, FeedGap, ServerError, SyncClient, TidalError

    events = None if args.events is None else [e.strip() for e in args.events.split(",")]
    if events is not None and not set(events) <= set(FEED_EVENTS):
        unknown = ", ".join(e for e in events if e not in FEED_EVENTS)
        parser.error(f"--events: unknown {unknown}; each one of {', '.join(FEED_EVENTS)}")
    try:
        tls = ssl.create_default_context(cafile=args.tls_ca) if args.tls or args.tls_ca else None
    except OSError as exc:
        print(f"tidal watch: --tls-ca {args.tls_ca}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    try:
        with SyncClient(
            args.host, args.port, timeout=args.timeout, token=args.token, ssl=tls
        ) as client, client.subscribe(args.from_id, events) as feed:  # fmt: skip
            for event in feed:
                wire = event.wire()
                if args.json:
                    print(json.dumps(wire), flush=True)
                    continue
                fields = " ".join(
                    f"{k}={json.dumps(v)}" for k, v in wire.items() if k not in ("id", "event")
                )
                print(f"{event.id} {event.event} {fields}", flush=True)
    except (KeyboardInterrupt, BrokenPipeError):  # stopped, or what reads it did
        return 0
    except FeedGap as exc:
        print(f"tidal watch: {exc.message}", file=sys.stderr)
        return 1
    except (ServerError, ClientError) as exc:
        print(f"tidal watch: {exc}", file=sys.stderr)
        return 1
    except TidalError as exc:
        print(f"cannot reach tidal at {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    return 0
