"""Typed results of the client's calls."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, NamedTuple, TypeAlias

Scalar: TypeAlias = str | int | float | bool


@dataclass(frozen=True, slots=True)
class SignalAck:
    seq: int
    forwarded: bool

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> SignalAck:
        return cls(value["seq"], value["forwarded"])

    @classmethod
    def from_compact(cls, value: dict[str, Any], count: int) -> list[SignalAck]:
        """``signal_batch``'s compact acknowledgement (PROTOCOL.md), one per signal."""
        bits: bytes = value["forwarded"]
        repeated: dict[int, int] = dict(value["repeated"])  # [index, seq] pairs
        seq = value["first_seq"]
        out = []
        for i in range(count):
            forwarded = bool(bits[i >> 3] >> (i & 7) & 1)
            if i in repeated:
                out.append(cls(repeated[i], forwarded))
            else:
                out.append(cls(seq, forwarded))
                seq += 1
        return out


@dataclass(frozen=True, slots=True)
class Membership:
    user_id: int
    status: Literal["active", "left"]
    left_at_ns: int | None
    purged: int | None = None  # a leave with purge: how many signals it withdrew

    @property
    def left(self) -> bool:
        return self.status == "left"

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Membership:
        return cls(value["user_id"], value["status"], value["left_at_ns"], value.get("purged"))


@dataclass(frozen=True, slots=True)
class Withdrawn:
    """What a ``purge`` or an ``erase`` took away: ``signals`` of the user's, at ``at_ns``."""

    user_id: int
    signals: int
    at_ns: int

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Withdrawn:
        signals = value["purged"] if "purged" in value else value["erased"]
        return cls(value["user_id"], signals, value["at_ns"])


@dataclass(frozen=True, slots=True)
class Event:
    """A line of a user's history: ``signals`` is how many a purge or an erase reached."""

    event: Literal["leave", "rejoin", "purge", "erase"]
    at_ns: int
    signals: int | None

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Event:
        return cls(value["event"], value["at_ns"], value["signals"])


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """An event of the change feed. ``id`` increases by exactly 1 per event; the fields
    after ``at_ns`` are those the event has: ``user_id`` and ``left_at_ns`` (leave,
    rejoin, erase; a rejoin's is the leave it ends), ``purged`` (purge; a leave with
    purge makes a leave event, then a purge event), ``erased`` (erase: a count, nothing
    of the user's data), a cohort's ``name`` and ``predicate`` (define_cohort;
    drop_cohort has the name)."""

    id: int
    event: Literal["leave", "rejoin", "purge", "erase", "define_cohort", "drop_cohort"]
    at_ns: int
    user_id: int | None = None
    left_at_ns: int | None = None
    purged: int | None = None
    erased: int | None = None
    name: str | None = None
    predicate: dict[str, Any] | None = None

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> FeedEvent:
        get = value.get
        return cls(
            value["id"], value["event"], value["at_ns"], get("user_id"), get("left_at_ns"),
            get("purged"), get("erased"), get("name"), get("predicate"),
        )  # fmt: skip

    def wire(self) -> dict[str, Any]:
        """As the server sent it: only the fields the event has."""
        values = ((f.name, getattr(self, f.name)) for f in fields(self))
        return {name: value for name, value in values if value is not None}


@dataclass(frozen=True, slots=True)
class LeftUsers:
    """A page of Left users (user_id, left_at_ns); ``next`` is the ``after`` of the next
    page, None after the last."""

    users: list[tuple[int, int]]
    next: int | None

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> LeftUsers:
        return cls([(u, at) for u, at in value["users"]], value["next"])


@dataclass(frozen=True, slots=True)
class Stored:
    """One name a ``catalog`` page lists: a kind of the ledger, a cohort or a community,
    with its aggregates (entities and kinds it counts) and the signals they count."""

    name: str
    aggregates: int
    count: int


@dataclass(frozen=True, slots=True)
class Catalog:
    """A page of what is stored, in name order; ``next`` is the ``after`` of the next
    page, None after the last."""

    items: list[Stored]
    next: str | None

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Catalog:
        items = [Stored(i["name"], i["aggregates"], i["count"]) for i in value["items"]]
        return cls(items, value["next"])


@dataclass(frozen=True, slots=True)
class Tally:
    count: int
    weight: float


@dataclass(frozen=True, slots=True)
class Counts:
    """An entity's aggregates.

    ``ledger[kind]``, ``cohorts[name][kind]`` and ``communities[name][kind]`` are tallies.
    """

    ledger: dict[str, Tally] = field(default_factory=dict)
    cohorts: dict[str, dict[str, Tally]] = field(default_factory=dict)
    communities: dict[str, dict[str, Tally]] = field(default_factory=dict)

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Counts:
        def kinds(by_kind: dict[str, Any]) -> dict[str, Tally]:
            return {k: Tally(v["count"], v["weight"]) for k, v in by_kind.items()}

        return cls(
            kinds(value["ledger"]),
            {name: kinds(v) for name, v in value["cohorts"].items()},
            {name: kinds(v) for name, v in value["communities"].items()},
        )


@dataclass(frozen=True, slots=True)
class Ranked:
    """One entity of a ``top``: its count and weight (in the window; all-time for a trend),
    and the score it is ranked by."""

    entity: str
    count: int
    weight: float
    score: float


@dataclass(frozen=True, slots=True)
class Top:
    """A ranking, highest score first, then by entity. ``next`` is the ``after`` that
    reads on from here (None at the end); scores are as of ``as_of_ns``."""

    entities: list[Ranked]
    next: bytes | None
    as_of_ns: int

    @classmethod
    def from_wire(cls, entities: list[dict[str, Any]], next: bytes | None, as_of_ns: int) -> Top:
        ranked = [Ranked(e["entity"], e["count"], e["weight"], e["score"]) for e in entities]
        return cls(ranked, next, as_of_ns)


class Signal(NamedTuple):
    """One item of ``signal_batch``."""

    user_id: int
    entity: str
    kind: str
    weight: float = 1.0
    communities: tuple[str, ...] | list[str] = ()
    attrs: Mapping[str, Scalar] | None = None
    key: str | None = None  # idempotency key (context "id")
    at_ns: int | None = None  # when it happened, if not when the server reads it

    def wire(self) -> list[Any]:
        item: list[Any] = [self.user_id, self.entity, self.kind, self.weight]
        context = _context(self.communities, self.attrs, self.key, self.at_ns)
        if context:
            item.append(context)
        return item


def _context(
    communities: tuple[str, ...] | list[str] | None,
    attrs: Mapping[str, Scalar] | None,
    key: str | None = None,
    at_ns: int | None = None,
) -> dict[str, Any]:
    context: dict[str, Any] = {}
    if communities:
        context["communities"] = list(communities)
    if attrs:
        context["attrs"] = attrs
    if key is not None:
        context["id"] = key
    if at_ns is not None:
        context["at_ns"] = at_ns
    return context
