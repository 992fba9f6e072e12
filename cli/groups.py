"""``tidal groups`` and ``tidal receipt USER``: the consumer groups, and what each did with
a user's latest opt-outs, as tables for people (``--json`` for scripts). What an operator
shows an auditor who asks whether a user's erasure has reached every copy."""

from __future__ import annotations

import argparse
import json
from typing import Any

from tidal.server import kinds
from tidal.server.kinds import Range

from .calls import iso
from .remote import remote
from .settings import Settings, client_options, rule
from .tables import table


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser], settings: Settings) -> None:
    groups = commands.add_parser(
        "groups",
        help="list the consumer groups: lag, pending, dead letters, consumers",
        description="Each consumer group: its cursor and lag (events, and the age of the"
        " oldest it has not settled), events out unacknowledged, dead letters and consumers.",
    )
    groups.add_argument("--json", action="store_true", help="print the reply as JSON")
    client_options(settings, groups)
    receipt = commands.add_parser(
        "receipt",
        help="what each consumer group did with a user's latest leave, purge and erase",
        description="For the user's latest leave, purge and erase: each group's word on it, as"
        " committed: acknowledged (applied, and when), pending (since when, sent how often),"
        " dead_letter (why), lost (retention deleted it before the group read it) or skipped"
        " (a group_reset passed it). Exit status 0 whatever the states.",
    )
    receipt.add_argument("user_id", type=rule(kinds.count, Range(0, 2**64 - 1)))
    receipt.add_argument("--json", action="store_true", help="print the receipt as JSON")
    client_options(settings, receipt)


def groups(args: argparse.Namespace) -> int:
    status, result = remote(args, "groups", [])
    if status != 0:
        return status
    if args.json:
        print(json.dumps(result))
        return 0
    if not result:
        print("(no consumer groups: tidal call group_create NAME makes one)")
        return 0
    rows = [("group", "cursor", "lag", "lag s", "pending", "oldest s", "dead", "consumers")]
    for g in result:
        oldest = g["oldest_unacked_seconds"]
        rows.append((
            g["name"] + (f" (lost {g['lost'][0]}..{g['lost'][1]})" if g["lost"] else ""),
            str(g["cursor"]), f"{g['lag_events']:,}", f"{g['lag_seconds']:.1f}",
            f"{g['pending']:,}", "-" if oldest is None else f"{oldest:.1f}",
            f"{g['dead_letters']:,}", str(len(g["consumers"])),
        ))  # fmt: skip
    table(rows, name=0)
    return 0


def receipt(args: argparse.Namespace) -> int:
    status, result = remote(args, "receipt", [args.user_id])
    if status != 0:
        return status
    if args.json:
        print(json.dumps(result))
        return 0
    if not result["optouts"]:
        print(f"user {args.user_id}: no leave, purge or erase recorded")
        return 0
    rows = [("opt-out", "event", "at", "group", "state", "detail")]
    for optout in result["optouts"]:
        words = optout["groups"] or {"-": {"state": "(no group follows it)"}}
        for name, word in sorted(words.items()):
            rows.append((optout["event"], str(optout["id"]), iso(optout["at_ns"]), name,
                         word["state"], _detail(word)))  # fmt: skip
    table(rows, name=3)
    return 0


def _detail(word: dict[str, Any]) -> str:
    state = word["state"]
    if state == "acknowledged":
        return f"at {iso(word['at_ns'])}"
    if state == "pending":
        sent = word["deliveries"]
        return f"since {iso(word['since_ns'])}, sent {sent} times" if sent else "not sent yet"
    if state == "dead_letter":
        return f"at {iso(word['at_ns'])}: {word['reason']}"
    if state == "lost":
        return "retention deleted it before the group read it"
    return ""
