"""``tidal``: the one console script (serve, call, status, stats, top, catalog, watch, groups,
receipt, health, backup, bench, cluster status).

It sits above the server and the client and imports from both; neither imports it.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from tidal.server.config import Config

from . import cluster, commands, groups, tables, watch
from .parser import tidal_parser
from .settings import TOKEN_SEEN, Parser, resolve_token


def _command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Parser:
    """The command's own parser: ``tidal status``, not ``tidal``."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and args.command in action.choices:
            found = action.choices[args.command]
            assert isinstance(found, Parser)
            return found
    raise AssertionError(f"no parser for {args.command}")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except BrokenPipeError:  # `tidal stats | head`: the reader left, which is no mistake
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv: Sequence[str] | None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser, settings = tidal_parser()
    args, extras = parser.parse_known_args(argv)
    if extras:  # told by the command they were given to
        _command(parser, args).unknown(extras)
    args.argv = list(argv)  # as given: a command printed for the next page repeats it
    settings.resolve(parser, args)
    resolve_token(parser, args, argv)
    if args.command == "serve":
        return _serve(args)
    if args.command == "bench":
        return commands.bench(args)
    if args.command == "backup":
        return commands.backup(args)
    if args.command in ("status", "stats"):
        return commands.readable(args)
    if args.command == "health":
        return commands.health(args)
    if args.command == "top":
        return tables.top(parser, args)
    if args.command == "catalog":
        return tables.catalog(args)
    if args.command == "groups":
        return groups.groups(args)
    if args.command == "receipt":
        return groups.receipt(args)
    if args.command == "watch":
        return watch.run(parser, args)
    if args.command == "cluster":
        return cluster.run(parser, args)
    return commands.call(args)


def _serve(args: argparse.Namespace) -> int:
    from tidal.server.errors import StartupError
    from tidal.server.logs import configure as configure_logs
    from tidal.server.main import run

    configure_logs(args.log_level, args.log_format, args.log_libraries)
    if args.token_in_argv:
        logging.getLogger("tidal.server").warning("%s", TOKEN_SEEN)
    # every field is a flag; an empty value (TIDAL_TLS_CERT=) means unset
    given: dict[str, Any] = {}
    for f in fields(Config):  # an optional setting given empty is off; others keep their rule
        value = getattr(args, f.name)
        given[f.name] = None if value == "" and f.default is None else value
    config = Config(**given)
    try:
        return run(config)
    except StartupError as exc:
        logging.getLogger("tidal.server").critical("%s", exc)
        return 2
