"""Validation at the edge: every parameter is checked here, and nowhere else.

Each failure is an ``InvalidParams`` whose message names the argument and the
rule it broke, so a caller can fix the request without reading our source.
Strings arrive as msgpack str or bin; both are accepted as UTF-8 text.
"""

from __future__ import annotations

import math
from typing import Any, Final, NamedTuple, TypeAlias

import msgpack

from tidal.protocol.limits import (
    ATTR_VALUE_MAX_BYTES,
    ENTITY_MAX_BYTES,
    KEY_MAX_BYTES,
    KIND_MAX_BYTES,
    MAX_ATTRS,
    MAX_BATCH,
    MAX_BATCH_ATTRS,
    MAX_COMMUNITIES,
    MAX_FANOUT,
    MAX_PREDICATE_BYTES,
    MAX_PREDICATE_TERMS,
    MAX_PREDICATE_VALUES,
    NAME_MAX_BYTES,
    USER_ID_MAX,
    WEIGHT_MAX,
)
from tidal.protocol.messages import new_tuple

from .errors import InvalidParams

Scalar: TypeAlias = str | int | float | bool
#: attribute -> the value it must have, or an array of values it may have
Predicate: TypeAlias = dict[str, Scalar | list[Scalar]]


class SignalArgs(NamedTuple):
    user_id: int
    entity: str
    kind: str
    weight: float
    communities: tuple[str, ...]
    attrs: dict[str, Scalar]
    key: str | None  # the caller's idempotency key, context "id"


def arity(params: list[Any], method: str, names: str, least: int, most: int) -> None:
    if not least <= len(params) <= most:
        count = str(least) if least == most else f"{least} to {most}"
        raise InvalidParams(f"{method} takes {count} params ({names}), got {len(params)}")


def user_id(value: object, where: str = "user_id") -> int:
    if type(value) is not int or not 0 <= value <= USER_ID_MAX:
        raise InvalidParams(f"{where}: must be an integer in 0..2**64-1, got {_describe(value)}")
    return value


