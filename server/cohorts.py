"""Cohorts: named predicates over a signal's attributes, and how a signal is matched to them.

A predicate ``{attr: value or [values]}`` matches when every attribute it names
is present with one of its values. Values compare by type family: ``true`` is
not ``1``, while ``1`` equals ``1.0``, as numbers do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeAlias

from .params import Predicate, Scalar

#: A value keyed by whether it is a bool, so that set membership never confuses
#: True with 1 (they hash and compare equal in Python), while 1 still equals 1.0.
_Tagged: TypeAlias = tuple[bool, Scalar]


@dataclass(frozen=True, slots=True)
class Cohort:
    id: int  # a fresh id per definition: aggregates of a replaced cohort never mix in
    name: str
    predicate: Predicate
    _wanted: tuple[tuple[str, frozenset[_Tagged]], ...]

    @classmethod
    def build(cls, cohort_id: int, name: str, predicate: Predicate) -> Cohort:
        wanted = tuple(
            (attr, frozenset((type(v) is bool, v) for v in _as_list(values)))
            for attr, values in predicate.items()
        )
        return cls(cohort_id, name, predicate, wanted)

    def same_rule(self, other: Cohort) -> bool:
        return dict(self._wanted) == dict(other._wanted)


def matching(cohorts: dict[str, Cohort], attrs: dict[str, Scalar]) -> list[Cohort]:
    """The cohorts whose predicate the attributes satisfy (on the signal path: no calls)."""
    found = []
    for cohort in cohorts.values():
        for attr, allowed in cohort._wanted:
            value = attrs.get(attr)
            if value is None or (type(value) is bool, value) not in allowed:
                break
        else:
            found.append(cohort)
    return found


def _as_list(values: Scalar | list[Scalar]) -> list[Scalar]:
    return values if isinstance(values, list) else [values]
