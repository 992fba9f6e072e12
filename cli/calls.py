"""``tidal call``'s knowledge of the methods, all from the method table: their list for
``--help``, the number and kind of arguments each takes (checked before anything is
sent), and bin values written as base64 both ways (a ``top`` cursor printed can be sent
back as it was printed)."""

from __future__ import annotations

import base64
import binascii
from typing import Any

from tidal.protocol.methods import BY_NAME, TABLE
from tidal.protocol.schemas import Schema

#: JSON Schema's types, as the Python values JSON arguments parse to
_KINDS: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
    "null": (type(None),),
}


def listing() -> str:
    """Every method with its params and what it does, for ``tidal call --help``."""
    width = max(len(m.name) for m in TABLE) + 2
    lines = ["methods (docs/PROTOCOL.md says more; rpc.discover serves them as OpenRPC):"]
    for m in TABLE:
        params = "" if not m.params else " " + " ".join(
            p.name if p.required else f"[{p.name}]" for p in m.params
        )  # fmt: skip
        lines.append(f"  {m.name:<{width}}{params}")
        lines.append(f"  {'':<{width}}  {m.summary}")
    return "\n".join(lines)


def check(method: str, params: list[Any]) -> str | None:
    """What is wrong with calling ``method`` with ``params``, or None. Only the count and
    the kind of each argument: the server applies every other rule, and says which."""
    m = BY_NAME.get(method)
    if m is None:
        return f"no method {method!r}; `tidal call --help` lists them"
    if (wrong := m.arity_error(len(params))) is not None:
        return wrong
    for i, (param, value) in enumerate(zip(m.params, params, strict=False)):
        kinds = _kinds(param.schema)
        if kinds and not any(_is(value, kind) for kind in kinds):
            got = f"{type(value).__name__} {value!r}"[:60]
            hint = " (quote it as JSON to send a string: '\"...\"')" if "string" in kinds else ""
            return (
                f"argument {i + 1} ({param.name}) must be {' or '.join(sorted(kinds))},"
                f" got {got}{hint}"
            )
    return None


def _kinds(schema: Schema) -> set[str]:
    """The JSON types a schema allows at its top, or none said."""
    if "oneOf" in schema:
        out: set[str] = set()
        for option in schema["oneOf"]:
            kinds = _kinds(option)
            if not kinds:
                return set()
            out |= kinds
        return out
    if "enum" in schema:
        return {kind for kind in _KINDS for v in schema["enum"] if _is(v, kind)}
    kind = schema.get("type")
    return {kind} if isinstance(kind, str) else set(kind or ())


def _is(value: Any, kind: str) -> bool:
    if type(value) is bool:
        return kind == "boolean"
    return isinstance(value, _KINDS[kind])


def sendable(method: str, params: list[Any]) -> list[Any]:
    """``params`` with each base64 string where the method takes a bin decoded to bytes."""
    m = BY_NAME[method]
    return [_bins(p.schema, v) for p, v in zip(m.params, params, strict=False)]


def _bins(schema: Schema, value: Any) -> Any:
    if schema.get("x-msgpack") == "bin" and type(value) is str:
        try:
            return base64.b64decode(value, validate=True)
        except binascii.Error:
            return value  # not base64: the server says what is wrong with it
    if type(value) is dict and "properties" in schema:
        props = schema["properties"]
        return {k: _bins(props[k], v) if k in props else v for k, v in value.items()}
    for option in schema.get("oneOf", ()):
        if option.get("x-msgpack") == "bin":
            return _bins(option, value)
    return value


def shown(value: object) -> Any:
    """``json.dumps``'s default: a bin as base64, as ``sendable`` reads it back."""
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    raise TypeError(f"cannot show {type(value).__name__} as JSON")


def iso(ns: int) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ns / 1e9, UTC).isoformat(timespec="milliseconds")