def text(value: object, where: str, max_bytes: int) -> str:
    """A str (or UTF-8 bin) of 1..max_bytes bytes once encoded as UTF-8, without NUL."""
    if type(value) is bytes:
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidParams(f"{where}: must be valid UTF-8") from None
    if type(value) is not str:
        raise InvalidParams(f"{where}: must be a string, got {_describe(value)}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:  # surrogate-escaped bytes that were not UTF-8
        raise InvalidParams(f"{where}: must be valid UTF-8") from None
    if not 1 <= size <= max_bytes:
        raise InvalidParams(f"{where}: must be 1..{max_bytes} bytes of UTF-8, got {size}")
    if "\x00" in value:  # PostgreSQL's text cannot hold it: one rule for both backends
        raise InvalidParams(f"{where}: must not contain the NUL character (\\x00)")
    return value


def weight(value: object, where: str = "weight") -> float:
    if (type(value) is int or type(value) is float) and -WEIGHT_MAX <= value <= WEIGHT_MAX:
        return float(value)
    if type(value) is int or type(value) is float:  # NaN fails both comparisons
        got = repr(value)
    else:
        got = _describe(value)
    raise InvalidParams(f"{where}: must be a number in {_WEIGHTS}, got {got}")


_WEIGHTS: Final = f"-{WEIGHT_MAX:.0e}..{WEIGHT_MAX:.0e}"


def scalar(value: object, where: str) -> Scalar:
    # bool apart: narrowed to ``bool | int``, which is ``int`` to the type checker, compiled
    # code would hand back True as 1, and a predicate on True would match 1
    if type(value) is bool:
        return value
    if type(value) is int:
        return value
    if type(value) is float:
        if not math.isfinite(value):
            raise InvalidParams(f"{where}: must be a finite number, got {value!r}")
        return value
    if type(value) is str or type(value) is bytes:
        return _value_text(value, where)
    raise InvalidParams(f"{where}: must be a str, int, float or bool, got {_describe(value)}")


def _value_text(value: str | bytes, where: str) -> str:
    # Attribute values may be empty strings, unlike names.
    if value in ("", b""):
        return ""
    return text(value, where, ATTR_VALUE_MAX_BYTES)


# The signal path runs for every signal, so its checks come in two layers: an
# inline test that passes the common case (ASCII strings without NUL, plain numbers)
# without a function call, and, for anything else, the general check above, which is
# the rule itself: it accepts what the inline test may have missed (non-ASCII text,
# bin strings) or raises the error that names the argument. The inline test is only a
# pre-filter: each of its conditions is one the rule also holds, so it never accepts
# what the rule refuses (tests/test_storable.py sends what it might miss).


def signal(params: list[Any], where: str = "") -> SignalArgs:
    if not 3 <= len(params) <= 5:
        arity(params, where.rstrip(".") or "signal", _SIGNAL_PARAMS, 3, 5)
    uid = params[0]
    if type(uid) is not int or uid < 0 or uid > USER_ID_MAX:
        uid = user_id(uid, f"{where}user_id")
    entity = params[1]
    if (
        type(entity) is not str
        or not entity.isascii()
        or not 0 < len(entity) <= ENTITY_MAX_BYTES
        or "\x00" in entity
    ):
        entity = text(entity, f"{where}entity", ENTITY_MAX_BYTES)
    kind = params[2]
    if (
        type(kind) is not str
        or not kind.isascii()
        or not 0 < len(kind) <= KIND_MAX_BYTES
        or "\x00" in kind
    ):
        kind = text(kind, f"{where}kind", KIND_MAX_BYTES)
    if len(params) == 3:
        return new_tuple(SignalArgs, (uid, entity, kind, 1.0, (), _NO_ATTRS, None))
    w = params[3]
    if type(w) is not float or not -WEIGHT_MAX <= w <= WEIGHT_MAX:
        w = weight(w, f"{where}weight")
    if len(params) == 4 or params[4] is None:
        return new_tuple(SignalArgs, (uid, entity, kind, w, (), _NO_ATTRS, None))
    communities, attrs, key = _context(params[4], f"{where}context")
    return new_tuple(SignalArgs, (uid, entity, kind, w, communities, attrs, key))


_SIGNAL_PARAMS: Final = "user_id, entity, kind, weight=1.0, context={}"
_NO_ATTRS: Final[dict[str, Scalar]] = {}


def _context(value: object, where: str) -> tuple[tuple[str, ...], dict[str, Scalar], str | None]:
    if type(value) is not dict:
        raise InvalidParams(f"{where}: must be a map, got {_describe(value)}")
    communities: tuple[str, ...] = ()
    attrs: dict[str, Scalar] = _NO_ATTRS
    idempotency_key = None
    for raw_key, item in value.items():
        key = raw_key.decode("utf-8", "replace") if type(raw_key) is bytes else raw_key
        if key == "communities":
            communities = _communities(item, f"{where}.communities")
        elif key == "attrs":
            attrs = _attrs(item, f"{where}.attrs")
        elif key == "id":
            idempotency_key = text(item, f"{where}.id", KEY_MAX_BYTES)
        else:
            raise InvalidParams(
                f"{where}: unknown key {key!r}; the keys are 'communities', 'attrs' and 'id'"
            )
    return communities, attrs, idempotency_key


def _communities(value: object, where: str) -> tuple[str, ...]:
    if type(value) is list and len(value) <= MAX_COMMUNITIES:
        for name in value:
            if (
                type(name) is not str
                or not name.isascii()
                or not 0 < len(name) <= NAME_MAX_BYTES
                or "\x00" in name
            ):
                break
        else:  # all plain: a community named twice is counted once
            return tuple(value) if len(value) < 2 else tuple(dict.fromkeys(value))
    if type(value) is not list:
        raise InvalidParams(f"{where}: must be an array of names, got {_describe(value)}")
    if len(value) > MAX_COMMUNITIES:
        raise InvalidParams(f"{where}: at most {MAX_COMMUNITIES} names, got {len(value)}")
    names = [text(item, f"{where}[{i}]", NAME_MAX_BYTES) for i, item in enumerate(value)]
    return tuple(dict.fromkeys(names))


def _attrs(value: object, where: str) -> dict[str, Scalar]:
    if type(value) is dict and len(value) <= MAX_ATTRS:
        for key, item in value.items():
            if (
                type(key) is not str
                or not key.isascii()
                or not 0 < len(key) <= NAME_MAX_BYTES
                or "\x00" in key
            ):
                break
            kind = type(item)
            if kind is str:
                if not item.isascii() or len(item) > ATTR_VALUE_MAX_BYTES or "\x00" in item:
                    break
            elif kind is float:
                if not math.isfinite(item):
                    break
            elif kind is not int and kind is not bool:
                break
        else:
            return value  # freshly decoded and all plain: no copy needed
    if type(value) is not dict:
        raise InvalidParams(f"{where}: must be a map, got {_describe(value)}")
    if len(value) > MAX_ATTRS:
        raise InvalidParams(f"{where}: at most {MAX_ATTRS} attributes, got {len(value)}")
    out: dict[str, Scalar] = {}
    for raw_key, item in value.items():
        key = text(raw_key, f"{where} key", NAME_MAX_BYTES)
        out[key] = scalar(item, f"{where}[{key!r}]")
    return out


def signal_batch(params: list[Any]) -> list[SignalArgs]:
    arity(params, "signal_batch", "signals", 1, 1)
    items = params[0]
    if type(items) is not list:
        raise InvalidParams(f"signals: must be an array of signals, got {_describe(items)}")
    if not 1 <= len(items) <= MAX_BATCH:
        raise InvalidParams(f"signals: must hold 1..{MAX_BATCH} signals, got {len(items)}")
    out = []
    attrs = communities = 0  # bounded per request: matching and fan-out cost follow them
    for i, item in enumerate(items):
        if type(item) is not list:
            raise InvalidParams(
                f"signals[{i}]: must be an array [user_id, entity, kind, weight?, context?],"
                f" got {_describe(item)}"
            )
        try:
            parsed = signal(item)
        except InvalidParams:
            signal(item, f"signals[{i}].")  # the same error again, now naming the item
            raise
        out.append(parsed)
        if parsed.attrs or parsed.communities:
            attrs += len(parsed.attrs)
            communities += len(parsed.communities)
            if attrs > MAX_BATCH_ATTRS or communities > MAX_FANOUT:
                raise InvalidParams(
                    f"signals: at most {MAX_BATCH_ATTRS} attributes and {MAX_FANOUT} communities"
                    f" in all per request; signals[..{i}] carry {attrs} and {communities}:"
                    " send fewer signals per batch"
                )
    return out


def cohort_name(value: object) -> str:
    return text(value, "name", NAME_MAX_BYTES)


def predicate(value: object) -> Predicate:
    where = "predicate"
    if type(value) is not dict:
        raise InvalidParams(
            f"{where}: must be a map of attribute to value(s), got {_describe(value)}"
        )
    if len(value) > MAX_ATTRS:
        raise InvalidParams(f"{where}: at most {MAX_ATTRS} attributes, got {len(value)}")
    out: Predicate = {}
    for raw_key, item in value.items():
        key = text(raw_key, f"{where} key", NAME_MAX_BYTES)
        at = f"{where}[{key!r}]"
        if type(item) is list:
            if not 1 <= len(item) <= MAX_PREDICATE_VALUES:
                raise InvalidParams(
                    f"{at}: an array must hold 1..{MAX_PREDICATE_VALUES} values, got {len(item)}"
                )
            out[key] = [scalar(v, f"{at}[{i}]") for i, v in enumerate(item)]
        else:
            out[key] = scalar(item, at)
    terms = sum(len(v) if type(v) is list else 1 for v in out.values())
    if terms > MAX_PREDICATE_TERMS:
        raise InvalidParams(f"{where}: at most {MAX_PREDICATE_TERMS} values in all, got {terms}")
    size = len(msgpack.packb(out))
    if size > MAX_PREDICATE_BYTES:
        raise InvalidParams(f"{where}: at most {MAX_PREDICATE_BYTES} bytes encoded, got {size}")
    return out


def limit(value: object, where: str, most: int) -> int:
    if type(value) is not int or not 1 <= value <= most:
        raise InvalidParams(f"{where}: must be an integer in 1..{most}, got {_describe(value)}")
    return value


def time_ns(value: object, where: str) -> int:
    if type(value) is not int or not 0 <= value <= 2**63 - 1:
        raise InvalidParams(
            f"{where}: must be a time in ns since the epoch, 0..2**63-1, got {_describe(value)}"
        )
    return value


def leave_options(value: object) -> bool:
    """``leave``'s options: ``{"purge": true}`` purges the user's past with the leave."""
    where = "options"
    if value is None:
        return False
    if type(value) is not dict:
        raise InvalidParams(f"{where}: must be a map, got {_describe(value)}")
    purge = False
    for raw_key, item in value.items():
        key = raw_key.decode("utf-8", "replace") if type(raw_key) is bytes else raw_key
        if key != "purge":
            raise InvalidParams(f"{where}: unknown key {key!r}; the only key is 'purge'")
        if type(item) is not bool:
            raise InvalidParams(f"{where}.purge: must be true or false, got {_describe(item)}")
        purge = item
    return purge


#: where a page of ``counts`` starts: after this aggregate (layer, key, kind)
Cursor: TypeAlias = tuple[int, int | str, str]


def page(value: object, method: str, keys: tuple[str, ...], most: int) -> dict[str, Any]:
    """A page request ``{"after": ..., "limit": n}``: the keys it holds, checked for shape
    here and for meaning by the method."""
    where = "page"
    if value is None:
        return {}
    if type(value) is not dict:
        raise InvalidParams(f"{where}: must be a map with {' and/or '.join(map(repr, keys))}")
    out: dict[str, Any] = {}
    for raw_key, item in value.items():
        key = raw_key.decode("utf-8", "replace") if type(raw_key) is bytes else raw_key
        if key not in keys:
            raise InvalidParams(
                f"{where}: unknown key {key!r}; {method} takes {' and '.join(map(repr, keys))}"
            )
        if key == "limit" and (type(item) is not int or not 1 <= item <= most):
            raise InvalidParams(f"{where}.limit: must be an integer in 1..{most}")
        out[key] = item
    return out


def cursor(value: object) -> Cursor:
    """The ``more`` of a previous ``counts`` reply, given back."""
    where = "page.after"
    if type(value) is not list or len(value) != 3 or type(value[0]) is not int:
        raise InvalidParams(f"{where}: must be the 'more' of a previous counts reply")
    if value[0] not in (0, 1, 2):
        raise InvalidParams(f"{where}: must be the 'more' of a previous counts reply")
    layer, key, kind = value
    if layer == 1:
        if type(key) is not int or not 0 <= key < 2**63:  # a cohort id
            raise InvalidParams(f"{where}: must be the 'more' of a previous counts reply")
    else:
        key = text(key, f"{where}[1]", NAME_MAX_BYTES) if key != "" else ""
    return (layer, key, text(kind, f"{where}[2]", KIND_MAX_BYTES))


def _describe(value: object) -> str:
    if value is None:
        return "nil"
    if type(value) is bool or type(value) is int or type(value) is float:
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__
