"""What the method table is made of: a method and its params, as data (``methods`` holds
the table itself)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final, Literal

from .schemas import Schema

#: How cluster mode routes a method:
#: ``user``: to the node serving the user its first parameter names (a batch: each signal's);
#: ``any``: any node answers alike;
#: ``log``: any node, which reads the commit log to its end first (reads and cohort changes
#: that span users, decided in one order);
#: ``groups``: the node serving partition 0, which serves every consumer group.
Route = Literal["user", "any", "log", "groups"]

#: a parameter's default when it has none: the caller must give it
REQUIRED: Final = object()


@dataclass(frozen=True)
class Param:
    name: str
    schema: Schema
    summary: str
    default: Any = REQUIRED

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    params: tuple[Param, ...]
    result: Schema
    result_name: str
    writes: bool = False
    route: Route = "any"
    #: answered while the server loads its database, or waits as a standby
    while_starting: bool = False
    #: (params, result) pairs, as a client sends and receives them (bin as base64)
    examples: tuple[tuple[list[Any], Any], ...] = field(default=())

    @property
    def least(self) -> int:
        return sum(p.required for p in self.params)

    @property
    def most(self) -> int:
        return len(self.params)

    @property
    def signature(self) -> str:
        """``user_id, limit=100, after_ns=0``, as PROTOCOL.md and errors write it."""
        if not self.params:
            return "none"
        return ", ".join(
            p.name if p.required else f"{p.name}={_written(p.default)}" for p in self.params
        )

    def arity_error(self, given: int) -> str | None:
        """The message for ``given`` params, or None when the count is right."""
        if self.least <= given <= self.most:
            return None
        count = str(self.least) if self.least == self.most else f"{self.least} to {self.most}"
        return f"{self.name} takes {count} params ({self.signature}), got {given}"


def _written(value: Any) -> str:
    if value is None:
        return "nil"
    if isinstance(value, dict):
        return "{}"
    return repr(value)
