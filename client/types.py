"""Typed results of the client's calls."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple, TypeAlias

Scalar: TypeAlias = str | int | float | bool


@dataclass(frozen=True, slots=True)
class SignalAck:
    seq: int
    forwarded: bool

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> SignalAck:
        return cls(value["seq"], value["forwarded"])


@dataclass(frozen=True, slots=True)
class Membership:
    user_id: int
    status: Literal["active", "left"]
    left_at_ns: int | None

    @property
    def left(self) -> bool:
        return self.status == "left"

    @classmethod
    def from_wire(cls, value: dict[str, Any]) -> Membership:
        return cls(value["user_id"], value["status"], value["left_at_ns"])


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


class Signal(NamedTuple):
    """One item of ``signal_batch``."""

    user_id: int
    entity: str
    kind: str
    weight: float = 1.0
    communities: tuple[str, ...] | list[str] = ()
    attrs: Mapping[str, Scalar] | None = None
    key: str | None = None  # idempotency key (context "id")

    def wire(self) -> list[Any]:
        item: list[Any] = [self.user_id, self.entity, self.kind, self.weight]
        context = _context(self.communities, self.attrs, self.key)
        if context:
            item.append(context)
        return item


def _context(
    communities: tuple[str, ...] | list[str] | None,
    attrs: Mapping[str, Scalar] | None,
    key: str | None = None,
) -> dict[str, Any]:
    context: dict[str, Any] = {}
    if communities:
        context["communities"] = list(communities)
    if attrs:
        context["attrs"] = attrs
    if key is not None:
        context["id"] = key
    return context
