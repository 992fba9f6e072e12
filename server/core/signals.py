"""A signal's parameters, checked on the path every signal takes.

Its checks come in two layers: an inline test that passes the common case
(ASCII strings without NUL, plain numbers) without a function call, and, for
anything else, the general rule in ``params``, which accepts what the inline
test may have missed (non-ASCII text, bin strings) or raises the error that
names the argument. The inline test is only a pre-filter: each of its conditions
is one the rule also holds, so it never accepts what the rule refuses
(tests/test_storable.py sends what it might miss).
"""

from __future__ import annotations

import math
from typing import Any, Final, NamedTuple

from tidal.protocol.errors import quoted
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
    NAME_MAX_BYTES,
    USER_ID_MAX,
    WEIGHT_MAX,
)
from tidal.protocol.messages import new_tuple
from tidal.protocol.refusals import InvalidParams

from .params import Scalar, arity, describe, option, scalar, string, text, user_id, weight

I64_MAX: Final = 2**63 - 1


class SignalArgs(NamedTuple):
    user_id: int
    entity: str
    kind: str
    weight: float
    communities: tuple[str, ...]
    attrs: dict[str, Scalar]
    key: str | None  # the caller's idempotency key, context "id"
    at_ns: int | None  # when it happened, context "at_ns" (checked against the clock later)


def single_signal(params: list[Any], where: str = "") -> SignalArgs:
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
        return new_tuple(SignalArgs, (uid, entity, kind, 1.0, (), _NO_ATTRS, None, None))
    w = params[3]
    if type(w) is not float or not -WEIGHT_MAX <= w <= WEIGHT_MAX:
        w = weight(w, f"{where}weight")
    if len(params) == 4 or params[4] is None:
        return new_tuple(SignalArgs, (uid, entity, kind, w, (), _NO_ATTRS, None, None))
    communities, attrs, key, at_ns = _context(params[4], f"{where}context")
    return new_tuple(SignalArgs, (uid, entity, kind, w, communities, attrs, key, at_ns))


_SIGNAL_PARAMS: Final = "user_id, entity, kind, weight=1.0, context={}"
_NO_ATTRS: Final[dict[str, Scalar]] = {}


def _context(
    value: object, where: str
) -> tuple[tuple[str, ...], dict[str, Scalar], str | None, int | None]:
    if type(value) is not dict:
        raise InvalidParams(f"{where}: must be a map, got {describe(value)}")
    communities: tuple[str, ...] = ()
    attrs: dict[str, Scalar] = _NO_ATTRS
    idempotency_key = at_ns = None
    for raw_key, item in value.items():
        key = raw_key.decode("utf-8", "replace") if type(raw_key) is bytes else raw_key
        if key == "communities":
            communities = _communities(item, f"{where}.communities")
        elif key == "attrs":
            attrs = _attrs(item, f"{where}.attrs")
        elif key == "id":
            idempotency_key = text(item, f"{where}.id", KEY_MAX_BYTES)
        elif key == "at_ns":
            if type(item) is not int or not 0 <= item <= I64_MAX:
                raise InvalidParams(
                    f"{where}.at_ns: must be an integer of ns since the epoch, 0..2**63-1,"
                    f" got {describe(item)}"
                )
            at_ns = item
        else:
            raise InvalidParams(
                f"{where}: unknown key {quoted(key)}; the keys are 'communities', 'attrs', 'id'"
                " and 'at_ns'"
            )
    return communities, attrs, idempotency_key, at_ns


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
        raise InvalidParams(f"{where}: must be an array of names, got {describe(value)}")
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
        raise InvalidParams(f"{where}: must be a map, got {describe(value)}")
    if len(value) > MAX_ATTRS:
        raise InvalidParams(f"{where}: at most {MAX_ATTRS} attributes, got {len(value)}")
    out: dict[str, Scalar] = {}
    for raw_key, item in value.items():
        key = text(raw_key, f"{where} key", NAME_MAX_BYTES)
        out[key] = scalar(item, f"{where}[{quoted(key)}]")
    return out


def signal_batch(params: list[Any]) -> tuple[list[SignalArgs], bool]:
    """The signals, and whether the caller asked for the compact acknowledgement."""
    arity(params, "signal_batch", "signals, options={}", 1, 2)
    compact = _batch_options(params[1]) if len(params) == 2 else False
    items = params[0]
    if type(items) is not list:
        raise InvalidParams(f"signals: must be an array of signals, got {describe(items)}")
    if not 1 <= len(items) <= MAX_BATCH:
        raise InvalidParams(f"signals: must hold 1..{MAX_BATCH} signals, got {len(items)}")
    out = []
    attrs = communities = 0  # bounded per request: matching and fan-out cost follow them
    for i, item in enumerate(items):
        if type(item) is not list:
            raise InvalidParams(
                f"signals[{i}]: must be an array [user_id, entity, kind, weight?, context?],"
                f" got {describe(item)}"
            )
        try:
            parsed = single_signal(item)
        except InvalidParams:
            single_signal(item, f"signals[{i}].")  # the same error again, now naming the item
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
    return out, compact


def _batch_options(value: object) -> bool:
    """``{"ack": "compact"}`` or ``{"ack": "full"}`` (the default)."""
    return option(value, "ack", _compact, False)


def _compact(value: object, where: str) -> bool:
    value = string(value)
    if type(value) is not str or value not in ("compact", "full"):
        raise InvalidParams(f"{where}: must be 'compact' or 'full', got {describe(value)}")
    return value == "compact"


def compact_acks(acks: list[tuple[int, bool]], first_seq: int) -> dict[str, Any]:
    """A batch's acknowledgements in a few bytes, not a map per signal: the signals that are
    not repeats took consecutive seqs from ``first_seq`` on, in order, so only the repeats
    (a key seen before) need theirs, as ``[index, seq]`` pairs (an array, not a map: many
    MessagePack decoders refuse integer map keys by default), and ``forwarded`` is one bit
    per signal."""
    bits = bytearray((len(acks) + 7) // 8)
    repeated: list[list[int]] = []
    expected = first_seq
    for i, (seq, forwarded) in enumerate(acks):
        if forwarded:
            bits[i >> 3] |= 1 << (i & 7)
        if seq == expected:
            expected += 1
        else:
            repeated.append([i, seq])
    return {"first_seq": first_seq, "forwarded": bytes(bits), "repeated": repeated}
