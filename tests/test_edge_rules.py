"""The signal path's inline checks are a pre-filter, never a rule of their own.

``core.signals`` passes the common case (ASCII text, plain numbers) without a call, and
hands anything else to the general rules of ``core.params``. Here, without sockets, any
signal is judged both ways: the path accepts exactly what the rules accept, one argument
at a time; and what it accepts, the method table's JSON Schema for ``signal`` (the
OpenRPC document's) accepts too. A condition added to the fast path that the rules do
not hold, or a bound changed in one place only, fails here.
"""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidal.protocol.limits import (
    ENTITY_MAX_BYTES,
    KIND_MAX_BYTES,
    MAX_ATTRS,
    MAX_COMMUNITIES,
    NAME_MAX_BYTES,
    USER_ID_MAX,
    WEIGHT_MAX,
)
from tidal.protocol.methods import BY_NAME, TABLE
from tidal.protocol.refusals import InvalidParams
from tidal.server.core import edge, params
from tidal.server.core.signals import signal_batch, single_signal


def _near(most: int) -> st.SearchStrategy[Any]:
    """Text around a bound of ``most`` bytes: ASCII, non-ASCII, with NUL, as bin, or none."""
    ascii_ = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=most + 2)
    wide = st.text(max_size=most // 2 + 2)
    at_bound = st.sampled_from(["x" * most, "x" * (most + 1), "é" * (most // 2 + 1), ""])
    return st.one_of(ascii_, wide, at_bound, ascii_.map(str.encode), st.integers(), st.none())


def _around(most: int) -> list[int]:
    """Sizes at a count's bound, where many plain items are too rare to be drawn."""
    return [most - 1, most, most + 1]


NAMES = _near(NAME_MAX_BYTES)
SCALARS = st.one_of(
    st.booleans(), st.integers(-(2**63), 2**64 - 1), st.floats(), st.text(max_size=8), st.none()
)
SIGNALS = st.tuples(
    st.one_of(st.integers(-1, USER_ID_MAX + 1), st.sampled_from([0, USER_ID_MAX]), st.booleans()),
    _near(ENTITY_MAX_BYTES),
    _near(KIND_MAX_BYTES),
    st.one_of(
        st.floats(), st.integers(-(2**63), 2**63), st.sampled_from([WEIGHT_MAX, -WEIGHT_MAX])
    ),
    st.one_of(
        st.lists(NAMES, max_size=MAX_COMMUNITIES + 1),
        st.sampled_from([[f"c{i}" for i in range(n)] for n in _around(MAX_COMMUNITIES)]),
        st.text(max_size=3),
    ),
    st.one_of(
        st.dictionaries(NAMES, SCALARS, max_size=MAX_ATTRS + 1),
        st.sampled_from([{f"k{i}": i for i in range(n)} for n in _around(MAX_ATTRS)]),
        st.integers(),
    ),
)


def _accepts(rule: Any, *args: Any) -> bool:
    try:
        rule(*args)
    except InvalidParams:
        return False
    return True


def _communities(value: Any) -> bool:
    if type(value) is not list or len(value) > MAX_COMMUNITIES:
        return False
    return all(_accepts(params.text, n, "c", NAME_MAX_BYTES) for n in value)


def _attrs(value: Any) -> bool:
    if type(value) is not dict or len(value) > MAX_ATTRS:
        return False
    return all(
        _accepts(params.text, k, "a", NAME_MAX_BYTES) and _accepts(params.scalar, v, "a")
        for k, v in value.items()
    )


def by_the_rules(user: Any, entity: Any, kind: Any, weight: Any, communities: Any,
                 attrs: Any) -> bool:  # fmt: skip
    return (
        _accepts(params.user_id, user)
        and _accepts(params.text, entity, "entity", ENTITY_MAX_BYTES)
        and _accepts(params.text, kind, "kind", KIND_MAX_BYTES)
        and _accepts(params.weight, weight)
        and _communities(communities)
        and _attrs(attrs)
    )


def _json(value: Any) -> bool:
    """Whether ``value`` has a JSON form for the schema to judge (bin has none)."""
    if isinstance(value, bytes):
        return False
    if isinstance(value, list):
        return all(_json(v) for v in value)
    if isinstance(value, dict):
        return all(_json(k) and _json(v) for k, v in value.items())
    return True


SIGNAL_SCHEMAS = [jsonschema.Draft7Validator(p.schema) for p in BY_NAME["signal"].params]


@settings(max_examples=3000, deadline=None)
@given(SIGNALS)
def test_the_signal_path_accepts_exactly_what_the_rules_and_the_table_accept(
    signal: tuple[Any, ...],
) -> None:
    user, entity, kind, weight, communities, attrs = signal
    sent = [user, entity, kind, weight, {"communities": communities, "attrs": attrs}]
    accepted = _accepts(single_signal, sent)
    assert accepted == by_the_rules(*signal), sent
    # a batch of it: the same path, the same verdict
    assert _accepts(signal_batch, [[sent]]) == accepted
    if accepted and _json(sent):
        for value, schema in zip(sent, SIGNAL_SCHEMAS, strict=True):
            assert schema.is_valid(value), (value, schema.schema)
    plain = [user, entity, kind, weight]
    plain_text = all(isinstance(v, str) and v.isascii() and "\x00" not in v for v in (entity, kind))
    if plain_text and weight == weight:
        # ASCII text without NUL: bytes are characters, so the table's lengths are the rule
        # (and a weight that is a number: JSON has no NaN, which MessagePack can carry)
        by_table = all(s.is_valid(v) for v, s in zip(plain, SIGNAL_SCHEMAS, strict=False))
        assert by_table == _accepts(single_signal, plain), plain


#: the params whose rule needs what only their handler knows (the reply budget)
HANDLER_CHECKED = {("history", "limit"), ("left_users", "limit"), ("cohorts", "page"),
                   ("counts", "page")}  # fmt: skip


def test_every_param_is_checked_at_the_edge_or_by_its_handler_as_declared() -> None:
    """A method's params are checked at the edge by their shapes' rules (``core.edge``):
    a param of a shape with no rule is a param nobody checks, unless its handler says so
    here. The methods that read theirs as sent (the hot path, ``top``) are apart."""
    for method in TABLE:
        if method.name in edge.AS_SENT:
            continue
        for param in method.params:
            ruled = id(param.schema) in edge.RULES
            by_handler = (method.name, param.name) in HANDLER_CHECKED
            assert ruled != by_handler, (method.name, param.name, ruled)


def test_the_edge_completes_params_with_the_table_defaults_parsed() -> None:
    edges = edge.edges()
    assert edges["leave"].parse([7]) == [7, False]
    assert edges["leave"].parse([7, {"purge": True}]) == [7, True]
    assert edges["history"].parse([2**64 - 1]) == [2**64 - 1, 100, 0]
    assert edges["subscribe"].parse([]) == [(None, None, None)]  # from, events, group
    assert edges["left_users"].parse([None]) == [None, 1000]
    with pytest.raises(InvalidParams) as refused:  # its message is the reply's, as it reads
        edges["left_users"].parse([-1])
    assert refused.value.message.startswith("after: must be an integer in 0..2**64-1")
    with pytest.raises(InvalidParams) as refused:
        edges["leave"].parse([7, {"purge": 1}])
    assert refused.value.message.startswith("options.purge: must be true or false")
