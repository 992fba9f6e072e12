"""Who may ask over HTTP: with a token set, every request but the probes (``/health``,
``/ready``) carries it, as ``Authorization: Bearer TOKEN``, or as the password of HTTP
Basic auth, which a browser asks for once and then sends with each request of the
console, its event stream too (an EventSource cannot set a header).

The token is compared in constant time. A request refused is answered 401 and its
connection closed: its body is never read.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from dataclasses import dataclass
from typing import Final

#: what a client that sent no token, or a wrong one, is told
NEEDS_TOKEN: Final = (
    "unauthorized: this server needs its token, as Authorization: Bearer TOKEN"
    " (curl: -H 'Authorization: Bearer ...'; a browser: the password of Basic auth)"
)


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    message: str = ""


ALLOWED: Final = Verdict(True)


class HttpAuth:
    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None

    def judge(self, authorization: str | None) -> Verdict:
        if self._token is None:
            return ALLOWED
        if not authorization:
            return Verdict(False, NEEDS_TOKEN)
        scheme, _, given = authorization.partition(" ")
        scheme = scheme.lower()
        if scheme == "basic":
            try:
                given = base64.b64decode(given.strip(), validate=True).decode("latin-1")
            except (binascii.Error, ValueError):
                return Verdict(False, "unauthorized: Basic credentials are not base64")
            given = given.partition(":")[2]  # any user name; the token is the password
        elif scheme != "bearer":
            return Verdict(False, NEEDS_TOKEN)
        if hmac.compare_digest(given.strip().encode("latin-1"), self._token):
            return ALLOWED
        return Verdict(False, "unauthorized: wrong token")
