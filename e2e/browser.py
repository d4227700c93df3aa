"""Headless Chromium (Debian's package, /usr/bin/chromium) driven over the DevTools protocol on
a WebSocket, as far as the dashboard's tests need: open a page, evaluate script in it, take a
screenshot. Written here rather than pulling in a browser-automation framework: a handful of
protocol calls is all it takes.

The flags are the ones this machine's closed network needs: without the background-networking
ones Chromium keeps dialling Google's hosts and its connections are refused.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1000",
    "--remote-debugging-port=0",
]


def chromium() -> str:
    found = shutil.which("chromium") or (CHROMIUM if Path(CHROMIUM).exists() else None)
    if found is None:
        raise RuntimeError(
            "no Chromium: the dashboard's browser test needs Debian's chromium package "
            "(`make test` installs it with apt-get when it can; or: apt-get install chromium)"
        )
    return found


class Browser:
    def __init__(self, profile: Path) -> None:
        self.profile = profile
        self.proc: subprocess.Popen[bytes] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._events: list[dict[str, Any]] = []
        #: What the page threw or logged as an error (Runtime.exceptionThrown, console.error),
        #: as "message (url:line)", in order: a test fails on any (`check_errors`).
        self.errors: list[str] = []

    async def __aenter__(self) -> Browser:
        self.profile.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Chromium did not start (exit {self.proc.poll()})")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        self._session = aiohttp.ClientSession()
        async with self._session.get(f"http://127.0.0.1:{port}/json/list") as resp:
            targets = await resp.json(content_type=None)
        page = next(t for t in targets if t.get("type") == "page")
        self._ws = await self._session.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._session is not None:
            await self._session.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                await asyncio.to_thread(self.proc.wait, 15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait)

    async def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0) -> dict[str, Any]:
        assert self._ws is not None
        call = next(self._ids)
        await self._ws.send_str(json.dumps({"id": call, "method": method, "params": params or {}}))
        async with asyncio.timeout(timeout):
            while True:
                message = json.loads((await self._ws.receive()).data)
                if message.get("id") == call:
                    if "error" in message:
                        raise RuntimeError(f"{method}: {message['error']}")
                    return dict(message.get("result") or {})
                self._events.append(message)
                self._page_error(message)

    def _page_error(self, message: dict[str, Any]) -> None:
        params = message.get("params") or {}
        if message.get("method") == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails") or {}
            text = (details.get("exception") or {}).get("description") or details.get("text", "")
            self.errors.append(f"{text} ({details.get('url', '')}:{details.get('lineNumber', '?')})")
        elif message.get("method") == "Runtime.consoleAPICalled" and params.get("type") == "error":
            self.errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", [])))

    async def check_errors(self) -> None:
        """Fail if the page has thrown or logged an error so far (events up to now included)."""
        await self.send("Runtime.evaluate", {"expression": "1"})  # lets pending events arrive
        if self.errors:
            raise AssertionError(f"the page reported {len(self.errors)} error(s): {self.errors}")

    async def goto(self, url: str) -> None:
        self._events.clear()
        await self.send("Page.navigate", {"url": url})
        deadline = time.monotonic() + 30
        while not any(e.get("method") == "Page.loadEventFired" for e in self._events):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} did not load")
            await self.send("Runtime.evaluate", {"expression": "1"})  # lets events arrive

    async def eval(self, expression: str) -> Any:
        result = await self.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True}
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result.get("result", {}).get("value")

    async def screenshot(self, path: Path) -> Path:
        shot = await self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(shot["data"]))
        return path


async def wait_for(browser: Browser, expression: str, *, timeout: float = 30.0) -> Any:
    """Poll `expression` in the page until it is truthy; its value."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        with contextlib.suppress(RuntimeError):
            last = await browser.eval(expression)
            if last:
                return last
        await asyncio.sleep(0.25)
    raise AssertionError(f"the page never gave {expression!r} (last: {last!r})")
