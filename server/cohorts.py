"""Cohorts: named predicates over a signal's attributes, and how a signal is matched to them.

A predicate ``{attr: value or [values]}`` matches when every attribute it names
is present with one of its values. Values compare by type family: ``true`` is
not ``1``, while ``1`` equals ``1.0``, as numbers do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeAlias

from .params import Predicate, Scalar

_Tagged: TypeAlias = tuple[int, Scalar]
_BOOL, _NUMBER, _TEXT = 0, 1, 2


def _tag(value: Scalar) -> _Tagged:
    """Key a value by its family so that set membership never confuses True with 1."""
    if type(value) is bool:
        return (_BOOL, value)
    if type(value) is str:
        return (_TEXT, value)
    return (_NUMBER, value)


@dataclass(frozen=True, slots=True)
class Cohort:
    id: int  # a fresh id per definition: aggregates of a replaced cohort never mix in
    name: str
    predicate: Predicate
    _wanted: tuple[tuple[str, frozenset[_Tagged]], ...]

    @classmethod
    def build(cls, cohort_id: int, name: str, predicate: Predicate) -> Cohort:
        wanted = tuple(
            (attr, frozenset(_tag(v) for v in (values if isinstance(values, list) else [values])))
            for attr, values in predicate.items()
        )
        return cls(cohort_id, name, predicate, wanted)

    def same_rule(self, other: Cohort) -> bool:
        return dict(self._wanted) == dict(other._wanted)

    def matches(self, tagged_attrs: dict[str, _Tagged]) -> bool:
        for attr, allowed in self._wanted:
            value = tagged_attrs.get(attr)
            if value is None or value not in allowed:
                return False
        return True


def matching(cohorts: Iterable[Cohort], attrs: dict[str, Scalar]) -> list[Cohort]:
    if not attrs:
        return [c for c in cohorts if not c.predicate]
    tagged = {k: _tag(v) for k, v in attrs.items()}
    return [c for c in cohorts if c.matches(tagged)]
