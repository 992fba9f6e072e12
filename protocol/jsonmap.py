"""JSON for the HTTP edge: a request's params from a JSON body, and an answer as JSON.

MessagePack carries what JSON cannot, so the mapping is decided here, once, by the
method table's schemas (``schemas``), after protobuf's JSON mapping of int64:

- an integer whose range goes past 2**53 (a user id, a time in nanoseconds, an event
  id, a feed cursor) is answered as a string of decimal digits, always, so that every
  JSON parser reads it exactly; a request may give it as a number or as such a string;
- a bin (a ``top`` cursor, a compact ack's bits) is base64 text both ways;
- a body is refused if it repeats a key in an object, holds NaN or Infinity, or nests
  past what the parser takes: each is a ``JsonError`` naming what is wrong.

What comes out of ``params`` is what MessagePack would have carried, and goes through
the same edge (``core.edge``): no rule is checked here that is not checked there.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Callable
from typing import Any, Final

from .errors import ErrorCode
from .method import REQUIRED, Method
from .schemas import Schema

#: past this, a JSON number stops being exact in JavaScript and other doubles' parsers
EXACT_MAX: Final = 2**53 - 1
_DIGITS: Final = re.compile(r"-?[0-9]{1,20}")

Convert = Callable[[Any], Any]


class JsonError(ValueError):
    """A body that is not JSON the edge takes; the message names where and why, and
    ``code`` is its error: not JSON at all (-32700), or not the method's params (-32602)."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.INVALID_PARAMS) -> None:
        super().__init__(message)
        self.code = code


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise JsonError(f"body: the key {key!r} is given twice in one object")
    return out


def _constant(name: str) -> Any:
    raise JsonError(f"body: {name} is not a number JSON allows")


#: made once: ``json.loads`` and ``json.dumps`` with options build one at every call
_DECODER: Final = json.JSONDecoder(object_pairs_hook=_pairs, parse_constant=_constant)
_ENCODER: Final = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
_ASCII: Final = json.JSONEncoder(separators=(",", ":"))


def loads(data: bytes) -> Any:
    """A body's JSON, strictly (RFC 8259: UTF-8, no repeated keys, no NaN)."""
    try:
        return _DECODER.decode(data.decode())
    except RecursionError:
        raise JsonError("body: nested too deeply", ErrorCode.PARSE_ERROR) from None
    except UnicodeDecodeError as exc:
        why = f"body: not UTF-8 ({exc.reason} at byte {exc.start})"
        raise JsonError(why, ErrorCode.PARSE_ERROR) from None
    except json.JSONDecodeError as exc:
        why = f"body: not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        raise JsonError(why, ErrorCode.PARSE_ERROR) from None


def dumps(value: Any) -> bytes:
    try:
        return _ENCODER.encode(value).encode()
    except UnicodeEncodeError:  # a lone surrogate: escaped, as JSON allows
        return _ASCII.encode(value).encode()


# -- the schemas' walk ------------------------------------------------------------------


def _is_wide(schema: Schema) -> bool:
    """An integer whose range goes past what a double holds exactly."""
    return schema.get("type") == "integer" and schema.get("maximum", 0) > EXACT_MAX


def _is_bin(schema: Schema) -> bool:
    return schema.get("x-msgpack") == "bin"


def _branches(schema: Schema) -> list[Schema]:
    return [schema, *schema.get("oneOf", ())]


def _merged(schema: Schema) -> tuple[bool, bool, dict[str, Schema], Schema | None, Any]:
    """What any branch of ``schema`` says: wide, bin, object properties (with
    ``additionalProperties``), and array items (a schema, or a list by position)."""
    wide = bin_ = False
    props: dict[str, Schema] = {}
    more: Schema | None = None
    items: Any = None
    for b in _branches(schema):
        wide = wide or _is_wide(b)
        bin_ = bin_ or _is_bin(b)
        props.update(b.get("properties", {}))
        extra = b.get("additionalProperties")
        if isinstance(extra, dict):
            more = extra
        if "items" in b:
            items = b["items"]
    return wide, bin_, props, more, items


