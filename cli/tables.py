"""The ranked reads printed for people: ``top`` and ``catalog`` as tables, each with the
command for its next page."""

from __future__ import annotations

import argparse
import json
import shlex
from collections.abc import Sequence
from typing import Any

from . import calls
from .calls import iso
from .remote import remote


def top(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """A ranking as a table a person reads (or, with --json, the reply as it came)."""
    want = 1 if args.layer == "ledger" else 2
    if len(args.name_and_kind) != want:
        parser.error(
            "top ledger KIND takes no name" if want == 1 else f"top {args.layer} NAME KIND"
        )
    name = None if want == 1 else args.name_and_kind[0]
    options: dict[str, Any] = {"limit": args.limit}
    if args.by != "count":
        options["by"] = args.by
    if args.window is not None:
        options["window"] = args.window
    if args.half_life is not None:
        options["half_life"] = args.half_life
    before = 0  # entities on the pages before this one: the ranks go on from there
    if args.after is not None:
        counted, colon, cursor = args.after.partition(":")
        if colon and counted.isascii() and counted.isdigit():
            before, args.after = int(counted), cursor  # as the table printed it: N:cursor
        options["after"] = args.after  # base64, as --json printed it
    params = calls.sendable("top", [args.layer, name, args.name_and_kind[-1], options])
    status, result = remote(args, "top", params)
    if status != 0:
        return status
    if args.json:  # the cursor is bytes: shown in base64, as --after takes it
        print(json.dumps(result, default=calls.shown))
        return 0
    rows = [("rank", "entity", "count", "weight", "score")]
    for rank, e in enumerate(result["entities"], before + 1):
        score = f"{e['score']:,.0f}" if args.by == "count" else f"{e['score']:,.6g}"
        rows.append((str(rank), e["entity"], f"{e['count']:,}", f"{e['weight']:,.6g}", score))
    table(rows, name=1)
    if len(rows) == 1 and args.after is None:
        where = "the ledger" if name is None else f"{args.layer} {name!r}"
        within = f" in the last {args.window}" if args.window not in (None, "all") else ""
        print(f"(nothing counted in {where} under kind {args.name_and_kind[-1]!r}{within})")
    print(f"as of {iso(result['as_of_ns'])}" + (", more after these:" if result["next"] else ""))
    if result["next"]:  # the same command, for the page after this one
        after = f"{before + len(result['entities'])}:{calls.shown(result['next'])}"
        print("  " + shlex.join(["tidal", *_without_after(args.argv), "--after", after]))
    return 0


def catalog(args: argparse.Namespace) -> int:
    """What is stored, a page at a time: a table, and the command for the next page."""
    page: dict[str, Any] = {"limit": args.limit}
    if args.after is not None:
        page["after"] = args.after
    status, result = remote(args, "catalog", [args.layer, page])
    if status != 0:
        return status
    if args.json:
        print(json.dumps(result))
        return 0
    what = {"community": "community", "cohort": "cohort", "ledger": "kind"}[args.layer]
    rows = [(what, "aggregates", "signals")]
    rows += [(i["name"], f"{i['aggregates']:,}", f"{i['count']:,}") for i in result["items"]]
    table(rows, name=0)
    if len(rows) == 1:
        print(f"(no {what} stored" + (f" after {args.after!r})" if args.after else ")"))
    if result["next"] is not None:
        print("more after these:")
        again = ["tidal", *_without_after(args.argv), "--after", result["next"]]
        print("  " + shlex.join(again))
    return 0


def _without_after(argv: list[str]) -> list[str]:
    kept, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--after":
            skip = True
        elif not arg.startswith("--after="):
            kept.append(arg)
    return kept


def table(rows: Sequence[Sequence[str]], name: int) -> None:
    """Rows in aligned columns: the name's column to the left, the figures to the right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        cells = (
            c.ljust(w) if i == name else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        print("  ".join(cells))
