"""How both backends take a schema to the current version: a new database in one
transaction and one log line (not a line per version it never had); an older one a step
at a time, each step committed with its version, so that a stop halfway resumes there."""

from __future__ import annotations

import logging

log = logging.getLogger("tidal.storage")


def spans(version: int, current: int) -> list[tuple[int, int]]:
    """The transactions that take a schema from ``version`` to ``current``, as (the first
    step, the version after): all steps in one for a new database, one each for an older."""
    if version == 0:
        return [(0, current)] if current else []
    return [(target, target + 1) for target in range(version, current)]


def told(what: str, version: int, current: int) -> None:
    """The one line for what ``spans`` did, if it did anything."""
    if version == 0:
        log.info("%s created at schema version %d", what, current)
    elif version < current:
        log.info("%s schema migrated from version %d to %d", what, version, current)
