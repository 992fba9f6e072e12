"""The OpenRPC document (open-rpc.org) of tidal's methods, built from the method table.

OpenRPC describes JSON-RPC APIs; tidal speaks MessagePack-RPC, whose requests carry the
same method names and positional params (``paramStructure: by-position``), and whose
values map onto JSON Schema as ``schemas`` says. ``rpc.discover`` serves this document;
``docs/openrpc.json`` is the same, written by ``python -m tidal.protocol.openrpc``.
"""

from __future__ import annotations

import json
import sys
from importlib import metadata
from typing import Any, Final

from .errors import ErrorCode
from .methods import TABLE, Method

#: the OpenRPC specification this document follows
OPENRPC: Final = "1.4.1"

#: each error code: its name, what it means, and its ``data`` (PROTOCOL.md says more)
ERRORS: Final[dict[ErrorCode, tuple[str, str, Any]]] = {
    ErrorCode.PARSE_ERROR: (
        "parse error",
        "the bytes are not MessagePack; the connection is closed",
        {},
    ),
    ErrorCode.INVALID_REQUEST: ("invalid request", "a request of the wrong shape", {}),
    ErrorCode.METHOD_NOT_FOUND: ("method not found", "no such method", {}),
    ErrorCode.INVALID_PARAMS: (
        "invalid params",
        "a parameter broke its rule; the message names the parameter and the rule. data:"
        " {oldest: id} when subscribe's from is older than the events kept, {lost: [first,"
        " last]} when a consumer group lost events to retention, else {}",
        {"oldest": 812},
    ),
    ErrorCode.INTERNAL_ERROR: (
        "internal error",
        "a bug in tidal; the request may or may not have been applied",
        {},
    ),
    ErrorCode.UNAUTHORIZED: ("unauthorized", "auth has not succeeded on this connection", {}),
    ErrorCode.UNAVAILABLE: (
        "unavailable",
        "nothing was saved (unless the message says what was). data.kind: starting (ask"
        " again shortly), standby (ask the tidal serving), retry (send it again), full (the"
        " memory budget), stopping (a node shutting down) or unavailable (storage)",
        {"kind": "starting"},
    ),
    ErrorCode.TOO_LARGE: (
        "too large",
        "a message over the size limit; the connection is closed",
        {},
    ),
    ErrorCode.MOVED: (
        "moved",
        "cluster mode: another node serves the user; nothing was applied. data: {owner:"
        " host:port or nil, user_id, partition}",
        {"owner": "10.0.0.2:7411", "user_id": 42, "partition": 204},
    ),
}

#: the errors every method may answer, besides its own
COMMON: Final = (
    ErrorCode.INVALID_PARAMS,
    ErrorCode.INTERNAL_ERROR,
    ErrorCode.UNAUTHORIZED,
    ErrorCode.UNAVAILABLE,
)


def _error_name(code: ErrorCode) -> str:
    return ERRORS[code][0].replace(" ", "_")


def _method(m: Method) -> dict[str, Any]:
    errors = [*COMMON, *((ErrorCode.MOVED,) if m.route in ("user", "groups") else ())]
    out: dict[str, Any] = {
        "name": m.name,
        "summary": m.summary,
        "paramStructure": "by-position",
        "params": [
            {
                "name": p.name,
                "summary": p.summary,
                "required": p.required,
                "schema": p.schema if p.required else {**p.schema, "default": p.default},
            }
            for p in m.params
        ],
        "result": {"name": m.result_name, "schema": m.result},
        "errors": [{"$ref": f"#/components/errors/{_error_name(code)}"} for code in errors],
        "x-writes": m.writes,
        "x-cluster-route": m.route,
    }
    if m.examples:
        out["examples"] = [
            {
                "name": f"{m.name} {i + 1}",
                "params": [
                    {"name": p.name, "value": value}
                    for p, value in zip(m.params, params, strict=False)
                ],
                "result": {"name": m.result_name, "value": result},
            }
            for i, (params, result) in enumerate(m.examples)
        ]
    return out


def document(version: str) -> dict[str, Any]:
    """The OpenRPC document of a tidal of ``version``."""
    return {
        "openrpc": OPENRPC,
        "info": {
            "title": "tidal",
            "version": version,
            "description": (
                "A signal server with an instant, durable leave switch. It speaks"
                " MessagePack-RPC over TCP: a request is [0, msgid, method, params], a"
                " response [1, msgid, error, result] with error [code, message, data] or nil,"
                " a notification [2, method, params]. Params are positional. MessagePack"
                " values map onto JSON Schema as JSON's do; a string may come as a str or"
                " a bin of UTF-8; a value marked x-msgpack: bin is opaque bytes (a bin),"
                " written in base64 where it must be text. Integers are 64-bit: user_id is"
                " unsigned (past a signed long), nanosecond times are past 2**53."
            ),
            "license": {"name": "MIT"},
        },
        "servers": [
            {
                "name": "tidal",
                "url": "tcp://127.0.0.1:7411",
                "summary": "tidal serve's default address",
            }
        ],
        "methods": [_method(m) for m in TABLE],
        "components": {
            "errors": {
                _error_name(code): {
                    "code": int(code),
                    "message": f"{name}: {meaning}",
                    "data": data,
                }
                for code, (name, meaning, data) in ERRORS.items()
            }
        },
    }


def main() -> None:
    """Writes the document of the tidal installed (``docs/openrpc.json``: ``make openrpc``)."""
    json.dump(document(metadata.version("tidal")), sys.stdout, indent=2)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
