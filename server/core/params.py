"""Validation at the edge: every parameter is checked here, and nowhere else
(a signal's, the hot path, by ``signals`` with these rules).

Each failure is an ``InvalidParams`` whose message names the argument and the
rule it broke, so a caller can fix the request without reading our source.
Strings arrive as msgpack str or bin; both are accepted as UTF-8 text.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final, TypeAlias, TypeVar

import msgpack

from tidal.protocol.errors import quoted
from tidal.protocol.limits import (
    ATTR_VALUE_MAX_BYTES,
    FEED_EVENTS,
    MAX_ATTRS,
    MAX_PREDICATE_BYTES,
    MAX_PREDICATE_TERMS,
    MAX_PREDICATE_VALUES,
    NAME_MAX_BYTES,
    USER_ID_MAX,
    WEIGHT_MAX,
)
from tidal.protocol.methods import BY_NAME
from tidal.protocol.refusals import InvalidParams

T = TypeVar("T")

Scalar: TypeAlias = str | int | float | bool
#: attribute -> the value it must have, or an array of values it may have
Predicate: TypeAlias = dict[str, Scalar | list[Scalar]]


def arity_of(method: str, params: list[Any]) -> None:
    """The method table's rule for how many params ``method`` takes."""
    message = BY_NAME[method].arity_error(len(params))
    if message is not None:
        raise InvalidParams(message)


def arity(params: list[Any], method: str, names: str, least: int, most: int) -> None:
    if not least <= len(params) <= most:
        count = str(least) if least == most else f"{least} to {most}"
        raise InvalidParams(f"{method} takes {count} params ({names}), got {len(params)}")


def user_id(value: object, where: str = "user_id") -> int:
    if type(value) is not int or not 0 <= value <= USER_ID_MAX:
        raise InvalidParams(f"{where}: must be an integer in 0..2**64-1, got {describe(value)}")
    return value


def string(value: object) -> object:
    """The one rule for a string param that is one of a few words (a window, an option's
    choice): a bin holding UTF-8 is the string it holds, as PROTOCOL.md promises of every
    string param; anything else is left for the param's own rule to refuse."""
    if type(value) is bytes:
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return value
    return value


def text(value: object, where: str, max_bytes: int) -> str:
    """A str (or UTF-8 bin) of 1..max_bytes bytes once encoded as UTF-8, without NUL."""
    if type(value) is bytes:
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidParams(f"{where}: must be valid UTF-8") from None
    if type(value) is not str:
        raise InvalidParams(f"{where}: must be a string, got {describe(value)}")
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
        got = describe(value)
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
    raise InvalidParams(f"{where}: must be a str, int, float or bool, got {describe(value)}")


def _value_text(value: str | bytes, where: str) -> str:
    # Attribute values may be empty strings, unlike names.
    if value in ("", b""):
        return ""
    return text(value, where, ATTR_VALUE_MAX_BYTES)


def cohort_name(value: object) -> str:
    return text(value, "name", NAME_MAX_BYTES)


def predicate(value: object) -> Predicate:
    where = "predicate"
    if type(value) is not dict:
        raise InvalidParams(
            f"{where}: must be a map of attribute to value(s), got {describe(value)}"
        )
    if len(value) > MAX_ATTRS:
        raise InvalidParams(f"{where}: at most {MAX_ATTRS} attributes, got {len(value)}")
    out: Predicate = {}
    for raw_key, item in value.items():
        key = text(raw_key, f"{where} key", NAME_MAX_BYTES)
        at = f"{where}[{quoted(key) if type(key) is str else repr(key)}]"
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
        raise InvalidParams(f"{where}: must be an integer in 1..{most}, got {describe(value)}")
    return value


def time_ns(value: object, where: str) -> int:
    if type(value) is not int or not 0 <= value <= 2**63 - 1:
        raise InvalidParams(
            f"{where}: must be a time in ns since the epoch, 0..2**63-1, got {describe(value)}"
        )
    return value


def leave_options(value: object) -> bool:
    """``leave``'s options: ``{"purge": true}`` purges the user's past with the leave."""
    return option(value, "purge", _flag, False)


def _flag(value: object, where: str) -> bool:
    if type(value) is not bool:
        raise InvalidParams(f"{where}: must be true or false, got {describe(value)}")
    return value


def options(value: object, where: str, method: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """A map of named options (``where``: ``options``, ``page``): the keys it holds, checked
    here for shape and by ``method`` for meaning. nil is the empty map. Every options map
    of every method is read by this one rule."""
    if value is None:
        return {}
    if type(value) is not dict:
        raise InvalidParams(f"{where}: must be a map, got {describe(value)}")
    out: dict[str, Any] = {}
    for raw_key, item in value.items():
        key = raw_key.decode("utf-8", "replace") if type(raw_key) is bytes else raw_key
        if type(key) is not str or key not in keys:
            shown = quoted(key) if type(key) is str else describe(key)
            takes = (
                f"the only key is {keys[0]!r}" if len(keys) == 1
                else f"{method} takes {', '.join(map(repr, keys))}"
            )  # fmt: skip
            raise InvalidParams(f"{where}: unknown key {shown}; {takes}")
        out[key] = item
    return out


def option(value: object, name: str, read: Callable[[object, str], T], default: T) -> T:
    """An options map that takes one key, ``name``: its value as ``read`` takes it."""
    given = options(value, "options", "", (name,))
    return read(given[name], f"options.{name}") if name in given else default


def subscribe_options(
    value: object,
) -> tuple[int | None, frozenset[str] | None, str | None]:
    """``subscribe``'s options: ``from`` (replay the events after this id first),
    ``events`` (the names to receive; all by default) and ``group`` (consume as one of a
    consumer group, which reads from its own cursor: no ``from`` with it)."""
    where = "options"
    after: int | None = None
    names: frozenset[str] | None = None
    group: str | None = None
    given = options(value, where, "subscribe", ("from", "events", "group"))
    for key, item in given.items():
        if key == "from":
            if type(item) is not int or not 0 <= item <= 2**63 - 1:
                raise InvalidParams(
                    f"{where}.from: must be an event id, an integer in 0..2**63-1, got"
                    f" {describe(item)}"
                )
            after = item
        elif key == "events":
            if type(item) is not list or not item:
                raise InvalidParams(
                    f"{where}.events: must be a non-empty array of event names, got"
                    f" {describe(item)}"
                )
            listed = [n.decode("utf-8", "replace") if type(n) is bytes else n for n in item]
            for i, name in enumerate(listed):
                if type(name) is not str or name not in FEED_EVENTS:
                    shown = repr(name) if type(name) is str else describe(name)
                    raise InvalidParams(
                        f"{where}.events[{i}]: unknown event {shown}; one of"
                        f" {', '.join(FEED_EVENTS)}"
                    )
            names = frozenset(listed)
        elif key == "group":
            group = text(item, f"{where}.group", NAME_MAX_BYTES)
    if group is not None and after is not None:
        raise InvalidParams(
            f"{where}.from: a group reads from its own cursor; leave from out (group_reset"
            " moves the cursor)"
        )
    return after, names, group


def describe(value: object) -> str:
    if value is None:
        return "nil"
    if type(value) is bool or type(value) is int or type(value) is float:
        return f"{type(value).__name__} {value!r}"
    return type(value).__name__
