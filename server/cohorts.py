"""Cohorts: named predicates over a signal's attributes, and how a signal is matched to them.

A predicate ``{attr: value or [values]}`` matches when every attribute it names
is present with one of its values. Values compare by type family: ``true`` is
not ``1``, while ``1`` equals ``1.0``, as numbers do.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NamedTuple, TypeAlias

import msgpack

from tidal.protocol.limits import MAX_COHORTS

from .errors import InvalidParams
from .params import Predicate, Scalar

if TYPE_CHECKING:
    from .batch import Batch

_pack = msgpack.Packer(use_bin_type=True).pack

#: A value keyed by whether it is a bool, so that set membership never confuses
#: True with 1 (they hash and compare equal in Python), while 1 still equals 1.0.
_Tagged: TypeAlias = tuple[bool, Scalar]


@dataclass(frozen=True, slots=True)
class Cohort:
    id: int  # a fresh id per definition: aggregates of a replaced cohort never mix in
    name: str
    predicate: Predicate
    _wanted: tuple[tuple[str, frozenset[_Tagged]], ...]
    size: int  # bytes of name and predicate in a ``cohorts`` reply

    @classmethod
    def build(cls, cohort_id: int, name: str, predicate: Predicate) -> Cohort:
        wanted = tuple(
            (attr, frozenset((type(v) is bool, v) for v in _as_list(values)))
            for attr, values in predicate.items()
        )
        size = len(name.encode("utf-8", "surrogateescape")) + len(_pack(predicate)) + 8
        return cls(cohort_id, name, predicate, wanted, size)

    def same_rule(self, other: Cohort) -> bool:
        return dict(self._wanted) == dict(other._wanted)


class CohortIndex:
    """Which cohorts a signal's attributes satisfy, for about what the signal's own
    attributes cost, however many cohorts there are.

    Each cohort has a bit. Per attribute and value, one int holds the bits of the
    cohorts that allow it. A signal adds, for each of its attributes, that int into a
    bit-sliced counter (one int per bit of the count, so each addition works on all
    cohorts at once), and a cohort matches when its count equals the number of
    attributes its predicate names. Checking each cohort's predicate in turn cost
    cohorts x attributes per signal: 1,000 predicates of 64 attributes that nearly
    matched took 6.5 ms a signal.
    """

    _PLANES: Final = 7  # counts up to 127: a predicate names at most 64 attributes

    def __init__(self) -> None:
        self._ids: list[int] = []  # cohort id per bit
        self._alive = 0  # bits of cohorts defined now
        self._need = [0] * self._PLANES  # per cohort, the count to reach, bit-sliced
        self._planes = 1  # planes in use: enough for the longest predicate's count
        # attr -> value -> cohort bits; a bool value is keyed (True,) so that it is not 1
        self._allowed: dict[str, dict[object, int]] = {}
        self._bits: dict[int, int] = {}  # cohort id -> its bit
        self._cache: dict[int, tuple[int, ...]] = {}  # matching bits -> cohort ids

    def add(self, cohort: Cohort) -> None:
        slot = len(self._ids)
        bit = 1 << slot
        self._ids.append(cohort.id)
        self._bits[cohort.id] = slot
        self._alive |= bit
        need = len(cohort._wanted)
        self._planes = max(self._planes, need.bit_length())
        for i in range(self._PLANES):
            if need >> i & 1:
                self._need[i] |= bit
        for attr, values in cohort._wanted:
            by_value = self._allowed.setdefault(attr, {})
            for tagged in values:
                key = _key(tagged)
                by_value[key] = by_value.get(key, 0) | bit
        self._cache.clear()

    def remove(self, cohort: Cohort) -> None:
        """Its bit is cleared everywhere it was set; the slot is not reused until a rebuild."""
        bit = 1 << self._bits.pop(cohort.id)
        self._alive &= ~bit
        self._need = [plane & ~bit for plane in self._need]
        for attr, values in cohort._wanted:
            by_value = self._allowed[attr]
            for tagged in values:
                key = _key(tagged)
                left = by_value[key] & ~bit
                if left:
                    by_value[key] = left
                else:
                    del by_value[key]
            if not by_value:
                del self._allowed[attr]
        self._cache.clear()

    @property
    def wasted(self) -> int:
        """Slots of removed cohorts: when they outnumber the live ones, rebuild."""
        return len(self._ids) - len(self._bits)

    def match(self, attrs: dict[str, Scalar]) -> tuple[int, ...]:
        """The ids of the cohorts whose predicate ``attrs`` satisfy (on the signal path)."""
        allowed = self._allowed
        if self._planes == 1:  # no predicate names two attributes: a count is 0 or 1
            hits = 0
            for attr, value in attrs.items():
                by_value = allowed.get(attr)
                if by_value is not None:
                    hits |= by_value.get(value if type(value) is not bool else (value,), 0)
            found = self._alive & ~(hits ^ self._need[0])
        else:
            planes = [0] * self._planes
            for attr, value in attrs.items():
                by_value = allowed.get(attr)
                if by_value is None:
                    continue
                carry = by_value.get(value if type(value) is not bool else (value,), 0)
                i = 0
                while carry:
                    plane = planes[i]
                    planes[i] = plane ^ carry
                    carry &= plane
                    i += 1
            found = self._alive
            # planes past the longest predicate are 0 in every count and every need
            for plane, need in zip(planes, self._need, strict=False):
                found &= ~(plane ^ need)
        ids = self._cache.get(found)
        if ids is None:
            if len(self._cache) >= 4096:
                self._cache.clear()
            ids = self._cache[found] = self._unpack(found)
        return ids

    def _unpack(self, bits: int) -> tuple[int, ...]:
        ids = self._ids
        out = []
        while bits:
            low = bits & -bits
            out.append(ids[low.bit_length() - 1])
            bits ^= low
        return tuple(out)


def index(cohorts: Iterable[Cohort]) -> CohortIndex:
    built = CohortIndex()
    for cohort in cohorts:
        built.add(cohort)
    return built


def _key(tagged: _Tagged) -> object:
    is_bool, value = tagged
    return (value,) if is_bool else value


def _utf8(name: str) -> bytes:
    return name.encode("utf-8", "surrogateescape")


def _as_list(values: Scalar | list[Scalar]) -> list[Scalar]:
    return values if isinstance(values, list) else [values]


class Registry:
    """The cohorts defined now, by name, with their match index.

    A cohort gets a fresh id per definition: the aggregates of a replaced one never
    mix into its successor's. Changes are recorded in a batch with their undo.
    """

    def __init__(self, loaded: Iterable[tuple[int, str, Predicate]], next_id: int) -> None:
        self._by_name: dict[str, Cohort] = {
            name: Cohort.build(cid, name, predicate) for cid, name, predicate in loaded
        }
        self._next_id = next_id
        self._index = index(self._by_name.values())
        self._names: dict[int, str] | None = None  # id -> name, made when asked

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
        old = self._by_name.get(name)
        cohort = Cohort.build(self._next_id, name, predicate)
        if old is not None and old.same_rule(cohort):
            return False
        if old is None and len(self._by_name) >= MAX_COHORTS:
            raise InvalidParams(f"name: at most {MAX_COHORTS} cohorts may be defined; drop one")
        self._next_id += 1
        batch.next_cohort_id = self._next_id
        self._set(batch, name, old, cohort)
        return True

    def drop(self, batch: Batch, name: str) -> bool:
        old = self._by_name.get(name)
        if old is None:
            return False
        self._set(batch, name, old, None)
        return True

    def _set(self, batch: Batch, name: str, old: Cohort | None, new: Cohort | None) -> None:
        batch.undo.append(_Put(self, name, old))
        batch.cohorts[name] = new
        batch.writes += 1
        self.put(name, new)

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
