"""A batch: the writes and waiting replies that one group commit makes durable.

Requests change memory at once, in the order the server reads them, and leave
their SQL work and their reply here; the writer commits a whole batch in one
transaction and only then lets the replies go. ``undo`` lets a failed commit
put memory back as it was, so memory never claims what the disk does not hold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from .cohorts import Cohort
from .members import Prior

LEDGER, COHORT, COMMUNITY = 0, 1, 2

#: (entity, layer, key, kind): key is "" for the ledger, a cohort id, or a community name
AggKey: TypeAlias = tuple[str, int, int | str, str]
LedgerRow: TypeAlias = tuple[int, int, str, str, float, int, bool, bytes | None]


class Replier(Protocol):
    """Where an answer goes: the server's connection, or nowhere for a notification."""

    def reply(self, msgid: int, result: Any) -> None: ...

    def reply_error(self, msgid: int, code: int, message: str) -> None: ...

    def flush(self) -> None: ...


@dataclass(slots=True)
class Writes:
    """Ledger rows and aggregate deltas; deltas to one key are summed before SQL sees them."""

    ledger: list[LedgerRow] = field(default_factory=list)
    deltas: dict[AggKey, list[Any]] = field(default_factory=dict)

    def add(self, key: AggKey, weight: float) -> None:
        delta = self.deltas.get(key)
        if delta is None:
            self.deltas[key] = [1, weight]
        else:
            delta[0] += 1
            delta[1] += weight


@dataclass(slots=True)
class CountsRead:
    """A read of one entity's aggregates, run inside the batch in request order.

    ``cohort_names`` maps the cohort ids defined when the request was processed
    to their names; rows of cohorts dropped or redefined since are not shown.
    """

    entity: str
    cohort_names: dict[int, str]
    rows: list[tuple[int, int | str, str, int, float]] | None = None

    def answer(self) -> dict[str, dict[str, Any]]:
        ledger: dict[str, Any] = {}
        cohorts: dict[str, dict[str, Any]] = {}
        communities: dict[str, dict[str, Any]] = {}
        for layer, key, kind, count, weight in self.rows or ():
            entry = {"count": count, "weight": weight}
            if layer == LEDGER:
                ledger[kind] = entry
            elif layer == COHORT:
                name = self.cohort_names.get(key) if isinstance(key, int) else None
                if name is not None:
                    cohorts.setdefault(name, {})[kind] = entry
            else:
                communities.setdefault(str(key), {})[kind] = entry
        return {"ledger": ledger, "cohorts": cohorts, "communities": communities}


Step: TypeAlias = Writes | CountsRead
#: Undo records, applied in reverse: ("member", user_id, prior) or ("cohort", name, old cohort)
Undo: TypeAlias = tuple[str, Any, Any]


@dataclass(slots=True)
class Batch:
    first_seq: int
    steps: list[Step] = field(default_factory=list)
    memberships: dict[int, tuple[bool, int]] = field(default_factory=dict)
    cohorts: dict[str, Cohort | None] = field(default_factory=dict)
    next_cohort_id: int | None = None
    replies: list[tuple[Replier, int, Any]] = field(default_factory=list)
    undo: list[Undo] = field(default_factory=list)
    writes: int = 0
    signals: int = 0
    forwarded: int = 0

    def writes_step(self) -> Writes:
        step = self.steps[-1] if self.steps else None
        if type(step) is not Writes:
            step = Writes()
            self.steps.append(step)
        return step

    def member(self, user_id: int, prior: Prior, left: bool, left_at_ns: int) -> None:
        self.undo.append(("member", user_id, prior))
        self.memberships[user_id] = (left, left_at_ns)
        self.writes += 1

    def pending(self) -> bool:
        return bool(self.steps or self.replies or self.writes)
