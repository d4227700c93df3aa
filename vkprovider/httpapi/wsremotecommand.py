"""`/exec` and `/attach` on the kubelet port for clients that come with a WebSocket: a client
that reaches the kubelet directly, or an apiserver that passes kubectl's WebSocket through (it
does so only for a node that declares ExtendWebSocketsToKubelet, which ours does not: kubectl's
port-forward would then arrive as SPDY tunnelled in a WebSocket, which we do not speak).

Protocols, as the kubelet's: v5.channel.k8s.io, v4.channel.k8s.io, channel.k8s.io (binary:
the channel in the first byte) and v4.base64.channel.k8s.io, base64.channel.k8s.io (text: the
channel as an ASCII digit, the bytes in base64). Channels: 0 stdin, 1 stdout, 2 stderr, 3 error
(a metav1.Status from v4 on, the error's text before), 4 terminal sizes (JSON); in v5 a message
[255, N] closes channel N (the end of stdin). As the kubelet does, the server first sends an
empty message on the lowest channel it writes, to tell the client the session is open.

Bounded as the SPDY sessions are (`StreamLimits`): a message over `max_message_bytes` closes the
WebSocket (1009, message too big); input is back-pressured by bytes: while a channel holds more
than `session_buffer_bytes` the command has not read, we stop reading the socket.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from vkprovider.httpapi import remotecommand
from vkprovider.httpapi.limits import DEFAULT_LIMITS, StreamLimits
from vkprovider.httpapi.spdysession import StreamReset
from vkprovider.provider import ExecStreams, TermSize

T = TypeVar("T")

V5, V4, V4_BASE64 = "v5.channel.k8s.io", "v4.channel.k8s.io", "v4.base64.channel.k8s.io"
PROTOCOLS = (V5, V4, V4_BASE64, "channel.k8s.io", "base64.channel.k8s.io")
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255


def encode(channel: int, data: bytes, *, text: bool) -> str | bytes:
    if text:
        return chr(ord("0") + channel) + base64.b64encode(data).decode()
    return bytes([channel]) + data


def decode(message: str | bytes) -> tuple[int, bytes] | None:
    """(channel, bytes) of one message; None for an empty or malformed one."""
    if isinstance(message, str):
        if not message or not "0" <= message[0] <= "9":
            return None
        try:
            return ord(message[0]) - ord("0"), base64.b64decode(message[1:], validate=True)
        except ValueError:
            return None
    return (message[0], message[1:]) if message else None


class _Input:
    """What the client sends on one channel, in order; b"" at its end. `put` waits while the
    channel holds `limit` bytes or more that nobody read, or, with `keep_latest` (terminal
    sizes: only the last one matters), drops the oldest instead, so it never holds the socket's
    reading up."""

    def __init__(self, limit: int, *, keep_latest: bool = False) -> None:
        self._chunks: collections.deque[bytes] = collections.deque()
        self.held = 0
        self._limit = limit
        self._keep_latest = keep_latest
        self._ready = asyncio.Event()
        self._room = asyncio.Event()
        self._room.set()
        self.closed = False

    async def put(self, data: bytes) -> None:
        while self._keep_latest and self.held >= self._limit and self._chunks:
            self.held -= len(self._chunks.popleft())
        while self.held >= self._limit and not self.closed:
            self._room.clear()
            await self._room.wait()
        if not self.closed and data:
            self._chunks.append(data)
            self.held += len(data)
            self._ready.set()

    def close(self) -> None:
        self.closed = True
        self._ready.set()
        self._room.set()

    async def read(self) -> bytes:
        while not self._chunks:
            if self.closed:
                return b""
            self._ready.clear()
            await self._ready.wait()
        data = self._chunks.popleft()
        self.held -= len(data)
        self._room.set()
        return data


class _Output:
    def __init__(self, ws: web.WebSocketResponse, channel: int, text: bool) -> None:
        self._ws, self._channel, self._text = ws, channel, text

    async def write(self, data: bytes) -> None:
        if self._ws.closed:
            raise StreamReset(f"the client closed the WebSocket (channel {self._channel})")
        message = encode(self._channel, data, text=self._text)
        try:
            if isinstance(message, str):
                await self._ws.send_str(message)
            else:
                await self._ws.send_bytes(message)
        except ConnectionError as exc:
            raise StreamReset(f"the client went away: {exc}") from exc


async def _sizes(source: _Input) -> AsyncIterator[TermSize]:
    while data := await source.read():
        try:
            size = remotecommand.term_size(json.loads(data))
        except (ValueError, RecursionError):  # not JSON, or nested deeper than Python parses
            continue
        if size is not None:
            yield size


async def serve(
    request: web.Request, provider: object, *, attach: bool = False, limits: StreamLimits = DEFAULT_LIMITS
) -> web.StreamResponse:
    refused = remotecommand.refusal(request, provider, attach=attach)
    if refused is not None:
        return refused
    offered = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    if not set(offered) & set(PROTOCOLS):
        speaks = ", ".join(PROTOCOLS)
        return web.Response(status=403, text=f"no protocol in common; this kubelet speaks {speaks}\n")
    ws = web.WebSocketResponse(protocols=PROTOCOLS, max_msg_size=limits.max_message_bytes, autoping=True)
    await ws.prepare(request)
    protocol = ws.ws_protocol or ""
    text = "base64" in protocol
    stdin_on, stdout_on, stderr_on, tty = remotecommand.wanted(request.query)
    stdin, resize = _Input(limits.session_buffer_bytes), _Input(limits.resize_buffer_bytes, keep_latest=True)
    io = ExecStreams(
        stdin=stdin if stdin_on else None,
        stdout=_Output(ws, STDOUT, text) if stdout_on else None,
        stderr=_Output(ws, STDERR, text) if stderr_on else None,
        tty=tty,
        resizes=_sizes(resize) if tty and protocol != "channel.k8s.io" else None,
    )
    error = _Output(ws, ERROR, text)
    first = STDOUT if stdout_on else STDERR if stderr_on else ERROR
    await _Output(ws, first, text).write(b"")
    inputs = {STDIN: stdin} if io.stdin is not None else {}
    if io.resizes is not None:
        inputs[RESIZE] = resize
    reader = asyncio.create_task(_read(ws, inputs, limits), name=f"ws-exec-read {request.path}")

    async def guard(work: Coroutine[Any, Any, T]) -> T:
        """The provider's call, cancelled when the client's WebSocket ends first."""
        task = asyncio.create_task(work, name=f"ws-exec {request.path}")
        try:
            await asyncio.wait({task, reader}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise StreamReset("the client closed the WebSocket")
        return task.result()

    try:
        code, message = await remotecommand.run(provider, request, request.query.getall("command", []), io, guard)
        with contextlib.suppress(StreamReset):
            if protocol.startswith(("v4.", "v5.")):
                await error.write(json.dumps(remotecommand.status(code, message)).encode())
            elif code != 0:
                await error.write((message or remotecommand.status(code)["message"]).encode())
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        await ws.close()
    return ws


async def _read(ws: web.WebSocketResponse, inputs: dict[int, _Input], limits: StreamLimits) -> None:
    """The client's messages to the channels something reads (the others' are dropped: held,
    they would stop the reading of the socket), until it closes; then every input ends."""
    try:
        async for message in ws:
            if message.type == aiohttp.WSMsgType.ERROR:
                if isinstance(message.data, aiohttp.WebSocketError) and message.data.code == 1009:
                    limits.hit("message_size")
                return
            if message.type not in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                continue
            decoded = decode(message.data)
            if decoded is None:
                continue
            channel, data = decoded
            if channel in inputs:
                await inputs[channel].put(data)
            elif channel == CLOSE and data and data[0] in inputs:
                inputs[data[0]].close()
    finally:
        for source in inputs.values():
            source.close()
