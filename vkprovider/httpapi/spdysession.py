"""One SPDY/3.1 connection on the kubelet port, after the HTTP upgrade: the peer (the
kube-apiserver, or kubectl through it) opens streams, we answer each and move bytes.

aiohttp hands an upgraded connection's bytes to a "payload parser" set on its protocol (as it
does for WebSockets); `Session.attach` installs one that feeds our decoder, and we write frames
straight to the transport. Reading pauses while any stream holds more than `buffer_limit`
unread bytes, so a slow consumer slows the peer down through TCP instead of growing our memory.

The Go peer sends no WINDOW_UPDATE and honours none; PINGs are echoed, a RST_STREAM ends its
stream, GOAWAY or a protocol error ends the session.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

from vkprovider.httpapi import spdy

T = TypeVar("T")

CHUNK = 32 * 1024
BUFFER_LIMIT = 1024 * 1024


class StreamReset(Exception):
    """The peer reset the stream or the session ended before it finished."""


class Stream:
    """One SPDY stream: what the peer sends (read) and what we send (write, close)."""

    def __init__(self, session: Session, stream_id: int, headers: spdy.Headers) -> None:
        self.session = session
        self.id = stream_id
        self.headers = headers
        self._chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
        self.buffered = 0
        self.remote_closed = False
        self.local_closed = False
        self.reset = False

    @property
    def kind(self) -> str:
        return (self.headers.get("streamtype") or [""])[0]

    def header(self, name: str) -> str:
        return (self.headers.get(name) or [""])[0]

    def _feed(self, data: bytes, fin: bool) -> None:
        if data:
            self.buffered += len(data)
            self._chunks.put_nowait(data)
        if fin and not self.remote_closed:
            self.remote_closed = True
            self._chunks.put_nowait(None)

    def _end(self) -> None:
        self.reset = True
        if not self.remote_closed:
            self.remote_closed = True
            self._chunks.put_nowait(None)

    async def read(self) -> bytes:
        """The next bytes the peer sent; b"" once it closed its side (or reset the stream)."""
        chunk = await self._chunks.get()
        if chunk is None:
            self._chunks.put_nowait(None)  # every later read sees the end too
            return b""
        self.buffered -= len(chunk)
        self.session._maybe_resume()
        return chunk

    async def write(self, data: bytes) -> None:
        if self.local_closed or self.reset:
            raise StreamReset(f"stream {self.id} ({self.kind}) is closed")
        for at in range(0, len(data), CHUNK):
            await self.session._send(spdy.DataFrame(self.id, data[at : at + CHUNK]))

    async def close(self) -> None:
        """Half-close: we send nothing more."""
        if not self.local_closed and not self.reset and not self.session.closed:
            self.local_closed = True
            with contextlib.suppress(ConnectionError, StreamReset):
                await self.session._send(spdy.DataFrame(self.id, b"", spdy.FLAG_FIN))


class _Parser:
    """What aiohttp feeds an upgraded connection's bytes to."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        self._session._received(data)
        return False, b""

    def feed_eof(self) -> None:
        self._session._lost("the peer closed the connection")


