"""The remote-command protocol: version choice, the exit status a v4 client reads, the first
terminal size before any input, and terminal sizes split across DATA frames."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vkprovider.httpapi import remotecommand
from vkprovider.httpapi.limits import StreamLimits
from vkprovider.provider import TermSize


def test_the_newest_common_version_is_chosen() -> None:
    offers = ["v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io", "channel.k8s.io"]
    assert remotecommand.choose(offers) == "v4.channel.k8s.io"
    assert remotecommand.choose(["channel.k8s.io"]) == "channel.k8s.io"
    assert remotecommand.choose(["v9.channel.k8s.io"]) is None


def test_the_exit_status_is_a_status_kubectl_understands() -> None:
    assert remotecommand.status(0) == {"metadata": {}, "status": "Success"}
    failed = remotecommand.status(3)
    assert failed["reason"] == "NonZeroExitCode"
    assert failed["details"]["causes"] == [{"reason": "ExitCode", "message": "3"}]
    assert remotecommand.status(None, "pod gone")["message"] == "pod gone"


class Chunks:
    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    async def read(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


@pytest.mark.asyncio
async def test_resize_messages_may_be_split_or_joined() -> None:
    stream: Any = Chunks(b'{"Width":80,"Hei', b'ght":24}\n{"Width":100,"Height":30}{"Width"', b':1,"Height":2}')
    sizes = [s async for s in remotecommand._resizes(stream, StreamLimits())]
    assert sizes == [TermSize(80, 24), TermSize(100, 30), TermSize(1, 2)]
    await asyncio.sleep(0)


def test_a_members_exit_status_becomes_the_exit_code() -> None:
    from federation.streams.exec import exit_code, stream_query
    from vkprovider.provider import ExecStreams, ProviderError

    assert exit_code({}) == 0 and exit_code({"status": "Success"}) == 0
    assert exit_code(remotecommand.status(3)) == 3
    with pytest.raises(ProviderError, match="cmd wait"):
        exit_code({"status": "Failure", "reason": "InternalError", "message": "cmd wait: exit status 3"})
    streams = ExecStreams(stdin=None, stdout=None, stderr=None, tty=True)
    assert stream_query("c", ["sh", "-c", "x"], streams) == [
        ("container", "c"),
        ("command", "sh"),
        ("command", "-c"),
        ("command", "x"),
        ("tty", "true"),
    ]


@pytest.mark.asyncio
async def test_a_tty_sends_the_first_size_to_the_member_before_any_input() -> None:
    """Typed input that reaches us before the client's first size still goes to the member
    after it, so the command never reads a 0x0 terminal. A local WebSocket server stands in
    for the member (the protocol is the point here; e2e covers a real member)."""
    import aiohttp
    from aiohttp import web

    from federation.streams.exec import RESIZE, STDIN, V5, _bridge
    from federation.streams.session import StreamLimits
    from tests.localhttp import serving
    from vkprovider.provider import ExecStreams

    seen: list[int] = []

    async def member(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(protocols=(V5,))
        await ws.prepare(request)
        async for message in ws:
            seen.append(message.data[0])
            if message.data[0] == STDIN:
                await ws.send_bytes(b"\x03" + b'{"status":"Success"}')
                break
        await ws.close()
        return ws

    async def sizes() -> Any:
        await asyncio.sleep(0.2)  # the size comes late; the input is there at once
        yield TermSize(120, 40)

    app = web.Application()
    app.router.add_get("/exec", member)
    async with (
        serving(app) as port,
        aiohttp.ClientSession() as session,
        session.ws_connect(f"http://127.0.0.1:{port}/exec", protocols=(V5,)) as ws,
    ):
        streams = ExecStreams(stdin=Chunks(b"stty size\n"), stdout=None, stderr=None, tty=True, resizes=sizes())
        assert await _bridge(ws, streams, "ns/pod", StreamLimits()) == 0
    assert seen[:2] == [RESIZE, STDIN]
