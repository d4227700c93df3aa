"""What one client may hold of the kubelet port (vkprovider.httpapi.limits), each limit driven
over a real loopback connection: the connection guard (header and keep-alive deadlines,
connections per address and in total), a SPDY session's streams, frames, buffers, answers and
idle time, port-forward pairs, the resize buffer, WebSocket message size and the number of
sessions. Each limit, when reached, is counted by name. Providers behind the sessions are small
fakes (an echo, the in-memory provider's shell); the provider-wide figures (RSS under a hostile
mix, a well-behaved exec's latency) are in tests/e2e/test_kubelet_hostile.py and bench/."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web

from tests import spdyclient
from tests.localhttp import serving
from vkprovider.httpapi import portforward, remotecommand, spdy, spdysession, wsremotecommand
from vkprovider.httpapi.auth import User
from vkprovider.httpapi.limits import ConnectionGuard, GuardedSite, StreamLimits, max_sessions
from vkprovider.httpapi.server import KubeletApi
from vkprovider.minishell import Shell
from vkprovider.provider import ByteStream, ExecStreams

pytestmark = pytest.mark.asyncio


class Hits(collections.Counter[str]):
    def __call__(self, limit: str) -> None:
        self[limit] += 1


async def eventually(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    """Polls a condition of this process (no event stands for it); fails saying `what`."""
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        if check():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not in {timeout} s: {what}")


# -- the connection guard ------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def guarded(guard: ConnectionGuard, app: web.Application | None = None) -> AsyncIterator[int]:
    """`app` (a route answering "ok") behind `guard` on 127.0.0.1; the port."""
    if app is None:
        app = web.Application()

        async def ok(request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app.router.add_get("/", ok)

    @web.middleware
    async def track(request: web.Request, handler: Any) -> web.StreamResponse:
        guard.request_started(request.transport)
        response: web.StreamResponse = await handler(request)
        guard.request_ended(request.transport, upgraded=response.status == 101)
        return response

    app.middlewares.append(track)
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=guard.idle_seconds)
    await runner.setup()
    try:
        site = GuardedSite(runner, "127.0.0.1", 0, guard=guard)
        await site.start()
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


async def stalled(port: int, local: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A client that starts its request and never finishes the headers."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local, 0))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
    return reader, writer


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    try:
        return await reader.read() == b""
    except ConnectionError:
        return True


async def get(port: int, local: str = "127.0.0.1") -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local, 0))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    try:
        return await reader.read()
    finally:
        writer.close()


async def test_clients_that_never_finish_their_headers_are_cut_at_the_deadline() -> None:
    hits = Hits()
    guard = ConnectionGuard(header_seconds=2.0, max_pending_per_address=100, hit=hits)
    async with guarded(guard) as port:
        slow = [await stalled(port, "127.0.0.2") for _ in range(50)]
        await eventually(lambda: guard.open == 50, "all 50 admitted")
        answer = await get(port)  # another client is served meanwhile, not after the cut
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"ok")
        assert hits["header_timeout"] == 0, "the answer waited for the stalled clients to be cut"
        assert all(await asyncio.gather(*(closed_by_server(r) for r, _ in slow)))
        assert hits["header_timeout"] == 50
        await eventually(lambda: guard.open == 0 and guard.pending("127.0.0.2") == 0, "all gone")
        for _, writer in slow:
            writer.close()


async def test_one_address_holds_a_bounded_number_of_unfinished_connections() -> None:
    hits = Hits()
    guard = ConnectionGuard(header_seconds=30, max_pending_per_address=5, hit=hits)
    async with guarded(guard) as port:
        slow = [await stalled(port, "127.0.0.2") for _ in range(5)]
        await eventually(lambda: guard.pending("127.0.0.2") == 5, "five pending")
        refused, writer = await stalled(port, "127.0.0.2")
        assert await closed_by_server(refused)
        writer.close()
        assert hits["pending_per_address"] == 1
        assert (await get(port, "127.0.0.3")).startswith(b"HTTP/1.1 200")  # others are served
        # One finishes its request: its address may open another.
        slow[0][1].write(b"Connection: close\r\n\r\n")
        assert (await slow[0][0].read()).startswith(b"HTTP/1.1 200")
        await eventually(lambda: guard.pending("127.0.0.2") == 4, "one settled")
        assert (await get(port, "127.0.0.2")).startswith(b"HTTP/1.1 200")
        for _, writer in slow:
            writer.close()


async def test_connections_in_total_are_bounded() -> None:
    hits = Hits()
    guard = ConnectionGuard(header_seconds=30, max_connections=3, hit=hits)
    async with guarded(guard) as port:
        held = [await stalled(port, f"127.0.0.{i}") for i in (2, 3, 4)]
        await eventually(lambda: guard.open == 3, "three open")
        reader, writer = await stalled(port, "127.0.0.5")
        assert await closed_by_server(reader)
        writer.close()
        assert hits["connections"] == 1
        for _, held_writer in held:
            held_writer.close()
        await eventually(lambda: guard.open == 0, "closed")
        assert (await get(port)).startswith(b"HTTP/1.1 200")


async def test_a_kept_alive_connection_has_a_deadline_for_its_next_request() -> None:
    hits = Hits()
    guard = ConnectionGuard(header_seconds=30, idle_seconds=0.3, hit=hits)
    async with guarded(guard) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and await reader.readexactly(2) == b"ok"
        assert await closed_by_server(reader)
        assert hits["keepalive_idle"] == 1 and hits["header_timeout"] == 0
        writer.close()


async def test_an_upgraded_connection_is_the_sessions_to_time() -> None:
    hits = Hits()
    guard = ConnectionGuard(header_seconds=0.2, idle_seconds=0.2, hit=hits)
    app = web.Application()
    sessions: list[spdysession.Session] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        response, session = await spdysession.accept(request, "v4.channel.k8s.io")
        sessions.append(session)
        stream = await session.next_stream(10)
        assert stream is not None
        await stream.write(await stream.read())
        await stream.close()
        await session.aclose()
        return response

    app.router.add_route("*", "/s", handler)
    async with guarded(guard, app) as port:
        client, head = await spdyclient.connect(port, "/s", "v4.channel.k8s.io")
        assert head.startswith(b"HTTP/1.1 101")
        await asyncio.sleep(0.5)  # past both deadlines: the connection must still be open
        client.send(spdy.SynStream(1, {"streamtype": ["stdin"]}), spdy.DataFrame(1, b"late", spdy.FLAG_FIN))
        assert await client.until_closed(1) == b"late"
        assert hits == {}
        client.writer.close()


# -- a SPDY session -------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def spdy_server(
    limits: StreamLimits, serve: Callable[[spdysession.Session], Awaitable[None]]
) -> AsyncIterator[tuple[int, list[spdysession.Session]]]:
    """A server whose handler takes the connection over and runs `serve` on the session."""
    sessions: list[spdysession.Session] = []
    app = web.Application()

    async def handler(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        # Small kernel buffers: what a peer makes us hold shows in our buffers, not the kernel's.
        sock = request.transport.get_extra_info("socket")
        for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
            sock.setsockopt(socket.SOL_SOCKET, option, 16384)
        response, session = await spdysession.accept(request, "v4.channel.k8s.io", limits)
        sessions.append(session)
        try:
            await serve(session)
        finally:
            await session.aclose()
        return response

    app.router.add_route("*", "/s", handler)
    async with serving(app) as port:
        yield port, sessions


async def first(sessions: list[spdysession.Session]) -> spdysession.Session:
    await eventually(lambda: bool(sessions), "the session started")
    return sessions[0]


async def echo_streams(session: spdysession.Session) -> None:
    """Each stream's bytes back on it, until the session ends."""
    tasks: set[asyncio.Task[None]] = set()

    async def echo(stream: spdysession.Stream) -> None:
        with contextlib.suppress(spdysession.StreamReset):
            while data := await stream.read():
                await stream.write(data)
            await stream.close()

    try:
        while (stream := await session.next_stream(30)) is not None:
            task = asyncio.create_task(echo(stream), name=f"echo {stream.id}")
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def never_read(session: spdysession.Session) -> None:
    while await session.next_stream(30) is not None:
        pass


