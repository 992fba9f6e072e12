"""Flags that fall back on ``TIDAL_*`` variables, and the token options every command shares.

``serve``'s flags are made from the settings declared in ``tidal.server.config``.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import MISSING, fields
from typing import Any, NamedTuple, NoReturn

from tidal.server import kinds
from tidal.server.config import Config, env, flag, half_lives
from tidal.server.host import parse_size
from tidal.server.kinds import Range


class Setting(NamedTuple):
    dest: str
    flag: str
    env: str
    default: str | None
    convert: Callable[[str], Any]
    choices: tuple[str, ...] | None


class Settings:
    """Flags whose defaults come from ``TIDAL_*`` variables.

    argparse checks a flag's value, but a default taken from the environment would
    reach the program unchecked (a bad choice), or be blamed on the flag (a bad
    number). So a flag's default stays unset, and ``resolve`` fills it from the
    environment afterwards, naming the variable when its value breaks the rule.
    """

    def __init__(self) -> None:
        self.by_command: dict[str, list[Setting]] = {}

    def add(
        self,
        parser: argparse.ArgumentParser,
        flag: str,
        env: str,
        default: str | None,
        text: str,
        *,
        type: Callable[[str], Any] = str,
        choices: tuple[str, ...] | None = None,
        short: str | None = None,
    ) -> None:
        shown = "off" if default is None else default
        convert = _lower if choices else type
        action = parser.add_argument(
            *((short,) if short else ()),
            flag,
            default=argparse.SUPPRESS,
            type=convert,
            choices=choices,
            help=f"{text} (env {env}; default {shown})".replace("%", "%%"),  # argparse's %
        )
        spec = Setting(action.dest, flag, env, default, convert, choices)
        self.by_command.setdefault(parser.prog.split()[-1], []).append(spec)

    def resolve(self, parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
        for spec in self.by_command.get(args.command, ()):
            if hasattr(args, spec.dest):
                continue
            # an empty variable is unset: a compose file's ${TIDAL_HOST} with nothing behind
            # it must not mean an empty host, which binds every interface
            raw = os.environ.get(spec.env) or None
            if raw is None:
                value = None if spec.default is None else spec.convert(spec.default)
            else:
                try:
                    value = spec.convert(raw)
                except (ValueError, argparse.ArgumentTypeError) as exc:
                    refuse(parser, f"{spec.env}={raw!r}: {_rule(exc)}")
                if spec.choices is not None and value not in spec.choices:
                    refuse(parser, f"{spec.env}={raw!r}: must be one of {', '.join(spec.choices)}")
            setattr(args, spec.dest, value)


class Parser(argparse.ArgumentParser):
    """Any mistake on the command line in one line, naming it: not the usage first (for
    ``serve``, thirty lines before the one that matters)."""

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '(.*?)' \(choose from (.*)\)$", message)
        if choice is not None:
            offered = re.findall(r"'([^']*)'", choice[2])
            message += _nearest(choice[1], offered)
        self.exit(2, f"{self.prog}: {message} (--help lists what it takes)\n")

    def unknown(self, extras: Sequence[str]) -> NoReturn:
        """Arguments this command does not take, named by this command (not by ``tidal``),
        with the nearest flag it does take, as git and cargo suggest."""
        flags = [o for action in self._actions for o in action.option_strings]
        hint = "".join(
            _nearest(extra.split("=", 1)[0], flags, 0.7)
            for extra in extras
            if extra.startswith("-")
        )
        self.error(f"unrecognized arguments: {' '.join(extras)}{hint}")


def _nearest(given: str, offered: Sequence[str], cutoff: float = 0.6) -> str:
    near = difflib.get_close_matches(given, offered, n=2, cutoff=cutoff)
    return f"; did you mean {' or '.join(map(repr, near))}?" if near else ""


def refuse(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """One line and exit 2: a bad environment variable or file is not a usage mistake."""
    parser.exit(2, f"{parser.prog}: {message}\n")


def _lower(value: str) -> str:
    return value.lower()


def _rule(exc: Exception) -> str:
    return str(exc)


def rule(parse: Callable[[str], Any], bounds: Range | None = None, unit: str = "") -> Any:
    """An argparse ``type`` from a kind's rule (``tidal.server.kinds``) and its range: the
    value refused in the rule's words, which argparse puts after the flag's name."""

    def convert(text: str) -> Any:
        try:
            value = parse(text)
            if bounds is not None:
                kinds.within(value, bounds, unit)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    convert.__name__ = parse.__name__  # argparse names it in "invalid ... value"
    return convert


def _size(value: str) -> str:
    parse_size(value)
    return value


def _half_lives(value: str) -> str:
    half_lives(value)
    return value


port = rule(kinds.port)
#: a client's --timeout: some time, and not so long that asyncio's timers refuse it
timeout = rule(kinds.duration, Range(0, 86400, above=True), "s")


def serve_options(settings: Settings, parser: argparse.ArgumentParser) -> None:
    """Every server setting as a flag, from its one declaration in ``Config``."""
    for f in fields(Config):
        kind, choices, text = f.metadata["kind"], f.metadata["choices"], f.metadata["help"]
        if kind == "secret":
            token_options(settings, parser, text)
        elif kind == "switch":
            parser.add_argument(
                flag(f.name),
                action="store_true",
                default=os.environ.get(env(f.name), "") not in ("", "0"),
                help=f"{text} (env {env(f.name)}=1)",
            )
        else:
            assert f.default is not MISSING
            default = None if f.default is None else str(f.default)
            bounds = f.metadata["bounds"]
            convert = _converter(kind, bounds)
            if bounds is not None:
                text += f"; {bounds.words('s' if kind == 'duration' else '')}"
            settings.add(
                parser,
                flag(f.name),
                env(f.name),
                default,
                text,
                type=convert,
                choices=choices or None,
            )


_PARSERS: dict[str, Callable[[str], Any]] = {
    "count": kinds.count,
    "duration": kinds.duration,
    "port": kinds.port,
    "size": _size,
    "half-lives": _half_lives,
    "address": kinds.address,
    "endpoint": kinds.endpoint,
    "path": kinds.path,
}


def _converter(kind: str, bounds: Range | None) -> Callable[[str], Any]:
    if kind not in _PARSERS:
        return str
    return rule(_PARSERS[kind], bounds, "s" if kind == "duration" else "")  # type: ignore[no-any-return]


def token_options(settings: Settings, parser: argparse.ArgumentParser, text: str) -> None:
    settings.add(
        parser,
        "--token",
        "TIDAL_TOKEN",
        None,
        f"{text}; on the command line it is visible to every user of the machine (ps)",
    )
    settings.add(parser, "--token-file", "TIDAL_TOKEN_FILE", None, "read the token from this file")


def client_options(
    settings: Settings, parser: argparse.ArgumentParser, *, tls: bool = True
) -> None:
    """Where the server is and how to reach it: the same for every client command."""
    settings.add(
        parser,
        "--host",
        "TIDAL_HOST",
        "127.0.0.1",
        "the server's address; several, comma-separated (h1,h2:7412): a tidal and its standbys",
    )
    settings.add(parser, "--port", "TIDAL_PORT", "7411", "the server's port", type=port, short="-p")
    token_options(settings, parser, "send auth(token) first")
    if tls:  # bench makes its own connections: it takes no --timeout and no TLS
        parser.add_argument(
            "--timeout", type=timeout, default=10.0, help="seconds, up to 1d (default 10)"
        )
        settings.add(
            parser, "--tls-ca", "TIDAL_TLS_CA", None, "connect with TLS, trusting this CA file"
        )
        parser.add_argument("--tls", action="store_true", help="connect with TLS, system CAs")


def resolve_token(
    parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str]
) -> None:
    """``args.token`` from --token, --token-file, TIDAL_TOKEN or TIDAL_TOKEN_FILE (as the
    official database images take ``*_FILE``): never two of them at once."""
    if "token" not in args:
        return
    given = [name for name in ("token", "token_file") if _on_command_line(argv, name)]
    if len(given) == 2:
        refuse(parser, "--token and --token-file: give one of them")
    if not given and os.environ.get("TIDAL_TOKEN") and os.environ.get("TIDAL_TOKEN_FILE"):
        refuse(parser, "TIDAL_TOKEN and TIDAL_TOKEN_FILE are both set: set one of them")
    args.token_in_argv = "token" in given
    if args.token_in_argv and args.command != "serve":  # serve says it in its log
        print(f"warning: {TOKEN_SEEN}", file=sys.stderr)
    if args.token_file is not None and (not args.token or "token_file" in given):
        source = "--token-file" if "token_file" in given else "TIDAL_TOKEN_FILE"
        try:
            with open(args.token_file, encoding="utf-8") as f:
                args.token = f.read().rstrip("\r\n")
        except (OSError, UnicodeDecodeError) as exc:
            refuse(parser, f"{source} {args.token_file}: {getattr(exc, 'strerror', None) or exc}")
        if not args.token:
            refuse(parser, f"{source} {args.token_file}: the file is empty")
    args.token = args.token or None


TOKEN_SEEN = (
    "a token given with --token can be read by any user of this machine (ps, /proc);"
    " prefer TIDAL_TOKEN or TIDAL_TOKEN_FILE"
)


def _on_command_line(argv: Sequence[str], dest: str) -> bool:
    flag = "--" + dest.replace("_", "-")
    return any(a == flag or a.startswith(flag + "=") for a in argv)
