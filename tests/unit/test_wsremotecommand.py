"""Exec over a WebSocket on the kubelet port, as a client that reaches the kubelet directly
speaks it: v5 (binary, with the close signal), v4 over base64 text, the open signal, exit
statuses on the error channel, terminal sizes. The provider runs the in-memory provider's
built-in commands (pure; no apiserver is involved on this path)."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from tests.localhttp import serving
from vkprovider.httpapi import wsremotecommand
from vkprovider.minishell import Shell
from vkprovider.provider import ExecStreams


class Shells:
    async def exec_in_container(
        self, namespace: str, name: str, container: str, command: list[str], streams: ExecStreams
    ) -> int:
        return await Shell(streams).run(command)


@pytest_asyncio.fixture
async def base() -> AsyncIterator[str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        return await wsremotecommand.serve(request, Shells())

    app = web.Application()
    app.router.add_route("*", "/exec/{namespace}/{pod}/{container}", handler)
    async with serving(app) as port:
        yield f"http://127.0.0.1:{port}/exec/ns/pod/c"


async def session(
    url: str, command: list[str], protocol: str, sends: list[Any], **flags: str
) -> tuple[str, list[tuple[int, bytes]]]:
    """(the protocol chosen, every (channel, bytes) received) for one exec."""
    query = [("command", c) for c in command] + [(k, v) for k, v in flags.items()]
    received: list[tuple[int, bytes]] = []
    async with aiohttp.ClientSession() as http, http.ws_connect(url, params=query, protocols=(protocol,)) as ws:
        for message in sends:
            if isinstance(message, str):
                await ws.send_str(message)
            else:
                await ws.send_bytes(message)
        async for message in ws:
            decoded = wsremotecommand.decode(message.data)
            assert decoded is not None, message
            received.append(decoded)
        return ws.protocol or "", received


def channel(received: list[tuple[int, bytes]], number: int) -> bytes:
    return b"".join(data for ch, data in received if ch == number)


@pytest.mark.asyncio
async def test_v5_streams_the_exit_code_and_the_end_of_stdin(base: str) -> None:
    chosen, got = await session(
        base, ["sh", "-c", "echo out; echo err >&2; exit 3"], "v5.channel.k8s.io", [], output="1", error="1"
    )
    assert chosen == "v5.channel.k8s.io"
    assert got[0] == (1, b""), "the open signal first, on the lowest channel written"
    assert (channel(got, 1), channel(got, 2)) == (b"out\n", b"err\n")
    status = json.loads(channel(got, 3))
    assert status["reason"] == "NonZeroExitCode" and status["details"]["causes"][0]["message"] == "3"

    sends = [bytes([0]) + b"hello ", bytes([0]) + b"world", bytes([255, 0])]
    _, got = await session(base, ["cat"], "v5.channel.k8s.io", sends, input="1", output="1")
    assert channel(got, 1) == b"hello world"
    assert json.loads(channel(got, 3))["status"] == "Success"


@pytest.mark.asyncio
async def test_base64_text_and_terminal_sizes(base: str) -> None:
    chosen, got = await session(base, ["echo", "hi"], "v4.base64.channel.k8s.io", [], output="1")
    assert chosen == "v4.base64.channel.k8s.io"
    assert channel(got, 1) == b"hi\n"
    assert wsremotecommand.encode(1, b"hi", text=True) == "1" + base64.b64encode(b"hi").decode()

    resize = bytes([4]) + json.dumps({"Width": 132, "Height": 43}).encode()
    _, got = await session(base, ["stty", "size"], "v5.channel.k8s.io", [resize], output="1", tty="1")
    assert b"43 132" in channel(got, 1)


@pytest.mark.asyncio
async def test_no_common_protocol_is_refused_before_the_upgrade(base: str) -> None:
    async with aiohttp.ClientSession() as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(base, params=[("command", "true")], protocols=("v9.channel.k8s.io",))
    assert refused.value.status == 403
