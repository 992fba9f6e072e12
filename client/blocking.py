"""One connection as the blocking client holds it: a socket, its protocol state, and
one request at a time on it."""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl as ssl_module
from collections.abc import Callable, Iterator
from typing import Any

from tidal.protocol import (
    NEED_DATA,
    Connection,
    LocalProtocolError,
    Notification,
    RemoteProtocolError,
    Request,
    Response,
)

from .addresses import Address, Addresses, Choice
from .errors import (
    CallTimeout,
    ConnectFailed,
    ConnectionLost,
    ServerError,
    closed_by_server,
    from_wire,
    unsendable,
)

log = logging.getLogger("tidal.client")


class Link:
    def __init__(
        self,
        addresses: Addresses,
        timeout: float | None,
        token: str | None,
        ssl: ssl_module.SSLContext | None,
    ) -> None:
        self._addresses = addresses
        self._timeout = timeout
        self._token = token
        self._ssl = ssl
        self.sock: socket.socket | None = None
        self.conn = Connection()
        self._next_msgid = 0

    def dial(self) -> None:
        """Connect to the server that is serving (``addresses.Choice``, as ``open_any``)."""
        if not self._addresses.several:
            self._dial(self._addresses.all[0])
            return
        choice = Choice(self._addresses)
        held: tuple[socket.socket, Connection] | None = None
        for address in self._addresses.rotation():
            try:  # a refused token is raised: it is this client's mistake, not a server's state
                self._dial(address)
            except (OSError, CallTimeout) as exc:
                choice.failed(address, exc)
                continue
            try:
                health = self.roundtrip("health", [], self._timeout)
            except (OSError, CallTimeout, ServerError) as exc:
                self.drop()
                choice.failed(address, exc)
                continue
            verdict = choice.answered(address, health)
            if verdict == "use":
                if held is not None:
                    held[0].close()
                return
            if verdict == "hold":
                assert self.sock is not None
                held, self.sock = (self.sock, self.conn), None
            else:
                self.drop()
        if held is None:
            raise choice.none()
        self.sock, self.conn = held

    def _dial(self, address: Address) -> None:
        host, port = address
        where = f"{host}:{port}"
        try:
            sock = socket.create_connection((host, port), timeout=self._timeout)
        except TimeoutError:
            raise CallTimeout(f"could not connect to {where}") from None
        except OSError as exc:
            raise ConnectFailed(f"could not connect to {where}: {exc}") from exc
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self._ssl is not None:
            try:
                sock = self._ssl.wrap_socket(sock, server_hostname=host)
            except OSError as exc:
                sock.close()
                raise ConnectFailed(f"TLS with {where} failed: {exc}") from exc
        self.sock, self.conn = sock, Connection()
        if self._token is not None:
            try:
                self.roundtrip("auth", [self._token], self._timeout)
            except BaseException:
                self.drop()
                raise

    def drop(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None

    def still_open(self, sock: socket.socket) -> bool:
        """Between calls nothing is due from the server, so whatever is waiting tells:
        an end of stream (it closed or restarted), or its notice of why it closes.
        Found out here, a dropped connection costs a reconnect, not a failed call."""
        sock.setblocking(False)
        try:
            data = sock.recv(65536)
        except (BlockingIOError, ssl_module.SSLWantReadError):
            return True  # nothing waiting (with TLS: perhaps a session ticket, now read)
        except OSError:
            return False
        finally:
            sock.settimeout(self._timeout)
        if not data:
            return False
        self.conn.receive_data(data)
        try:
            while (event := self.conn.next_event()) is not NEED_DATA:
                if type(event) is Notification and event.method == "error":
                    log.warning("%s", closed_by_server(event.params))
                    return False
        except RemoteProtocolError:
            return False
        return True

    def roundtrip(
        self,
        method: str,
        params: list[Any],
        timeout: float | None,
        notified: Callable[[Notification], None] | None = None,
    ) -> Any:
        """One request, its reply. Any doubt about the stream drops the connection, so that
        a late reply can never be taken for the answer to a later request. ``notified``
        is given the notifications that arrive meanwhile (a subscription's)."""
        sock = self.sock
        assert sock is not None
        msgid = self._next_msgid
        self._next_msgid = (msgid + 1) & 0xFFFFFFFF
        try:
            request = self.conn.send(Request(msgid, method, params))
        except LocalProtocolError as exc:
            raise unsendable(exc) from None
        with self._failing(f"{method}: no reply in {timeout}s"):
            sock.settimeout(timeout)
            sock.sendall(request)
            while True:
                event = self.conn.next_event()
                if event is NEED_DATA:
                    self._read(sock)
                elif type(event) is Response and event.msgid == msgid:
                    break
                elif type(event) is Notification and event.method == "error":
                    lost = closed_by_server(event.params)
                    log.warning("%s", lost)
                    raise lost
                elif type(event) is Notification and notified is not None:
                    notified(event)
        if event.error is not None:
            raise from_wire(event.error)
        return event.result

    def notifications(self, timeout: float | None) -> list[Notification]:
        """What the server has sent unasked, waiting up to ``timeout`` for some; raises
        ``ConnectionLost`` (the connection dropped) or ``CallTimeout`` (nothing came)."""
        sock = self.sock
        assert sock is not None
        notes: list[Notification] = []
        with self._failing(f"nothing from the server in {timeout}s"):
            sock.settimeout(timeout)
            while not notes:
                event = self.conn.next_event()
                if event is NEED_DATA:
                    self._read(sock)
                elif type(event) is Notification:
                    notes.append(event)
            while (event := self.conn.next_event()) is not NEED_DATA:
                if type(event) is Notification:
                    notes.append(event)
        return notes

    def _read(self, sock: socket.socket) -> None:
        data = sock.recv(65536)
        if not data:
            raise ConnectionLost("connection lost: closed by the server")
        self.conn.receive_data(data)

    @contextlib.contextmanager
    def _failing(self, timed_out: str) -> Iterator[None]:
        """Any doubt about the stream drops the connection, and says why as the client's
        errors do: ``CallTimeout`` (``timed_out``) or ``ConnectionLost``."""
        try:
            yield
        except TimeoutError:
            self.drop()
            raise CallTimeout(timed_out) from None
        except ConnectionLost:
            self.drop()
            raise
        except (OSError, RemoteProtocolError) as exc:
            self.drop()
            raise ConnectionLost(f"connection lost: {exc}") from exc