async def test_streams_beyond_the_limit_are_refused_and_closed_ones_leave() -> None:
    hits = Hits()
    async with spdy_server(StreamLimits(max_streams=4, hit=hits), echo_streams) as (port, sessions):
        client, _ = await spdyclient.connect(port, "/s", "x")
        for stream_id in (1, 3, 5, 7, 9):
            client.send(spdy.SynStream(stream_id, {"streamtype": ["data"]}))
        refused = await client.until_frame(spdy.RstStream, 9)
        assert isinstance(refused, spdy.RstStream) and refused.status == spdy.REFUSED_STREAM
        assert hits["streams"] == 1 and sessions[0].streams == 4
        # Two streams end (our FIN, the echo's FIN): they leave, and two more fit.
        client.send(spdy.DataFrame(1, b"a", spdy.FLAG_FIN), spdy.DataFrame(3, b"b", spdy.FLAG_FIN))
        assert await client.until_closed(1) == b"a" and await client.until_closed(3) == b"b"
        await eventually(lambda: sessions[0].streams == 2, "closed streams removed")
        client.send(spdy.SynStream(11, {"streamtype": ["data"]}), spdy.SynStream(13, {"streamtype": ["data"]}))
        client.send(spdy.DataFrame(13, b"c", spdy.FLAG_FIN))
        assert await client.until_closed(13) == b"c"
        assert hits["streams"] == 1
        # Data for a stream that is gone, or never was, is answered with INVALID_STREAM.
        client.send(spdy.DataFrame(1, b"late"), spdy.DataFrame(99, b"never"))
        for stream_id in (1, 99):
            answer = await client.until_frame(spdy.RstStream, stream_id)
            assert isinstance(answer, spdy.RstStream) and answer.status == spdy.INVALID_STREAM
        client.writer.close()