class Session:
    def __init__(
        self,
        transport: asyncio.Transport,
        send: Callable[[bytes], Awaitable[None]],
        *,
        buffer_limit: int = BUFFER_LIMIT,
    ) -> None:
        self._transport = transport
        #: Writes that wait while the transport is over its high-water mark (aiohttp's).
        self._send_bytes = send
        self._decoder = spdy.Decoder()
        self._encoder = spdy.Encoder()
        self._streams: dict[int, Stream] = {}
        self.accepted: asyncio.Queue[Stream | None] = asyncio.Queue()
        self._buffer_limit = buffer_limit
        self._paused = False
        self.closed = False
        self.error = ""
        self._ended = asyncio.Event()

    @classmethod
    def attach(
        cls, protocol: Any, transport: asyncio.Transport, send: Callable[[bytes], Awaitable[None]], **kwargs: Any
    ) -> Session:
        """Take over an upgraded aiohttp connection (its protocol's `set_parser`); `send` is the
        101 response's `write`, which applies aiohttp's write flow control."""
        session = cls(transport, send, **kwargs)
        protocol.set_parser(_Parser(session))
        return session

    # -- reading ---------------------------------------------------------------------------------

    def _received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            frames = self._decoder.feed(data)
        except spdy.ProtocolError as exc:
            self._lost(f"SPDY protocol error: {exc}")
            return
        for frame in frames:
            self._handle(frame)
        if not self._paused and any(s.buffered > self._buffer_limit for s in self._streams.values()):
            self._paused = True
            self._transport.pause_reading()

    def _maybe_resume(self) -> None:
        if self._paused and all(s.buffered <= self._buffer_limit // 2 for s in self._streams.values()):
            self._paused = False
            if not self._transport.is_closing():
                self._transport.resume_reading()

    def _handle(self, frame: spdy.Frame) -> None:
        if isinstance(frame, spdy.SynStream):
            stream = Stream(self, frame.stream_id, frame.headers)
            self._streams[frame.stream_id] = stream
            self._write_now(spdy.SynReply(frame.stream_id, {}))
            if frame.fin:
                stream._feed(b"", True)
            self.accepted.put_nowait(stream)
        elif isinstance(frame, spdy.DataFrame):
            target = self._streams.get(frame.stream_id)
            if target is None:
                self._write_now(spdy.RstStream(frame.stream_id, spdy.INVALID_STREAM))
            else:
                target._feed(frame.data, frame.fin)
        elif isinstance(frame, spdy.HeadersFrame) and frame.fin:
            target = self._streams.get(frame.stream_id)
            if target is not None:
                target._feed(b"", True)
        elif isinstance(frame, spdy.RstStream):
            target = self._streams.get(frame.stream_id)
            if target is not None:
                target._end()
        elif isinstance(frame, spdy.Ping):
            self._write_now(frame)
        elif isinstance(frame, spdy.GoAway):
            self._lost("the peer went away")

    # -- writing ---------------------------------------------------------------------------------

    def _write_now(self, frame: spdy.Frame) -> None:
        if not self.closed and not self._transport.is_closing():
            self._transport.write(self._encoder.encode(frame))

    async def _send(self, frame: spdy.Frame) -> None:
        if self.closed or self._transport.is_closing():
            raise StreamReset(f"session closed: {self.error or 'closed'}")
        # Encoding is synchronous: frames reach the shared compression context in send order.
        try:
            await self._send_bytes(self._encoder.encode(frame))
        except ConnectionError as exc:  # the peer went while we waited to write
            self._lost(f"the connection broke: {exc}")
            raise StreamReset(f"session closed: {self.error}") from exc

    # -- lifetime --------------------------------------------------------------------------------

    def _lost(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        self._ended.set()
        self.error = why
        for stream in self._streams.values():
            stream._end()
        self.accepted.put_nowait(None)

    async def while_open(self, work: Coroutine[Any, Any, T], name: str) -> T:
        """`work`'s result; cancelled, with StreamReset, when the session ends first (the client
        went away: whatever it started on the far side must stop, not run on unheard)."""
        task = asyncio.create_task(work, name=name)
        ended = asyncio.create_task(self._ended.wait(), name=f"{name} (session end)")
        try:
            await asyncio.wait({task, ended}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            ended.cancel()
            if not task.done():
                task.cancel()
            await asyncio.gather(task, ended, return_exceptions=True)
        if task.cancelled():
            raise StreamReset(f"session closed: {self.error}")
        return task.result()

    async def next_stream(self, timeout: float) -> Stream | None:
        """The next stream the peer opens; None when the session ended or none came in time."""
        try:
            return await asyncio.wait_for(self.accepted.get(), timeout)
        except TimeoutError:
            return None

    def close(self) -> None:
        """End the session: GOAWAY, then the connection closes."""
        if not self.closed:
            self._write_now(spdy.GoAway(0, 0))
        self._lost("closed")
        if not self._transport.is_closing():
            self._transport.close()


async def accept(request: web.Request, protocol: str) -> tuple[web.StreamResponse, Session]:
    """Answer the upgrade (101, `protocol` as the stream protocol) and take the connection over.
    The response is returned from the handler once the session ended."""
    response = web.StreamResponse(
        status=101,
        headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1", "X-Stream-Protocol-Version": protocol},
    )
    response.force_close()
    await response.prepare(request)
    assert request.transport is not None
    return response, Session.attach(request.protocol, request.transport, response.write)
