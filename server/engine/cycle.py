"""The commit cycle as a list of participants: what each part of the server does around a
group commit, run in one declared order (``Engine``), and its statements composed into the
batch's one transaction.

A participant owns its part of the batch: before the batch commits it adds what is due
(``prepare``); in the transaction it runs its own statements, which return what they
found (``plan``), handed back once the batch is durable (``committed``); if the batch is
refused, it gives back what it took (``failed``). The committer knows the cycle, not the
parts: adding one (consumer groups, say) is a class and a place in the list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from tidal.server.core.batch import Batch
from tidal.server.storage.sqlbulk import Begin, Commit, Dialect, Plan, Rows

T = TypeVar("T")

try:  # compiled with mypyc (``setup.py``): its own decorator, read as it compiles
    from mypy_extensions import mypyc_attr as mypyc_attr
except ImportError:  # pure Python, or mypy_extensions not installed: a no-op

    def mypyc_attr(*attrs: str, **kwattrs: object) -> Callable[[T], T]:
        return lambda cls: cls


@mypyc_attr(allow_interpreted_subclasses=True)  # the feed's, cluster mode's, tests'
class Participant:
    """One part of the commit cycle. Every step does nothing unless the part has something
    to do in it; ``plan`` runs on the storage's thread (SQLite), so it reads the batch and
    what the batch was handed, never the state the event loop changes."""

    def prepare(self, batch: Batch) -> None:
        """Before ``batch`` commits, as the writer takes it: add what is due."""

    def reads(self, batch: Batch) -> Plan[None]:
        """Before the transaction: reads of what committed before ``batch``."""
        yield from ()

    def writes(self, batch: Batch) -> bool:
        """Whether ``batch`` needs a transaction for this part."""
        return False

    def plan(self, batch: Batch, d: Dialect) -> Plan[Any]:
        """Its statements in ``batch``'s transaction; returns what they found."""
        yield from ()

    def committed(self, batch: Batch, found: Any) -> None:
        """``batch`` is durable: take in what it changed (``found``: what ``plan`` returned)."""

    def failed(self, batch: Batch, later: Batch, unknown: bool) -> None:
        """``batch`` and ``later``, the open one built on it, were refused (their undo
        already ran). ``unknown``: ``batch``'s COMMIT was cut off, and whether it held could
        not be found out: what was written in it may be saved."""

    def unknown(self, batch: Batch, message: str) -> None:
        """``batch``'s COMMIT was cut off and its outcome is still being found out: what
        waits on it is told ``message`` now."""

    def busy(self) -> bool:
        """Work due with no request asking (a chunk of rows to rewrite)."""
        return False

    def last(self, batch: Batch) -> bool:
        """At shutdown, nothing left to commit: add a final piece of work, if any."""
        return False

    def rematch(self, batch: Batch) -> bool:
        """Cluster mode: ``batch``'s commit found the cohorts changed under it: have it
        matched again, to be committed anew. False if this part cannot."""
        return False


class Cycle:
    """The participants, in the order every step runs them."""

    def __init__(self) -> None:
        self.parts: Sequence[Participant] = ()

    def declare(self, parts: Sequence[Participant]) -> None:
        self.parts = tuple(parts)

    def prepare(self, batch: Batch) -> None:
        for part in self.parts:
            part.prepare(batch)

    def transaction(self, batch: Batch, found: list[Any], d: Dialect) -> Plan[bool]:
        """The batch's reads, then its writes in one transaction; True if one was
        committed. What each part's statements found is put in ``found`` before the COMMIT,
        so that a COMMIT whose answer was lost, found out later to have held, still hands it
        on (``committed``). Reads come first: a page of history or of left users lays over
        what it read the writes its batch carries (``past``), and a replay reads what
        committed before them. A batch that changes nothing costs no transaction."""
        for part in self.parts:
            yield from part.reads(batch)
        found[:] = [None] * len(self.parts)
        if not any(part.writes(batch) for part in self.parts):
            if batch.reach:  # a health check: proof the database answers
                yield Rows("SELECT 1")
            return False
        yield Begin()
        for i, part in enumerate(self.parts):
            found[i] = yield from part.plan(batch, d)
        yield Commit()
        return True

    def committed(self, batch: Batch, found: list[Any]) -> None:
        for part, its in zip(self.parts, found, strict=True):
            part.committed(batch, its)

    def failed(self, batch: Batch, later: Batch, unknown: bool = False) -> None:
        for part in self.parts:
            part.failed(batch, later, unknown)

    def unknown(self, batch: Batch, message: str) -> None:
        for part in self.parts:
            part.unknown(batch, message)

    def busy(self) -> bool:
        return any(part.busy() for part in self.parts)

    def last(self, batch: Batch) -> bool:
        added = [part.last(batch) for part in self.parts]  # each adds its own
        return any(added)

    def rematch(self, batch: Batch) -> bool:
        matched = [part.rematch(batch) for part in self.parts]
        return any(matched)


@dataclass(frozen=True, slots=True)
class Transaction:
    """A batch's transaction, as storage is given it to run (``Storage.commit``): called
    with the backend's dialect, its plan. What the participants' statements find is kept
    in ``found``."""

    cycle: Cycle
    batch: Batch
    found: list[Any]

    def __call__(self, d: Dialect) -> Plan[bool]:
        return self.cycle.transaction(self.batch, self.found, d)