async def test_a_frame_over_the_limit_ends_the_session() -> None:
    hits = Hits()
    async with spdy_server(StreamLimits(max_frame_bytes=64 * 1024, hit=hits), echo_streams) as (port, sessions):
        client, _ = await spdyclient.connect(port, "/s", "x")
        client.send(spdy.SynStream(1, {"streamtype": ["data"]}))
        # Refused from the frame's header: the 2 MiB it announces are never awaited.
        client.writer.write(b"\x00\x00\x00\x01\x00" + (2 << 20).to_bytes(3, "big") + b"x" * 100)
        await client.until_eof()
        assert hits["frame_size"] == 1 and "over the limit" in sessions[0].error
        client.writer.close()


async def test_what_nobody_reads_stops_the_reading_not_the_memory() -> None:
    limits = StreamLimits(session_buffer_bytes=256 * 1024)
    async with spdy_server(limits, never_read) as (port, sessions):
        client, _ = await spdyclient.connect(port, "/s", "x")
        client.send(spdy.SynStream(1, {"streamtype": ["stdin"]}))
        for _ in range(256):  # 8 MiB
            client.send(spdy.DataFrame(1, b"x" * 32768))
        session = await first(sessions)
        # The server stops reading (or, were it wrong, holds far more than its limit).
        await eventually(lambda: bool(session._paused) or session.held > 1 << 20, "paused or over")
        assert session._paused == {"buffer"} and session.held <= limits.session_buffer_bytes + 256 * 1024
        await session.aclose()  # a paused session sees no EOF: its handler ends it
        client.writer.transport.abort()


