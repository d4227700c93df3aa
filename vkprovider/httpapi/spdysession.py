"""One SPDY/3.1 connection on the kubelet port, after the HTTP upgrade: the peer (the
kube-apiserver, or kubectl through it) opens streams, we answer each and move bytes.

aiohttp hands an upgraded connection's bytes to a "payload parser" set on its protocol (as it
does for WebSockets); `Session.attach` installs one that feeds our decoder.

What a peer can make us hold is bounded (`StreamLimits`):
- received bytes nobody consumed yet: reading pauses while the session holds more than
  `session_buffer_bytes`, so a slow consumer slows the peer down through TCP;
- what we send: every frame, data or answer (SYN_REPLY, RST_STREAM, PING), is encoded in order
  into one outbox that a single writer task hands to the transport under aiohttp's flow
  control; producers of data wait while the outbox is over `outbox_bytes`, reading pauses
  while it stays there, and PING or RST_STREAM answers beyond it are dropped (a PING flood from
  a peer that never reads stops at TCP, and costs at most the outbox);
- streams: at most `max_streams` open ones, refused beyond (RST_STREAM REFUSED_STREAM); a stream
  leaves the session as soon as both sides closed it or it was reset;
- CPU: at most `FRAMES_PER_TURN` frames are handled before the event loop gets a turn (the rest
  wait in the decoder, reading paused), and frames that carry no data (PING, SYN_STREAM,
  RST_STREAM, empty DATA, ...) beyond `control_frames_per_second` (after a burst) pause the
  reading until the budget refills: a flood costs its sender time, not us;
- a frame over `max_frame_bytes` ends the session; so does `idle_seconds` without a byte.

The Go peer sends no WINDOW_UPDATE and honours none; PINGs are echoed, a RST_STREAM ends its
stream, GOAWAY or a protocol error ends the session.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from aiohttp import web

from vkprovider.httpapi import spdy
from vkprovider.httpapi.limits import DEFAULT_LIMITS, StreamLimits

T = TypeVar("T")

CHUNK = 32 * 1024
FLUSH_SECONDS = 5.0  # what a closing session waits for its last frames to leave
FRAMES_PER_TURN = 256  # frames handled before the event loop gets a turn
RATE_WAKE_SECONDS = 0.05  # the least a session paused for its control-frame rate waits


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
        self._discarding = False

    @property
    def kind(self) -> str:
        return (self.headers.get("streamtype") or [""])[0]

    def header(self, name: str) -> str:
        return (self.headers.get(name) or [""])[0]

    def _feed(self, data: bytes, fin: bool) -> None:
        if data and not self._discarding:
            self.buffered += len(data)
            self.session._held += len(data)
            self._chunks.put_nowait(data)
        if fin and not self.remote_closed:
            self.remote_closed = True
            self._chunks.put_nowait(None)
            self.session._maybe_forget(self)

    def _end(self) -> None:
        self.reset = True
        if not self.remote_closed:
            self.remote_closed = True
            self._chunks.put_nowait(None)

    def discard(self) -> None:
        """Nobody reads this stream (the client's side of `error`, say): what it holds and what
        comes later is dropped, so it cannot hold the session's reading up."""
        self._discarding = True
        while not self._chunks.empty():
            chunk = self._chunks.get_nowait()
            if chunk is None:
                self._chunks.put_nowait(None)
                break
            self._release(len(chunk))

    def _release(self, size: int) -> None:
        self.buffered -= size
        self.session._consumed(size)

    async def read(self) -> bytes:
        """The next bytes the peer sent; b"" once it closed its side (or reset the stream)."""
        chunk = await self._chunks.get()
        if chunk is None:
            self._chunks.put_nowait(None)  # every later read sees the end too
            return b""
        self._release(len(chunk))
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
            with contextlib.suppress(StreamReset):
                await self.session._send(spdy.DataFrame(self.id, b"", spdy.FLAG_FIN))
            self.session._maybe_forget(self)


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
        limits: StreamLimits = DEFAULT_LIMITS,
        name: str = "spdy",
    ) -> None:
        self._transport = transport
        #: Writes that wait while the transport is over its high-water mark (aiohttp's).
        self._send_bytes = send
        self.limits = limits
        self._decoder = spdy.Decoder(max_frame=limits.max_frame_bytes)
        self._encoder = spdy.Encoder()
        self._streams: dict[int, Stream] = {}
        self.accepted: asyncio.Queue[Stream | None] = asyncio.Queue()
        self._held = 0  # bytes received and not yet read, all streams together
        self._paused: set[str] = set()  # why reading is paused: "buffer", "outbox", "turn"
        self._outbox: collections.deque[bytes] = collections.deque()
        self._outbox_bytes = 0
        self._room = asyncio.Event()  # set while the outbox is under its limit
        self._room.set()
        self._wake = asyncio.Event()
        self.closed = False
        self.error = ""
        self._ended = asyncio.Event()
        loop = asyncio.get_running_loop()
        self._last_active = loop.time()
        self._idle: asyncio.TimerHandle | None = loop.call_later(limits.idle_seconds, self._idle_check)
        self._tokens = float(limits.control_frame_burst)  # control frames that may come now
        self._refilled = loop.time()
        self._later: asyncio.Handle | None = None  # the next turn of `_process`, when due
        self._writer = asyncio.create_task(self._write_out(), name=f"{name} (writer)")

    @classmethod
    def attach(
        cls, protocol: Any, transport: asyncio.Transport, send: Callable[[bytes], Awaitable[None]], **kwargs: Any
    ) -> Session:
        """Take over an upgraded aiohttp connection (its protocol's `set_parser`); `send` is the
        101 response's `write`, which applies aiohttp's write flow control."""
        session = cls(transport, send, **kwargs)
        protocol.set_parser(_Parser(session))
        return session

    @property
    def streams(self) -> int:
        """Streams open now (neither reset nor closed by both sides)."""
        return len(self._streams)

    @property
    def held(self) -> int:
        """Bytes received and not yet read, plus those waiting to be sent."""
        return self._held + self._outbox_bytes

    # -- reading ---------------------------------------------------------------------------------

    def _received(self, data: bytes) -> None:
        if self.closed:
            return
        self._last_active = asyncio.get_running_loop().time()
        self._decoder.push(data)
        if self._later is None:
            self._process()

    def _process(self) -> None:
        """Handle the frames received, a turn's worth at a time and within the control-frame
        budget; reading stays paused while frames wait."""
        self._later = None
        loop = asyncio.get_running_loop()
        now = loop.time()
        limits = self.limits
        self._tokens = min(
            float(limits.control_frame_burst), self._tokens + (now - self._refilled) * limits.control_frames_per_second
        )
        self._refilled = now
        try:
            for _ in range(FRAMES_PER_TURN):
                frame = self._decoder.next()
                if frame is None:
                    break
                if not isinstance(frame, spdy.DataFrame) or not (frame.data or frame.fin):
                    self._tokens -= 1
                self._handle(frame)
                if self.closed:
                    return
                if self._tokens < 0:
                    limits.hit("control_frames")
                    self._pause("turn")
                    # Woken when a few frames' worth refilled, not for every one (each wake costs).
                    wait = max(-self._tokens / limits.control_frames_per_second, RATE_WAKE_SECONDS)
                    self._later = loop.call_later(wait, self._process)
                    return
            else:
                self._pause("turn")  # more may be whole: after the loop's other work
                self._later = loop.call_soon(self._process)
                return
        except spdy.FrameTooLarge as exc:
            limits.hit("frame_size")
            self._lost(f"SPDY protocol error: {exc}")
            return
        except spdy.ProtocolError as exc:
            self._lost(f"SPDY protocol error: {exc}")
            return
        self._resume("turn")
        if self._held > limits.session_buffer_bytes:
            self._pause("buffer")

    def _pause(self, why: str) -> None:
        if not self._paused and not self._transport.is_closing():
            self._transport.pause_reading()
        self._paused.add(why)

    def _resume(self, why: str) -> None:
        if why in self._paused:
            self._paused.discard(why)
            if not self._paused and not self._transport.is_closing():
                self._transport.resume_reading()

    def _consumed(self, size: int) -> None:
        self._held -= size
        if self._held <= self.limits.session_buffer_bytes // 2:
            self._resume("buffer")

    def _maybe_forget(self, stream: Stream) -> None:
        """A stream both sides closed, or that was reset, leaves the session (its reader still
        sees what it holds)."""
        both = stream.remote_closed and stream.local_closed
        if (stream.reset or both) and self._streams.get(stream.id) is stream:
            del self._streams[stream.id]

    def _handle(self, frame: spdy.Frame) -> None:
        if isinstance(frame, spdy.SynStream):
            if frame.stream_id in self._streams:
                self._answer(spdy.RstStream(frame.stream_id, spdy.PROTOCOL_ERROR))
                return
            if len(self._streams) >= self.limits.max_streams:
                self.limits.hit("streams")
                self._answer(spdy.RstStream(frame.stream_id, spdy.REFUSED_STREAM))
                return
            stream = Stream(self, frame.stream_id, frame.headers)
            self._streams[frame.stream_id] = stream
            self._answer(spdy.SynReply(frame.stream_id, {}))
            if frame.fin:
                stream._feed(b"", True)
            self.accepted.put_nowait(stream)
        elif isinstance(frame, spdy.DataFrame):
            target = self._streams.get(frame.stream_id)
            if target is None or target.remote_closed:
                self._answer(spdy.RstStream(frame.stream_id, spdy.INVALID_STREAM))
            else:
                target._feed(frame.data, frame.fin)
        elif isinstance(frame, spdy.HeadersFrame) and frame.fin:
            target = self._streams.get(frame.stream_id)
            if target is not None:
                target._feed(b"", True)
        elif isinstance(frame, spdy.RstStream):
            target = self._streams.pop(frame.stream_id, None)
            if target is not None:
                target._end()
        elif isinstance(frame, spdy.Ping):
            self._answer(frame)
        elif isinstance(frame, spdy.GoAway):
            self._lost("the peer went away")

    # -- writing ---------------------------------------------------------------------------------

    def _enqueue(self, frame: spdy.Frame) -> None:
        # Encoded at once: frames reach the shared compression context in the order they leave.
        data = self._encoder.encode(frame)
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        if self._outbox_bytes > self.limits.outbox_bytes:
            self._room.clear()
        self._wake.set()

    def _answer(self, frame: spdy.Frame) -> None:
        """A reply the protocol owes the peer: queued behind what is already going out; reading
        stops while answers keep the outbox over its limit. A PING or RST_STREAM answer that
        would go over it is dropped (what is left of one read of a flood): a peer that does
        not read gets no more of them; a SYN_REPLY always goes (streams are bounded)."""
        if self.closed:
            return
        if self._outbox_bytes > self.limits.outbox_bytes and not isinstance(frame, spdy.SynReply):
            self.limits.hit("answers")
            return
        self._enqueue(frame)
        if self._outbox_bytes > self.limits.outbox_bytes:
            self._pause("outbox")

    async def _send(self, frame: spdy.Frame) -> None:
        while not self._room.is_set() and not self.closed:
            await self._room.wait()
        if self.closed:
            raise StreamReset(f"session closed: {self.error or 'closed'}")
        self._enqueue(frame)

    async def _write_out(self) -> None:
        """The one writer: the outbox to the connection, in order, at the pace the peer reads."""
        while True:
            if not self._outbox:
                if self.closed:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            pieces = [self._outbox.popleft()]
            size = len(pieces[0])
            while self._outbox and size < CHUNK:
                pieces.append(self._outbox.popleft())
                size += len(pieces[-1])
            try:
                await self._send_bytes(b"".join(pieces))
            except (ConnectionError, RuntimeError) as exc:  # aiohttp: RuntimeError once closing
                self._outbox.clear()
                self._outbox_bytes = 0
                self._lost(f"the connection broke: {exc}")
                return
            self._outbox_bytes -= size
            self._last_active = asyncio.get_running_loop().time()
            if self._outbox_bytes <= self.limits.outbox_bytes:
                self._room.set()
            if self._outbox_bytes <= self.limits.outbox_bytes // 2:
                self._resume("outbox")

    # -- lifetime --------------------------------------------------------------------------------

    def _idle_check(self) -> None:
        loop = asyncio.get_running_loop()
        quiet = loop.time() - self._last_active
        if quiet < self.limits.idle_seconds:
            self._idle = loop.call_later(self.limits.idle_seconds - quiet, self._idle_check)
            return
        self._idle = None
        self.limits.hit("stream_idle")
        self._lost(f"no byte either way for {self.limits.idle_seconds:g} s")
        if not self._transport.is_closing():
            self._transport.close()

    def _lost(self, why: str) -> None:
        if self.closed:
            return
        self.closed = True
        self._ended.set()
        self._room.set()  # producers waiting for room see the end
        self._wake.set()
        self.error = why
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        if self._later is not None:
            self._later.cancel()
            self._later = None
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
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

    async def aclose(self) -> None:
        """End the session: GOAWAY after what is queued, at most `FLUSH_SECONDS` for it all to
        leave, then the connection closes."""
        if not self.closed:
            self._enqueue(spdy.GoAway(0, 0))
        self._lost("closed")
        try:
            await asyncio.wait_for(asyncio.shield(self._writer), FLUSH_SECONDS)
        except TimeoutError:
            pass  # a peer that does not read gets no more time
        except asyncio.CancelledError:
            self._writer.cancel()
            raise
        finally:
            if not self._writer.done():
                self._writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._writer
            if not self._transport.is_closing():
                self._transport.close()


async def accept(
    request: web.Request, protocol: str, limits: StreamLimits = DEFAULT_LIMITS
) -> tuple[web.StreamResponse, Session]:
    """Answer the upgrade (101, `protocol` as the stream protocol) and take the connection over.
    The response is returned from the handler once the session ended (`Session.aclose`)."""
    response = web.StreamResponse(
        status=101,
        headers={"Connection": "Upgrade", "Upgrade": "SPDY/3.1", "X-Stream-Protocol-Version": protocol},
    )
    response.force_close()
    await response.prepare(request)
    assert request.transport is not None
    name = f"spdy {request.path}"
    return response, Session.attach(request.protocol, request.transport, response.write, limits=limits, name=name)
