"""``tidal watch``: the change feed, one event per line as it happens (as ``redis-cli
monitor`` shows commands), resuming by itself across reconnects and restarts."""

from __future__ import annotations

import argparse
import json
import ssl
import sys
import time

from tidal.protocol.limits import FEED_EVENTS
from tidal.server import kinds
from tidal.server.kinds import Range

from .calls import iso
from .settings import rule

EVENT_ID = rule(kinds.count, Range(0, 2**63 - 1))


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    watch = commands.add_parser(
        "watch",
        help="print each leave, rejoin, purge, erase and cohort change as it happens",
        description="One event per line, as the server commits it: its id, name, fields and"
        " times in ISO-8601 (--json: the event as one JSON object, times in nanoseconds). It"
        " resumes by itself after a dropped connection or a restart of any length, from the"
        " last event printed, trying again with a growing pause (up to 30 s) until"
        " interrupted; it says so on stderr meanwhile. Exit status 1 when the events after"
        " --from are no longer kept (--event-retention), 2 when the server cannot be"
        " reached at the start.",
    )
    watch.add_argument(
        "--from", dest="from_id", type=EVENT_ID, help="replay the events after this id"
    )
    watch.add_argument(
        "--events", help=f"only these, comma-separated: {','.join(FEED_EVENTS)} (default all)"
    )
    watch.add_argument("--json", action="store_true", help="print each event as JSON")
    watch.add_argument(
        "--group",
        help="consume as one of this consumer group: its share of the events, each"
        " acknowledged once printed (the group's cursor moves on)",
    )
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
    if args.group is not None:
        if args.from_id is not None or events is not None:
            parser.error("--group: a group reads from its own cursor, and takes the events"
                         " group_create gave it: no --from or --events with it")  # fmt: skip
        return consume(args, tls)
    last = args.from_id  # the last event printed: where a resumed feed starts
    pause = 0.0  # seconds before the next try, once the server was lost
    lost_at = 0.0
    while True:
        try:
            with SyncClient(
                args.host, args.port, timeout=args.timeout, token=args.token, ssl=tls
            ) as client, client.subscribe(last, events) as feed:  # fmt: skip
                last = feed.last_id  # where it starts: after this, should it be lost
                if pause:
                    away = time.monotonic() - lost_at
                    print(f"tidal watch: resumed after {away:.0f} s", file=sys.stderr, flush=True)
                    pause = 0.0
                for event in feed:
                    print(json.dumps(event.wire()) if args.json else line(event.wire()), flush=True)
                    last = feed.last_id
        except (KeyboardInterrupt, BrokenPipeError):  # stopped, or what reads it did
            return 0
        except FeedGap as exc:
            print(f"tidal watch: {exc.message}", file=sys.stderr)
            return 1
        except (ServerError, ClientError) as exc:
            print(f"tidal watch: {exc}", file=sys.stderr)
            return 1
        except TidalError as exc:
            if last is None and not pause:  # never reached: nothing to resume
                print(f"cannot reach tidal at {args.host}:{args.port}: {exc}", file=sys.stderr)
                return 2
            if not pause:
                lost_at = time.monotonic()
            pause = min(max(pause * 2, 0.5), MAX_PAUSE)
            print(
                f"tidal watch: lost {args.host}:{args.port} ({exc}); trying again in"
                f" {pause:g} s (Ctrl-C stops)",
                file=sys.stderr,
                flush=True,
            )
            try:
                time.sleep(pause)  # a pause between tries, not a wait for a state
            except KeyboardInterrupt:
                return 0
        else:
            return 0


def consume(args: argparse.Namespace, tls: ssl.SSLContext | None) -> int:
    """``--group``: each delivery printed, with how often it was sent, then acknowledged;
    the consumer reconnects by itself (what it had not acknowledged comes again), in
    cluster mode to the node serving the groups then, whichever node it was given."""
    from tidal.client import ServerError, SyncClusterClient, TidalError

    try:
        with SyncClusterClient(
            args.host, args.port, timeout=args.timeout, token=args.token, ssl=tls
        ) as client, client.consume(args.group) as deliveries:  # fmt: skip
            for d in deliveries:
                wire = d.event.wire()
                shown = (
                    json.dumps({**wire, "deliveries": d.deliveries}) if args.json else line(wire)
                )
                print(shown if args.json else f"{shown} deliveries={d.deliveries}", flush=True)
                d.ack()
    except (KeyboardInterrupt, BrokenPipeError):
        return 0
    except ServerError as exc:
        print(f"tidal watch: {exc.message}", file=sys.stderr)
        return 1
    except TidalError as exc:
        print(f"cannot reach tidal at {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2
    return 0


#: the longest pause between tries to reach a server that is away
MAX_PAUSE = 30.0


def line(wire: dict[str, object]) -> str:
    """An event for people: its id and name, then its fields, a time in ISO-8601."""
    fields = " ".join(
        f"{k[:-3]}={iso(v)}" if k.endswith("_ns") and type(v) is int else f"{k}={json.dumps(v)}"
        for k, v in wire.items()
        if k not in ("id", "event")
    )
    return f"{wire['id']} {wire['event']} {fields}"