async def test_answers_wait_for_a_peer_that_does_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spdysession, "FLUSH_SECONDS", 0.2)  # it reads nothing: no use waiting
    limits = StreamLimits(outbox_bytes=64 * 1024, control_frame_burst=1 << 30)  # the outbox alone
    async with spdy_server(limits, never_read) as (port, sessions):
        client, _ = await spdyclient.connect(port, "/s", "x")
        flood = b"".join(client.encoder.encode(spdy.Ping(i)) for i in range(1, 2 << 20, 2))  # 12 MiB of PINGs
        client.writer.write(flood)
        session = await first(sessions)

        def in_transport() -> int:
            return session._transport.get_write_buffer_size()

        await eventually(lambda: "outbox" in session._paused or in_transport() > 1 << 20, "paused or over")
        # Every answer is queued, but only so many: the outbox and one read's answers, and what
        # the transport holds (its high-water mark, 64 KiB, and one write).
        assert "outbox" in session._paused
        assert session.held <= limits.outbox_bytes + 256 * 1024 and in_transport() <= 256 * 1024
        await session.aclose()
        client.writer.transport.abort()


async def test_frames_without_data_beyond_their_rate_pause_the_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spdysession, "FLUSH_SECONDS", 0.2)
    hits = Hits()
    limits = StreamLimits(control_frames_per_second=100, control_frame_burst=500, hit=hits)
    async with spdy_server(limits, never_read) as (port, sessions):
        client, _ = await spdyclient.connect(port, "/s", "x")
        client.writer.write(b"".join(client.encoder.encode(spdy.Ping(i)) for i in range(1, 200_000, 2)))
        session = await first(sessions)
        await eventually(lambda: hits["control_frames"] > 0, "the budget spent")
        assert session._paused == {"turn"}
        # Answered: the burst, and what one turn handles past it; the rest waits for the refill.
        answered = 0
        while answered < 500:
            assert await client.read_more()
            answered = sum(isinstance(f, spdy.Ping) for f in client.frames)
        await asyncio.sleep(0.2)  # the refill's own pace: 100 a second
        await client.read_more()
        answered = sum(isinstance(f, spdy.Ping) for f in client.frames)
        assert answered <= 500 + spdysession.FRAMES_PER_TURN + 100, answered
        await session.aclose()
        client.writer.transport.abort()


async def test_a_silent_session_ends_at_its_idle_timeout() -> None:
    hits = Hits()
    async with spdy_server(StreamLimits(idle_seconds=0.3, hit=hits), echo_streams) as (port, sessions):
        client, _ = await spdyclient.connect(port, "/s", "x")
        client.send(spdy.SynStream(1, {"streamtype": ["data"]}), spdy.DataFrame(1, b"x"))
        await client.until_frame(spdy.DataFrame, 1)
        await client.until_eof()
        assert hits["stream_idle"] == 1 and "no byte either way" in sessions[0].error
        client.writer.close()


async def test_closing_waits_a_bounded_time_for_a_peer_that_does_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spdysession, "FLUSH_SECONDS", 0.3)
    closed: list[float] = []

    async def flood(session: spdysession.Session) -> None:
        stream = await session.next_stream(10)
        assert stream is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(0.5):
                while True:
                    await stream.write(b"y" * 65536)
        closed.append(asyncio.get_running_loop().time())

    async with spdy_server(StreamLimits(outbox_bytes=64 * 1024), flood) as (port, sessions):
        client, _ = await spdyclient.connect(port, "/s", "x")
        client.send(spdy.SynStream(1, {"streamtype": ["stdout"]}))
        await eventually(lambda: bool(closed) and sessions[0]._writer.done(), "the session closed", timeout=5)
        assert asyncio.get_running_loop().time() - closed[0] < 2.0
        client.writer.transport.abort()


# -- port-forward, resizes, WebSockets, sessions ------------------------------------------------


class Hold:
    """Carries a port-forward until the client closes it."""

    async def port_forward(self, namespace: str, name: str, port: int, stream: ByteStream) -> None:
        while await stream.read():
            pass


