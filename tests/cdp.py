"""Headless Chromium (Debian's), driven over the Chrome DevTools Protocol: a real browser
loads a page, runs its script, and is asked what it shows. Used by the console's test."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import tempfile
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect

#: Debian's binary (its /usr/bin/chromium is a shell wrapper that adds flags of its own)
BINARIES = ("/usr/lib/chromium/chromium", "chromium", "chromium-browser")


def binary() -> str:
    for name in BINARIES:
        found = shutil.which(name) or (name if os.access(name, os.X_OK) else None)
        if found:
            return found
    pytest.fail("this test needs a real browser: apt-get install chromium (make tools does)")


class Page:
    def __init__(self, ws: ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []  # what the browser told meanwhile

    async def send(self, method: str, **params: Any) -> Any:
        msgid = next(self._ids)
        await self._ws.send(json.dumps({"id": msgid, "method": method, "params": params}))
        while True:
            message = json.loads(await self._ws.recv())
            if "method" in message:
                self.events.append(message)
            elif message.get("id") == msgid:
                if "error" in message:
                    raise AssertionError(f"{method}: {message['error']}")
                return message.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        answer = await self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in answer:
            raise AssertionError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def until(self, expression: str, timeout: float = 30.0) -> Any:
        """The value of ``expression`` once it is truthy: the page waits for its own state,
        and answers when it holds."""
        waited = (
            "new Promise((resolve) => { const check = () => { const v = (" + expression + ");"
            " if (v) resolve(v); else setTimeout(check, 20); }; check(); })"
        )
        async with asyncio.timeout(timeout):
            answer = await self.send(
                "Runtime.evaluate", expression=waited, returnByValue=True, awaitPromise=True
            )
        if "exceptionDetails" in answer:
            raise AssertionError(f"{expression}: {answer['exceptionDetails']}")
        return answer["result"].get("value")

    async def event(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        """The first event ``method`` the browser sends (waited for, if not yet sent)."""
        async with asyncio.timeout(timeout):
            while True:
                for e in self.events:
                    if e["method"] == method:
                        return e
                message = json.loads(await self._ws.recv())
                if "method" in message:
                    self.events.append(message)

    async def screenshot(self) -> bytes:
        shot = await self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        return base64.b64decode(shot["data"])


@asynccontextmanager
async def browser() -> AsyncIterator[Page]:
    """A headless Chromium of its own profile, and its first page."""
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as profile:
        proc = await asyncio.create_subprocess_exec(
            binary(), "--headless=new", "--no-sandbox", "--disable-gpu",
            "--remote-debugging-port=0", f"--user-data-dir={profile}",
            "--window-size=1200,1400", "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its helper processes go with it
        )  # fmt: skip
        assert proc.stderr is not None
        drain: asyncio.Task[bytes] | None = None
        try:
            port = await asyncio.wait_for(_devtools_port(proc.stderr), 60)
            # what it logs after is read and let go of, so that its pipe never fills
            drain = asyncio.create_task(proc.stderr.read())
            listed = await asyncio.to_thread(_json, f"http://127.0.0.1:{port}/json/list")
            target = next(t for t in listed if t["type"] == "page")
            async with connect(target["webSocketDebuggerUrl"], max_size=None) as ws:
                yield Page(ws)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            if drain is not None:
                await drain


async def _devtools_port(stderr: asyncio.StreamReader) -> int:
    while line := await stderr.readline():
        found = re.search(rb"DevTools listening on ws://[^:]+:(\d+)/", line)
        if found:
            return int(found[1])
    raise AssertionError("chromium exited before it listened for DevTools")


def _json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.load(r)
