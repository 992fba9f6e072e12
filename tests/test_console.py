"""The console (``GET /`` on the HTTP port), in a real browser: Debian's Chromium loads it
from a loaded tidal behind a token, and what it shows is checked against what the
methods answer; a screenshot is kept (build/artifacts/console.png)."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

from tidal.client import Client
from tidal.server import Config, Server

from .cdp import browser
from .http_peer import call

ARTIFACTS = Path(__file__).parent.parent / "build" / "artifacts"
TOKEN = "console-token"


async def load(server: Server) -> None:
    """Signals, Left users, a group with events out and unacknowledged, a dead letter."""
    async with await Client.connect(*server.address, token=TOKEN) as c:
        await c.call("group_create", "mailer", {"from": 0})
        await c.call("group_create", "search", {"from": 0})
        for user in range(30):
            await c.signal(user, "song", "view", communities=["jazz"])
        for user in range(12):
            await c.leave(user)


async def test_the_console_shows_what_the_methods_answer(tmp_path: Path) -> None:
    server = Server(
        Config(host="127.0.0.1", port=0, db=str(tmp_path / "t.db"), http="127.0.0.1:0", token=TOKEN)
    )
    await server.start()
    port = server.http_address[1]
    try:
        await load(server)
        async with browser() as page:
            await page.send("Network.enable")
            basic = base64.b64encode(f"any:{TOKEN}".encode()).decode()
            await page.send(
                "Network.setExtraHTTPHeaders", headers={"Authorization": f"Basic {basic}"}
            )
            await page.send("Page.navigate", url=f"http://127.0.0.1:{port}/")
            await page.until("document.body && Number(document.body.dataset.refreshed) >= 2")
            # live events, over the page's EventSource: a leave after it loaded shows
            async with await Client.connect(*server.address, token=TOKEN) as c:
                await c.leave(2**64 - 1)
            last = await asyncio.to_thread(
                lambda: call(port, "stats", token=TOKEN)["last_event_id"]
            )
            await page.until(
                f"document.getElementById('events').textContent.includes('{last} leave')"
            )
            refreshed = await page.evaluate("Number(document.body.dataset.refreshed)")
            await page.until(f"Number(document.body.dataset.refreshed) >= {refreshed + 2}")
            shown = await page.evaluate(
                "Object.fromEntries(['health', 'role', 'left', 'last-id', 'commit', 'rate']"
                ".map((id) => [id, document.getElementById(id).textContent]))"
            )
            stats = await asyncio.to_thread(call, port, "stats", token=TOKEN)
            assert shown["health"] == "ok" and shown["role"] == "primary"
            assert (
                shown["left"]
                == "13"
                == str(await asyncio.to_thread(call, port, "count_left", token=TOKEN))
            )
            assert shown["last-id"] == str(stats["last_event_id"])
            assert shown["commit"] == f"{stats['commit_p50_ms']} / {stats['commit_p99_ms']}"
            assert shown["rate"] == "0"  # nothing was signalled between its last two reads
            groups = await page.evaluate(
                "[...document.querySelectorAll('#groups tr')].map((r) =>"
                " [...r.children].map((c) => c.textContent))"
            )
            answered = await asyncio.to_thread(call, port, "groups", token=TOKEN)
            # each group's lag, pending and dead letters (its lag in seconds grows meanwhile)
            assert [row[:2] + row[3:] for row in groups] == [
                [g["name"], str(g["lag_events"]), str(g["pending"]), str(g["dead_letters"]), "0"]
                for g in answered
            ]
            assert [row[0] for row in groups] == ["mailer", "search"]
            assert all(float(row[2]) > 0 for row in groups)
            unconfirmed = await page.evaluate(
                "[...document.querySelectorAll('#unconfirmed tr')]"
                ".map((r) => r.children[0].textContent)"
            )
            users = (await asyncio.to_thread(call, port, "unconfirmed", token=TOKEN))["users"]
            assert unconfirmed == [u["user_id"] for u in users] and len(users) == 13
            waiting = await page.evaluate(
                "document.querySelector('#unconfirmed tr').children[3].textContent"
            )
            assert waiting == "mailer, search"
            await page.evaluate(
                "document.getElementById('receipt-user').value = '3';"
                "document.getElementById('receipt-form').requestSubmit()"
            )
            receipt = await page.until("document.getElementById('receipt').textContent")
            assert '"user_id": "3"' in receipt and '"mailer"' in receipt
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            (ARTIFACTS / "console.png").write_bytes(await page.screenshot())
    finally:
        await server.shutdown()


async def test_the_console_is_behind_the_token(tmp_path: Path) -> None:
    server = Server(
        Config(host="127.0.0.1", port=0, db=str(tmp_path / "t.db"), http="127.0.0.1:0", token=TOKEN)
    )
    await server.start()
    try:
        async with browser() as page:
            await page.send("Network.enable")
            await page.send("Page.navigate", url=f"http://127.0.0.1:{server.http_address[1]}/")
            seen = (await page.event("Network.responseReceived"))["params"]["response"]
            assert seen["status"] == 401  # the browser asks its user for the token
            assert seen["headers"]["www-authenticate"].startswith("Basic")
    finally:
        await server.shutdown()
