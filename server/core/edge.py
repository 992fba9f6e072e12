"""The edge: a method's params checked, parsed and completed with their defaults, as the
method table declares them, before its handler runs.

Each param has a shape in the table: the schema it is given (``protocol.schemas``), one
object for one shape whichever methods take it. Each shape's rule is written once, in
``params``, and found here by that shape: a new method whose params have known shapes
gets its checks with no line here. A handler receives every param, parsed (a ``leave``'s
options as its purge flag), the ones not sent as the table's defaults are.

A param whose rule needs what only its handler knows is handed over as sent (its
default if not), and its handler checks it: a limit also bounded by the reply budget
(``history``, ``left_users``), a page (``cohorts``, ``counts``). ``top``'s params are one
rule (its name is nil for the ledger, a cohort that is defined, ...); ``signal`` and
``signal_batch`` check theirs on the hot path (``signals``), a pre-filter tested against
the table's rules.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from tidal.protocol import group_schemas as g
from tidal.protocol import read_schemas as r
from tidal.protocol import schemas as s
from tidal.protocol.limits import ENTITY_MAX_BYTES, KIND_MAX_BYTES, NAME_MAX_BYTES
from tidal.protocol.methods import BY_NAME, Method

from . import group_params, pages, params

#: a param's rule: its value as sent and its name, to its parsed value (or InvalidParams)
Rule = Callable[[Any, str], Any]


def _text(most: int) -> Rule:
    return lambda value, where: params.text(value, where, most)


def _user_or_nil(value: object, where: str) -> int | None:
    return None if value is None else params.user_id(value, where)


#: each shape's rule, by the shape's schema object
RULES: Final[dict[int, Rule]] = {
    id(s.USER_ID): params.user_id,
    id(r.AFTER_USER): _user_or_nil,
    id(s.ENTITY): _text(ENTITY_MAX_BYTES),
    id(s.KIND): _text(KIND_MAX_BYTES),
    id(s.NAME): _text(NAME_MAX_BYTES),
    id(s.NS): params.time_ns,
    id(s.PREDICATE): lambda value, where: params.predicate(value),
    id(s.LEAVE_OPTIONS): lambda value, where: params.leave_options(value),
    id(s.SUBSCRIBE_OPTIONS): lambda value, where: params.subscribe_options(value),
    id(r.LAYER): pages.layer,
    id(r.CATALOG_PAGE): lambda value, where: pages.catalog_page(value),
    id(g.GROUP_OPTIONS): group_params.group_options,
    id(g.EVENT_IDS): group_params.event_ids,
    id(g.NACK_OPTIONS): group_params.nack_options,
    id(g.RESET_OPTIONS): group_params.reset_options,
    id(g.DEAD_PAGE): group_params.dead_page,
    id(g.UNCONFIRMED_OPTIONS): group_params.unconfirmed_options,
}
#: the methods whose handlers read their params as sent: the hot path's, ``top``'s (one
#: rule for all four, ``ranking.top_request``: the name's depends on the layer), and the
#: connection's own (``auth``)
AS_SENT: Final = frozenset({"signal", "signal_batch", "auth", "top"})


class Edge:
    """One method's params: each one's rule (None: its handler's) and default."""

    __slots__ = ("_params",)

    def __init__(self, method: Method) -> None:
        self._params = [(p.name, RULES.get(id(p.schema)), p.default) for p in method.params]

    def parse(self, args: list[Any]) -> list[Any]:
        """``args`` (as many as the method takes: the arity is checked first), each parsed,
        then the defaults of those not sent."""
        out = []
        for i, (name, rule, default) in enumerate(self._params):
            value = args[i] if i < len(args) else default
            out.append(value if rule is None else rule(value, name))
        return out


def edges() -> dict[str, Edge]:
    """An ``Edge`` for each method whose handler takes its params parsed."""
    return {name: Edge(m) for name, m in BY_NAME.items() if name not in AS_SENT and m.params}