async def test_port_forward_pairs_per_session_are_bounded() -> None:
    hits = Hits()
    limits = StreamLimits(max_port_forward_pairs=2, hit=hits)
    app = web.Application()

    async def handler(request: web.Request) -> web.StreamResponse:
        return await portforward.serve(request, Hold(), limits)

    app.router.add_route("*", "/portForward/{namespace}/{pod}", handler)
    async with serving(app) as port:
        client, _ = await spdyclient.connect(port, "/portForward/ns/pod", "portforward.k8s.io")
        for i, request in enumerate(("a", "b", "c")):
            client.open(1 + 4 * i, "error", 8080, request, fin=True)
            client.open(3 + 4 * i, "data", 8080, request)
        refused = (await client.until_closed(9)).decode()
        assert refused == "too many port-forward connections in one session (limit 2)"
        assert hits["port_forward_pairs"] == 2  # the third pair's error stream and its data stream
        client.writer.close()


async def test_a_resize_message_over_the_buffer_ends_the_resizes() -> None:
    hits = Hits()

    class Chunks:
        def __init__(self, *chunks: bytes) -> None:
            self.chunks = list(chunks)
            self.discarded = False

        async def read(self) -> bytes:
            return self.chunks.pop(0) if self.chunks else b""

        def discard(self) -> None:
            self.discarded = True

    stream = Chunks(b'{"Width":80,"Height":24}', b'{"Width":' + b" " * 5000, b'1,"Height":2}')
    sizes = [
        s async for s in remotecommand._resizes(cast(Any, stream), StreamLimits(resize_buffer_bytes=4096, hit=hits))
    ]
    assert [(s.width, s.height) for s in sizes] == [(80, 24)]
    assert hits["resize_buffer"] == 1 and stream.discarded


class Shells:
    async def exec_in_container(
        self, namespace: str, name: str, container: str, command: list[str], streams: ExecStreams
    ) -> int:
        return await Shell(streams).run(command)


async def test_a_websocket_message_over_the_limit_closes_it() -> None:
    hits = Hits()
    limits = StreamLimits(max_message_bytes=64 * 1024, hit=hits)
    app = web.Application()

    async def handler(request: web.Request) -> web.StreamResponse:
        return await wsremotecommand.serve(request, Shells(), limits=limits)

    app.router.add_route("*", "/exec/{namespace}/{pod}/{container}", handler)
    async with serving(app) as port, aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{port}/exec/ns/pod/c"
        query = [("command", "cat"), ("input", "1"), ("output", "1")]
        async with http.ws_connect(url, params=query, protocols=("v5.channel.k8s.io",)) as ws:
            await ws.send_bytes(bytes([0]) + b"z" * (1 << 20))
            async for _ in ws:
                pass
            assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        assert hits["message_size"] == 1


async def test_sessions_beyond_the_memory_budget_are_refused_with_503() -> None:
    hits = Hits()
    limits = StreamLimits(hit=hits)
    budget = max_sessions(5 << 20, limits)
    assert budget == 2  # 5 MiB hold two sessions at their worst (1 + 0.25 + 1 MiB + 64 KiB each)

    class Anyone:
        async def token(self, token: str) -> Any:
            return User("u")

        async def check(self, user: Any, *, method: str, path: str, node: str) -> tuple[bool, str]:
            return True, ""

    api = KubeletApi(
        node="n",
        provider=Shells(),
        pods=list,
        authenticator=cast(Any, Anyone()),
        authorizer=cast(Any, Anyone()),
        limits=limits,
        max_sessions=budget,
        max_sessions_per_user=budget,
    )
    async with serving(api.app()) as port, aiohttp.ClientSession(headers={"Authorization": "Bearer t"}) as http:
        url = f"http://127.0.0.1:{port}/exec/ns/pod/c"
        query = [("command", "cat"), ("input", "1"), ("output", "1")]
        protocols = ("v5.channel.k8s.io",)
        async with (
            http.ws_connect(url, params=query, protocols=protocols),
            http.ws_connect(url, params=query, protocols=protocols),
        ):
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(url, params=query, protocols=protocols)
            assert refused.value.status == 503 and hits["sessions"] == 1
        await eventually(lambda: api._open_sessions == 0, "both sessions ended")
        async with http.ws_connect(url, params=query, protocols=protocols) as ws:  # room again
            await ws.send_bytes(bytes([255, 0]))
            assert [m async for m in ws] != []
