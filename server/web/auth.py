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
import ipaddress
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
    def __init__(self, token: str | None, insecure: bool = False) -> None:
        self._token = token.encode() if token else None
        self._insecure = insecure
        self._hosts: dict[str, Verdict] = {}  # a connection names few: each judged once

    def judge(self, headers: dict[str, str]) -> Verdict:
        if self._token is None:
            host = headers.get("host", "")
            verdict = self._hosts.get(host)
            if verdict is None:
                verdict = self._addressed(host)
                if len(self._hosts) < 8:
                    self._hosts[host] = verdict
            return verdict
        authorization = headers.get("authorization")
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

    def _addressed(self, host: str) -> Verdict:
        """Without a token (on loopback), a request must be addressed to an IP address or
        localhost: a page on another site whose name is rebound to 127.0.0.1 (DNS
        rebinding) would otherwise be the same origin as this server to a browser."""
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host
        name = name.strip("[]").lower()
        if self._insecure or not name or name == "localhost" or _is_ip(name):
            return ALLOWED
        return Verdict(
            False,
            f"unauthorized: Host {host[:100]!r}: without a token this server answers only"
            " requests addressed to an IP address or localhost (a name could be another"
            " site's, rebound to this machine); set --token to serve others",
        )


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
