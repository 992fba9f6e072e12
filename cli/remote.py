"""One call as the CLI makes it: connected, sent, ``moved`` followed, and whatever goes
wrong printed in one line, with the command's exit status."""

from __future__ import annotations

import argparse
import ssl
import sys
from typing import Any

#: how many times one command follows ``moved`` to another node before it gives up
MOVES = 3


def remote(args: argparse.Namespace, method: str, params: list[Any]) -> tuple[int, Any]:
    """One call as the CLI makes it: (exit status, result); errors are printed here."""
    from tidal.client import ClientError, ServerError, SyncClient, TidalError
    from tidal.client.addresses import parse
    from tidal.protocol import ErrorCode

    try:
        tls = ssl.create_default_context(cafile=args.tls_ca) if args.tls or args.tls_ca else None
    except OSError as exc:
        print(
            f"tidal {args.command}: --tls-ca {args.tls_ca}: {exc.strerror or exc}", file=sys.stderr
        )
        return 2, None
    host, port = args.host, args.port
    try:
        for hop in range(MOVES + 1):
            try:
                with SyncClient(
                    host, port, timeout=args.timeout, token=args.token, ssl=tls, reconnect=0
                ) as client:
                    return 0, client.call(method, *params)
            except ServerError as exc:
                owner = exc.data.get("owner") if exc.code == ErrorCode.MOVED else None
                if not isinstance(owner, str) or hop == MOVES:
                    raise
                # cluster mode: the user is another node's; asked again there, as redis-cli
                # -c follows MOVED (nothing was done where it was refused)
                print(f"-> moved to {owner}", file=sys.stderr)
                ((host, port),) = parse(owner, port)
        raise AssertionError("unreachable")
    except ServerError as exc:
        print(f"error {exc.code}: {exc.message}", file=sys.stderr)
        return 1, None
    except ClientError as exc:
        print(f"tidal {args.command}: cannot send {method}: {exc}", file=sys.stderr)
        return 2, None
    except TidalError as exc:
        print(f"cannot reach tidal at {args.host}:{args.port}: {exc}", file=sys.stderr)
        return 2, None
