"""The registry of cohorts: those defined now, by name, and their match index.

Each change is recorded in the open batch with its undo (see ``batch``); one
cohort and the matching of a signal against all of them are in ``matching``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple

from tidal.protocol.limits import MAX_COHORTS
from tidal.protocol.refusals import InvalidParams

from .asks import CohortAsk
from .matching import Cohort, index
from .params import Predicate, Scalar

if TYPE_CHECKING:
    from .batch import Batch


def _utf8(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


class Registry:
    """The cohorts defined now, by name, with their match index.

    A cohort gets a fresh id per definition: the aggregates of a replaced one never
    mix into its successor's. Changes are recorded in a batch with their undo.
    """

    def __init__(self, loaded: Iterable[tuple[int, str, Predicate]], next_id: int) -> None:
        self._by_name: dict[str, Cohort] = {
            name: Cohort.build(cid, name, predicate) for cid, name, predicate in loaded
        }
        #: ids are never given twice: past every id loaded, whatever the meta row says
        self._next_id = max([next_id, *(c.id + 1 for c in self._by_name.values())])
        self._index = index(self._by_name.values())
        self._names: dict[int, str] | None = None  # id -> name, made when asked

    @property
    def next_id(self) -> int:
        return self._next_id

    def __len__(self) -> int:
        return len(self._by_name)

    def __bool__(self) -> bool:
        return bool(self._by_name)

    def get(self, name: str) -> Cohort | None:
        return self._by_name.get(name)

    def items(self) -> Iterable[tuple[str, Cohort]]:
        return self._by_name.items()

    def match(self, attrs: dict[str, Scalar]) -> tuple[int, ...]:
        """The ids of the cohorts ``attrs`` satisfy (on the signal path)."""
        return self._index.match(attrs) if self._by_name else ()

    def names(self) -> dict[int, str]:
        """Cohort id -> name, for the cohorts defined now."""
        if self._names is None:
            self._names = {c.id: name for name, c in self._by_name.items()}
        return self._names

    def every(self, budget: int) -> dict[str, Predicate]:
        """Every cohort, when together they fit ``budget`` bytes: a plain map has no room
        to say it was cut, so a longer list is refused with the way to page it."""
        total = sum(c.size for c in self._by_name.values())
        if total > budget:
            raise InvalidParams(
                f"page: the {len(self)} cohorts take {total} bytes, over the {budget} a reply"
                " may; read them in pages: cohorts({'limit': n})"
            )
        return {name: c.predicate for name, c in self._by_name.items()}

    def page(self, after: str | None, limit: int, budget: int) -> dict[str, Any]:
        """The cohorts named after ``after`` (UTF-8 byte order), at most ``limit`` and what
        fits ``budget`` bytes (at least one); ``more`` names the last when more follow."""
        start = None if after is None else _utf8(after)
        names = sorted((n for n in self._by_name if start is None or _utf8(n) > start), key=_utf8)
        listed: dict[str, Predicate] = {}
        for name in names[:limit]:
            budget -= self._by_name[name].size
            if budget < 0 and listed:
                break
            listed[name] = self._by_name[name].predicate
        more = names[len(listed) - 1] if len(listed) < len(names) else None
        return {"cohorts": listed, "more": more}

    def define(self, batch: Batch, name: str, predicate: Predicate) -> bool:
        """False when the same rule is already defined under ``name`` (its counts go on)."""
        return self._decide(batch, name, predicate, now=True)[0]

    def drop(self, batch: Batch, name: str) -> bool:
        return self._decide(batch, name, None, now=True)[0]

    def ask(self, batch: Batch, ask: CohortAsk) -> bool:
        """Cluster mode: ``ask`` decided against the cohorts applied from the log, and, if
        it changes them, recorded in ``batch`` only: it takes effect on every node, this one
        too, as its log record is applied (``applied``). Decided again if another change
        comes first (``rematch``). Whether it changes them."""
        if ask.name in batch.cohorts:
            raise InvalidParams(f"name: {ask.name!r} is changing already; send this again")
        ask.changes, ask.result = self._decide(batch, ask.name, ask.predicate, now=False)
        return ask.changes

    def _decide(
        self, batch: Batch, name: str, predicate: Predicate | None, *, now: bool
    ) -> tuple[bool, bool]:
        """Whether defining (``predicate``) or dropping (None) changes the cohorts, and the
        answer: a drop of what is not defined answers false; a define, true."""
        old = self._by_name.get(name)
        if predicate is None:
            if old is None:
                return False, False
            self._set(batch, name, old, None, now)
            return True, True
        cohort = Cohort.build(self._next_id, name, predicate)
        if old is not None and old.same_rule(cohort):
            return False, True
        if old is None and len(self._by_name) >= MAX_COHORTS:
            raise InvalidParams(f"name: at most {MAX_COHORTS} cohorts may be defined; drop one")
        self._next_id += 1
        batch.next_cohort_id = self._next_id
        self._set(batch, name, old, cohort, now)
        return True, True

    def applied(self, name: str, cohort: Cohort | None) -> None:
        """Cluster mode: a change from the commit log, this node's or another's."""
        if cohort is not None:
            self._next_id = max(self._next_id, cohort.id + 1)
        self.put(name, cohort)

    def _set(
        self, batch: Batch, name: str, old: Cohort | None, new: Cohort | None, now: bool
    ) -> None:
        batch.cohorts[name] = new
        batch.writes += 1
        if now:
            batch.undo.append(_Put(self, name, old))
            self.put(name, new)
            if old is not None:
                batch.cohorts_gone.append(old.id)

    def put(self, name: str, cohort: Cohort | None) -> None:
        old = self._by_name.pop(name, None)
        if old is not None:
            self._index.remove(old)
        if cohort is not None:
            self._by_name[name] = cohort
            self._index.add(cohort)
        if self._index.wasted > max(len(self._by_name), 64):
            self._index = index(self._by_name.values())
        self._names = None


class _Put(NamedTuple):
    registry: Registry
    name: str
    prior: Cohort | None

    def undo(self) -> None:
        self.registry.put(self.name, self.prior)