def _compile(schema: Schema, inward: bool) -> Convert | None:
    """A function that maps a value of ``schema`` to JSON (``inward`` False) or from it;
    None where nothing in it needs mapping (the value passes as it is)."""
    wide, bin_, props, more, items = _merged(schema)
    fields = {k: c for k, s in props.items() if (c := _compile(s, inward)) is not None}
    rest = None if more is None else _compile(more, inward)
    if isinstance(items, list):
        at = [_compile(s, inward) for s in items]
        each = None
    else:
        at = []
        each = None if items is None else _compile(items, inward)
    if not (wide or bin_ or fields or rest or each or any(at)):
        return None
    scalar = (_wide_in if inward else _wide_out) if wide else None
    binary = (_bin_in if inward else _bin_out) if bin_ else None

    def convert(value: Any) -> Any:
        kind = type(value)
        if kind is dict:
            if not (fields or rest):
                return value
            out = {}
            for k, v in value.items():
                c = fields.get(k, rest)
                out[k] = v if c is None else c(v)
            return out
        if kind is list or kind is tuple:
            if at:
                return _by_position(at, value)
            return value if each is None else [each(v) for v in value]
        if scalar is not None and (kind is int or kind is str):
            return scalar(value)
        if binary is not None and (kind is bytes or kind is str):
            return binary(value)
        return value

    return convert


def _by_position(converters: list[Convert | None], values: list[Any]) -> list[Any]:
    out = list(values)
    for i, c in enumerate(converters[: len(out)]):
        if c is not None:
            out[i] = c(out[i])
    return out


def _wide_out(value: Any) -> Any:
    return str(value) if type(value) is int else value


def _wide_in(value: Any) -> Any:
    if type(value) is str and _DIGITS.fullmatch(value):
        return int(value)
    return value  # the edge says what is wrong with it, naming the param


def _bin_out(value: Any) -> Any:
    return base64.b64encode(value).decode() if type(value) is bytes else value


def _bin_in(value: Any) -> Any:
    if type(value) is not str:
        return value
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return value  # not base64: the edge refuses it as no bin, naming the param


def outward(schema: Schema) -> Convert | None:
    return _compile(schema, False)


def inward(schema: Schema) -> Convert | None:
    return _compile(schema, True)


class Mapping:
    """One method's JSON, both ways, its converters compiled once."""

    __slots__ = ("_ins", "_names", "method", "result")

    def __init__(self, method: Method) -> None:
        self.method = method
        self._names = {p.name: i for i, p in enumerate(method.params)}
        self._ins = [inward(p.schema) for p in method.params]
        self.result = outward(method.result)

    def params(self, body: Any) -> list[Any]:
        """The params, in order, from a JSON array of them or an object keyed by name
        (absent: []). A missing param with a default takes it; the arity and every
        value's rule are the edge's, as for MessagePack."""
        method = self.method
        if body is None:
            given: list[Any] = []
        elif type(body) is list:
            given = body
        elif type(body) is dict:
            given = self._named(body)
        else:
            raise JsonError(
                f"body: {method.name} takes a JSON array of its params or an object keyed by"
                f" their names ({method.signature}), got a {type(body).__name__}"
            )
        return _by_position(self._ins, given)

    def _named(self, body: dict[str, Any]) -> list[Any]:
        method = self.method
        for key in body:
            if key not in self._names:
                raise JsonError(
                    f"body: {method.name} has no param {key!r}; it takes ({method.signature})"
                )
        out: list[Any] = []
        last = max((self._names[k] for k in body), default=-1)
        for i, p in enumerate(method.params):
            if p.name in body:
                out.append(body[p.name])
            elif p.default is REQUIRED:
                raise JsonError(f"{p.name}: required ({method.name} takes {method.signature})")
            elif i < last:
                out.append(p.default)
        return out

    def answer(self, result: Any) -> Any:
        return result if self.result is None else self.result(result)
