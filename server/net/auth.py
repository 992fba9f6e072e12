"""``auth(token)``: with a token set, a connection's first request must be this one.

The token is compared in constant time; a connection may fail 3 times, and send
at most 1 KiB before it succeeds (counted per message by the connection).
"""

from __future__ import annotations

import hmac
from typing import Final

from tidal.protocol import ErrorCode, Request
from tidal.server.core.replies import Replier

#: Before ``auth`` succeeds a connection may send this much, and fail this often.
PREAUTH_BYTES: Final = 1024
AUTH_ATTEMPTS: Final = 3


#: what a client that sent no token is told, and how to give one
NEEDS_TOKEN = (
    "unauthorized: this server needs a token, and the first request must be auth(token);"
    " the Python client takes token=..., the tidal command reads TIDAL_TOKEN,"
    " TIDAL_TOKEN_FILE or --token-file"
)


class Auth:
    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None
        self.done = self._token is None  # nothing to prove without a token
        self._failures = 0

    def take(self, request: Request, conn: Replier) -> bool:
        """Answer a request made before ``auth`` succeeded, or ``auth`` itself.

        False once the connection has failed too often and must be closed.
        """
        if request.method != "auth":
            self._fail(conn, request.msgid, NEEDS_TOKEN)
        elif len(request.params) != 1 or not isinstance(request.params[0], str | bytes):
            self._fail(conn, request.msgid, "auth takes 1 param (token), a string")
        elif self._token is None:
            conn.reply(request.msgid, True)  # no token configured: auth is a no-op
        else:
            given = request.params[0]
            given = given.encode("utf-8", "surrogateescape") if isinstance(given, str) else given
            if hmac.compare_digest(given, self._token):
                self.done = True
                conn.reply(request.msgid, True)
            else:
                self._fail(conn, request.msgid, "unauthorized: wrong token")
        return self._failures < AUTH_ATTEMPTS

    def _fail(self, conn: Replier, msgid: int, message: str) -> None:
        self._failures += 1
        conn.reply_error(msgid, ErrorCode.UNAUTHORIZED, message)
