"""TLS with a certificate made for the test."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trustme

from tidal.client import Client, ConnectFailed
from tidal.server import Config, Server


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
async def tls_server(db_path: Path, tmp_path: Path, ca: trustme.CA) -> AsyncIterator[Server]:
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_file))
    cert.private_key_pem.write_to_path(str(key_file))
    server = Server(Config(port=0, db=str(db_path), tls_cert=str(cert_file), tls_key=str(key_file)))
    await server.start()
    yield server
    await server.shutdown()


async def test_a_client_that_trusts_the_ca_talks_tls(tls_server: Server, ca: trustme.CA) -> None:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    async with await Client.connect(*tls_server.address, ssl=context) as client:
        assert (await client.leave(3)).status == "left"
        assert (await client.status(3)).status == "left"


async def test_a_client_that_does_not_trust_it_is_refused(tls_server: Server) -> None:
    with pytest.raises(ConnectFailed, match="CERTIFICATE_VERIFY_FAILED") as refused:
        await Client.connect(*tls_server.address, ssl=ssl.create_default_context())
    assert isinstance(refused.value.__cause__, ssl.SSLCertVerificationError)


async def test_plain_text_to_a_tls_port_is_dropped_and_harms_nothing(
    tls_server: Server, ca: trustme.CA
) -> None:
    reader, writer = await asyncio.open_connection(*tls_server.address)
    # plain MessagePack-RPC pings; OpenSSL takes the first bytes for an SSLv2 record
    # header of 5,120 bytes, so send more than that before it can refuse them
    writer.write(b"\x94\x00\x01\xa4ping\x90" * 1000)
    with contextlib.suppress(ConnectionResetError):  # closed, or reset: either way
        assert await asyncio.wait_for(reader.read(), 10) == b""  # no reply in plain text
    writer.close()
    context = ssl.create_default_context()
    ca.configure_trust(context)
    async with await Client.connect(*tls_server.address, ssl=context) as client:
        assert await client.ping() == "pong"
