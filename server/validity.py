"""Whether settings can be served: every rule a ``Config`` must keep, checked once at
start, whatever gave the values (flags, the environment, code), so that a mistake is one
line naming the setting and its rule, never a failure later on some connection.
"""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Final

from tidal.protocol.partitions import MAX_PARTITIONS

from . import kinds
from .config import Config
from .errors import BadSettings
from .host import parse_size

_NAME: Final = re.compile(r"[A-Za-z0-9._-]{1,64}")


def check(config: Config) -> None:
    """Refuse settings that could only fail later, on some connection."""
    rules = [
        *_bounds(config),
        (
            bool(config.host and config.host.strip()),
            "host: an address to listen on (0.0.0.0: every interface); an empty one is"
            " not taken to mean every interface",
        ),
        (bool(config.db and config.db.strip()), "db: a SQLite file's path or a postgresql:// URL"),
        (
            not config.standby or config.db.startswith(("postgresql://", "postgres://")),
            "standby: needs a PostgreSQL --db (a SQLite file is served by one process on"
            " one machine: there is nothing for a standby to take over)",
        ),
        *_cluster_rules(config),
    ]
    if config.http is not None:
        try:
            kinds.split(config.http)
        except ValueError as exc:
            rules.append((False, f"http: {exc}"))
    try:
        config.half_lives()
    except ValueError as exc:
        rules.append((False, f"trend_half_lives: {exc}"))
    try:
        parse_size(config.memory_budget)
    except ValueError as exc:
        rules.append((False, f"memory_budget: {exc}"))
    for f in fields(config):
        choices = f.metadata["choices"]
        if choices and getattr(config, f.name) not in choices:
            rules.append((False, f"{f.name}: one of {', '.join(choices)}"))
    broken = [rule for ok, rule in rules if not ok]
    if broken:
        raise BadSettings("invalid settings: " + "; ".join(broken))


def _bounds(config: Config) -> list[tuple[bool, str]]:
    """Each count and duration within its range (one place for all of them: a Config
    built in code is held to the same ranges as the flags)."""
    rules = []
    for f in fields(config):
        bounds, value = f.metadata["bounds"], getattr(config, f.name)
        if bounds is not None and not (isinstance(value, (int, float)) and bounds.holds(value)):
            unit = "s" if f.metadata["kind"] == "duration" else ""
            rules.append((False, f"{f.name}: must be {bounds.words(unit)}, got {value!r}"))
    return rules


def _cluster_rules(config: Config) -> list[tuple[bool, str]]:
    if config.cluster is None:
        return []
    address = config.advertise or ""
    host, _, port = address.rpartition(":")
    return [
        (
            config.db.startswith(("postgresql://", "postgres://")),
            "cluster: needs a PostgreSQL --db (the nodes share it)",
        ),
        (
            bool(_NAME.fullmatch(config.cluster)),
            "cluster: 1 to 64 letters, digits, '.', '_' or '-'",
        ),
        (
            bool(host) and port.isdigit() and 1 <= int(port) <= 65535,
            f"advertise: host:port where clients reach this node, got {address!r}",
        ),
        (
            1 <= config.partitions <= MAX_PARTITIONS,
            f"partitions: 1 to {MAX_PARTITIONS}",
        ),
        (not config.standby, "cluster: a node needs no --standby (the others take over)"),
    ]
