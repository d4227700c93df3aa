"""Property-based fuzzing of the kubelet port's streaming sessions over a real loopback socket
(issue 35): Hypothesis drives a raw asyncio client that sends the HTTP upgrade and then SPDY/3.1
frames made with `spdy.Encoder` mixed with garbage, or WebSocket messages, to a real aiohttp
server whose handler is `spdysession.accept` (with an echo behind it), `remotecommand.serve`
(exec over SPDY, v1 to v4) or `wsremotecommand.serve` (exec over a WebSocket: v5, v4, base64,
channel.k8s.io). Only the provider behind the session is a fake: a command that echoes its
stdin (a known number of bytes of it) and records the terminal sizes it is given.

For any input:
- the handler never raises, the loop reports no exception ("Task exception was never
  retrieved"), aiohttp logs no error;
- the session answers (a last PING comes back), ends (a protocol error, a frame over the limit,
  GOAWAY: the connection closes) or waits for the rest of a frame that garbage left unfinished,
  as a reference decoder fed the same bytes says; once the connection closed no task is left;
- a session never has more than `max_streams` streams open, and what it holds (`held`) stays
  within `session_buffer_bytes` + `outbox_bytes` + one read (256 KiB);
- an exec's command reads exactly the bytes sent on stdin, its stdout carries them back, the
  error stream carries the status its protocol version defines, and terminal sizes are those
  sent (a dimension that is not an integer from 0 to 65535 is 0).

Three bugs it found are fixed cases at the end of the file, each with its minimal example: the
answers to one read were up to twice its size (PING and RST_STREAM answers over the outbox limit
are now dropped), a JSON boolean was taken for a terminal dimension, and over a WebSocket,
terminal sizes nobody read held the session's input up for good (messages on channels nobody
reads are dropped, and terminal sizes keep only the latest).

Reproducible (derandomized, no example database); 15 to 30 s on a busy 2-core machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import itertools
import json
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from vkprovider.httpapi import remotecommand, spdy, spdysession, wsremotecommand
from vkprovider.httpapi.limits import StreamLimits
from vkprovider.httpapi.spdysession import Session, StreamReset
from vkprovider.provider import ExecStreams, TermSize

settings.register_profile(
    "stream-fuzz",
    max_examples=45,
    deadline=None,  # a busy CI machine; every example is bounded by asyncio timeouts instead
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)
FUZZ = settings.get_profile("stream-fuzz")

KiB = 1024
READ = 256 * KiB  # what asyncio's transport reads at most at once
WAIT = 5.0  # seconds any one step of an example may take
# Small limits, so that a few KiB of input reaches them.
LIMITS = StreamLimits(
    max_streams=4,
    max_frame_bytes=16 * KiB,
    max_message_bytes=8 * KiB,
    resize_buffer_bytes=512,
    session_buffer_bytes=16 * KiB,
    outbox_bytes=8 * KiB,
    idle_seconds=60.0,
    # No rate on frames without data: a fuzzed flood would wait for the budget instead of
    # exercising the session (the rate is tested in test_kubelet_limits.py).
    control_frame_burst=1 << 30,
)
# An exec opens up to five streams; a confused client a few more (refused beyond 8).
EXEC_LIMITS = dataclasses.replace(LIMITS, max_streams=8)
SENTINEL = 2**32 - 1  # the id of the last PING; fuzzed PINGs use ids below 2**31


# -- what each example watches -------------------------------------------------------------------


@dataclass
class Watch:
    """Errors anywhere on the server's side, and the peaks of one session."""

    errors: list[str] = field(default_factory=list)
    sessions: list[Session] = field(default_factory=list)
    most_streams: int = 0
    most_held: int = 0
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def session(self, session: Session) -> None:
        """Record the session's streams and bytes held after every read it handles."""
        self.sessions.append(session)
        received = session._received

        def watched(data: bytes) -> None:
            received(data)
            self.most_streams = max(self.most_streams, session.streams)
            self.most_held = max(self.most_held, session.held)

        session._received = watched  # type: ignore[method-assign]


class _Errors(logging.Handler):
    def __init__(self, watch: Watch) -> None:
        super().__init__(logging.ERROR)
        self.watch = watch

    def emit(self, record: logging.LogRecord) -> None:
        self.watch.errors.append(f"log {record.name}: {record.getMessage()} {record.exc_info!r}")


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[int]:
    """As tests.localhttp.serving, but a handler still running at the end is cancelled after
    a second, not a minute (a hung session must not stall the fuzzing)."""
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def watching(app: web.Application, watch: Watch) -> AsyncIterator[int]:
    """Serve `app` on loopback while every loop exception and aiohttp error is recorded; on the
    way out, no task started meanwhile may be left running."""
    loop = asyncio.get_running_loop()
    before = set(asyncio.all_tasks())
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: watch.errors.append(f"loop: {context.get('message')} {context}"))
    handler = _Errors(watch)
    logging.getLogger("aiohttp").addHandler(handler)
    try:
        async with serving(app) as port:
            yield port
            async with asyncio.timeout(WAIT):
                await watch.done.wait()  # the handler returned (or raised)
            left: set[asyncio.Task[Any]] = set()
            for _ in range(200):  # the connection's own task ends once it closed
                left = {t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()}
                if not left:
                    break
                await asyncio.sleep(0.01)
            assert not left, f"tasks left after the connection closed: {sorted(t.get_name() for t in left)}"
        gc.collect()  # "Task exception was never retrieved" is reported when a task is collected
        await asyncio.sleep(0)
    finally:
        logging.getLogger("aiohttp").removeHandler(handler)
        loop.set_exception_handler(previous)


def guarded(
    watch: Watch, serve: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler, recording anything it raises (aiohttp would only log it)."""

    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            return await serve(request)
        except BaseException as exc:
            watch.errors.append(f"the handler raised {exc!r}")
            raise
        finally:
            watch.done.set()

    return handler


async def until(done: Callable[[], bool]) -> None:
    for _ in range(int(WAIT / 0.005)):
        if done():
            return
        await asyncio.sleep(0.005)
    raise TimeoutError(f"not done in {WAIT:g} s")


def check(watch: Watch, limits: StreamLimits = LIMITS) -> None:
    assert not watch.errors, watch.errors
    assert watch.most_streams <= limits.max_streams
    assert watch.most_held <= limits.session_buffer_bytes + limits.outbox_bytes + READ, watch.most_held


# -- a raw SPDY client ---------------------------------------------------------------------------


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = spdy.Encoder(), spdy.Decoder()
        self.frames: list[spdy.Frame] = []
        self.ended = False

    def send(self, *frames: spdy.Frame) -> None:
        for frame in frames:
            self.writer.write(self.encoder.encode(frame))

    async def flush(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self.writer.drain()
        await asyncio.sleep(0)

    async def read_until(self, done: Callable[[], bool]) -> None:
        """Read frames until `done()` or the server closes the connection (what the server
        sends must always be valid SPDY)."""
        async with asyncio.timeout(WAIT):
            while not done() and not self.ended:
                try:
                    chunk = await self.reader.read(65536)
                except ConnectionError:
                    chunk = b""
                if not chunk:
                    self.ended = True
                    return
                self.frames += self.decoder.feed(chunk)

    def data(self, stream_id: int) -> tuple[bytes, bool]:
        """The data the server sent on a stream, and whether it closed it."""
        got = [f for f in self.frames if isinstance(f, spdy.DataFrame) and f.stream_id == stream_id]
        return b"".join(f.data for f in got), any(f.fin for f in got)

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


async def upgrade(port: int, path: str, protocols: list[str]) -> Client:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    offers = "".join(f"X-Stream-Protocol-Version: {p}\r\n" for p in protocols)
    writer.write(
        (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n{offers}"
            "Content-Length: 0\r\n\r\n"
        ).encode()
    )
    async with asyncio.timeout(WAIT):
        head = await reader.readuntil(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head
    return Client(reader, writer)


# -- 1. a session: any sequence of frames and garbage ---------------------------------------------

ids = st.sampled_from([1, 2, 3, 5, 7, 9, 11, 2**31 - 1])
u31 = st.integers(0, 2**31 - 1)
small_headers = st.dictionaries(
    st.sampled_from(["streamtype", "port", "requestid", "x"]), st.lists(st.text(max_size=8), min_size=1, max_size=2)
)
ops = st.one_of(
    st.tuples(st.just("syn"), ids, small_headers, st.booleans()),
    st.tuples(st.just("data"), ids, st.integers(0, 12 * KiB), st.booleans()),
    st.tuples(st.just("rst"), ids, st.integers(0, 12)),
    st.tuples(st.just("ping"), u31),
    st.tuples(st.just("headers"), ids, st.booleans()),
    st.tuples(st.just("settings"), st.dictionaries(st.integers(0, 10), u31, max_size=3)),
    st.tuples(st.just("window"), ids, u31),
    st.tuples(st.just("goaway"), u31),
    st.tuples(st.just("garbage"), st.binary(min_size=1, max_size=64)),
    st.tuples(st.just("oversize"), st.integers(LIMITS.max_frame_bytes + 1, 0xFFFFFF)),
    st.tuples(st.just("flood"), st.sampled_from(["ping", "syn", "data"]), st.integers(1, 2000)),
    st.tuples(st.just("flush")),
)


def encode_op(client: Client, op: tuple[Any, ...]) -> bytes:
    kind = op[0]
    enc = client.encoder.encode
    if kind == "syn":
        return enc(spdy.SynStream(op[1], op[2], flags=spdy.FLAG_FIN if op[3] else 0))
    if kind == "data":
        return enc(spdy.DataFrame(op[1], bytes([op[2] % 251]) * op[2], spdy.FLAG_FIN if op[3] else 0))
    if kind == "rst":
        return enc(spdy.RstStream(op[1], op[2]))
    if kind == "ping":
        return enc(spdy.Ping(op[1]))
    if kind == "headers":
        return enc(spdy.HeadersFrame(op[1], {}, spdy.FLAG_FIN if op[2] else 0))
    if kind == "settings":
        return enc(spdy.Settings(op[1]))
    if kind == "window":
        return enc(spdy.WindowUpdate(op[1], op[2]))
    if kind == "goaway":
        return enc(spdy.GoAway(op[1]))
    if kind == "garbage":
        return bytes(op[1])
    if kind == "oversize":  # a header announcing more than the session accepts
        return struct.pack(">II", 1, op[1])
    if kind == "flood":
        what, count = op[1], int(op[2])
        if what == "ping":
            return enc(spdy.Ping(7)) * count
        if what == "syn":  # streams opened at once, far more than allowed
            return b"".join(enc(spdy.SynStream(101 + 2 * i, {})) for i in range(count))
        return enc(spdy.DataFrame(3, b"")) * count
    return b""


async def echo_streams(request: web.Request, watch: Watch) -> web.StreamResponse:
    """`spdysession.accept`, then each stream's bytes back to it until the peer closes it."""
    response, session = await spdysession.accept(request, "fuzz.k8s.io", LIMITS)
    watch.session(session)
    tasks: set[asyncio.Task[None]] = set()

    async def echo(stream: spdysession.Stream) -> None:
        with contextlib.suppress(StreamReset):
            while data := await stream.read():
                await stream.write(data)
            await stream.close()

    try:
        while (stream := await session.next_stream(WAIT)) is not None:
            tasks.add(asyncio.create_task(echo(stream), name=f"fuzz echo {stream.id}"))
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await session.aclose()
    return response


@FUZZ
@given(st.lists(ops, max_size=40), st.booleans())
async def test_a_session_survives_any_frames(sequence: list[tuple[Any, ...]], together: bool) -> None:
    watch = Watch()
    app = web.Application()
    app.router.add_route("*", "/fuzz", guarded(watch, lambda request: echo_streams(request, watch)))
    async with watching(app, watch) as port:
        client = await upgrade(port, "/fuzz", ["fuzz.k8s.io"])
        reading = asyncio.create_task(client.read_until(lambda: False), name="fuzz client")
        try:
            opened, sent, wire = set(), bytearray(), list[bytes]()
            for op in sequence:
                if op[0] == "syn":
                    opened.add(op[1])
                elif op[0] == "flood" and op[1] == "syn":
                    opened |= {101 + 2 * i for i in range(op[2])}
                if op[0] == "flush" and not together:
                    client.writer.write(b"".join(wire))
                    wire = []
                    await client.flush()
                else:
                    wire.append(encode_op(client, op))
                    sent += wire[-1]
            wire.append(client.encoder.encode(spdy.Ping(SENTINEL)))
            sent += wire[-1]
            client.writer.write(b"".join(wire))
            await client.flush()

            # What the server must do, from what it was sent: end the session (a protocol error,
            # a frame over the limit, GOAWAY), answer the last PING, or wait for the rest of a
            # frame (garbage left the last PING inside one).
            reference = spdy.Decoder(LIMITS.max_frame_bytes)
            try:
                frames = reference.feed(bytes(sent))
            except spdy.ProtocolError:
                frames = [spdy.GoAway(0)]
            if any(isinstance(f, spdy.GoAway) for f in frames):
                await until(lambda: client.ended)
            elif frames and frames[-1] == spdy.Ping(SENTINEL) and not reference._buffer:
                await until(lambda: any(f == spdy.Ping(SENTINEL) for f in client.frames))
            # It only speaks on streams the client opened.
            for frame in client.frames:
                if isinstance(frame, spdy.DataFrame | spdy.SynReply):
                    assert frame.stream_id in opened, frame
            await client.close()
            await reading
        finally:
            reading.cancel()
    check(watch)


async def test_answers_to_one_read_stay_within_the_bound() -> None:
    watch = Watch()
    # No control-frame budget here: the 64 Ki empty frames must all be read to test the bound.
    limits = StreamLimits(session_buffer_bytes=64 * KiB, outbox_bytes=16 * KiB, control_frame_burst=1 << 30)

    async def slow_reader(request: web.Request) -> web.StreamResponse:
        response, session = await spdysession.accept(request, "fuzz.k8s.io", limits)
        watch.session(session)
        stream = await session.next_stream(WAIT)
        assert stream is not None
        for _ in iter(int, 1):
            if not await stream.read():
                break
            await asyncio.sleep(0.005)  # a slow consumer: the session pauses reading
        await session.aclose()
        return response

    app = web.Application()
    app.router.add_route("*", "/fuzz", guarded(watch, slow_reader))
    async with watching(app, watch) as port:
        client = await upgrade(port, "/fuzz", ["fuzz.k8s.io"])
        client.send(spdy.SynStream(1, {}))
        client.send(*[spdy.DataFrame(1, bytes(4 * KiB))] * 20)
        client.writer.write(client.encoder.encode(spdy.DataFrame(3, b"")) * (2 * READ // 8))
        client.send(spdy.DataFrame(1, b"", spdy.FLAG_FIN))
        await client.flush()
        await client.read_until(lambda: False)
        await client.close()
    assert not watch.errors, watch.errors
    assert watch.most_held <= limits.session_buffer_bytes + limits.outbox_bytes + READ, watch.most_held


# -- 2. exec over SPDY, v1 to v4 -----------------------------------------------------------------


@dataclass
class Command:
    """What the fake provider's command saw."""

    stdin: bytearray = field(default_factory=bytearray)
    sizes: list[TermSize] = field(default_factory=list)
    streams: ExecStreams | None = None


class EchoProvider:
    """A fake provider: `fuzz CODE [COUNT]` echoes stdin to stdout (up to COUNT bytes, or to its
    end), records the terminal sizes it is given until they end, and exits with CODE."""

    def __init__(self) -> None:
        self.commands: list[Command] = []

    async def exec_in_container(
        self, namespace: str, name: str, container: str, command: list[str], streams: ExecStreams
    ) -> int:
        seen = Command(streams=streams)
        self.commands.append(seen)
        count = int(command[2]) if len(command) > 2 else None

        async def sizes() -> None:
            if streams.resizes is not None:
                async for size in streams.resizes:
                    seen.sizes.append(size)

        resizing = asyncio.create_task(sizes(), name="fuzz resizes")
        try:
            while streams.stdin is not None and (count is None or len(seen.stdin) < count):
                data = await streams.stdin.read()
                if not data:
                    break
                seen.stdin += data
                if streams.stdout is not None:
                    await streams.stdout.write(data)
            if count is None:
                await resizing  # the client ends its terminal sizes before its stdin
        finally:
            resizing.cancel()
            await asyncio.gather(resizing, return_exceptions=True)
            aclose = getattr(streams.resizes, "aclose", None)
            if aclose is not None:
                await aclose()
        return int(command[1])


def expected_size(message: Any) -> TermSize | None:
    """The kubelet's reading of a terminal-size message: None for one that is not an object,
    0 for a dimension that is not an integer from 0 to 65535."""
    if not isinstance(message, dict):
        return None

    def dimension(value: Any) -> int:
        return value if type(value) is int and 0 <= value < 65536 else 0

    return TermSize(dimension(message.get("Width")), dimension(message.get("Height")))


# Booleans are left out of the dimensions here: see test_a_boolean_dimension_is_0.
dimensions = st.one_of(
    st.integers(-(2**17), 2**17), st.none(), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4)
)
size_messages = st.one_of(
    st.fixed_dictionaries({"Width": st.integers(0, 65535), "Height": st.integers(0, 65535)}),
    st.dictionaries(st.sampled_from(["Width", "Height", "width", "x"]), dimensions, max_size=3),
    dimensions,
    st.booleans(),
    st.lists(st.integers(0, 10), max_size=3),
)


def chunked(data: bytes, cuts: list[int], most: int = 8 * KiB) -> list[bytes]:
    """`data` cut at these points (modulo its length) and in pieces of at most `most` bytes (a
    DATA frame well under the frame limit)."""
    points = sorted({c % (len(data) + 1) for c in cuts} | set(range(0, len(data), most)) | {len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


@FUZZ
@given(
    version=st.sampled_from(remotecommand.PROTOCOLS),
    tty=st.booleans(),
    stderr=st.booleans(),
    code=st.integers(0, 255),
    stdin=st.one_of(
        st.binary(max_size=2 * KiB), st.integers(0, 48 * KiB).map(lambda n: bytes(range(256)) * (n // 256))
    ),
    stdin_cuts=st.lists(st.integers(0, 2**16), max_size=8),
    sizes=st.lists(size_messages, max_size=6),
    resize_garbage=st.one_of(st.just(b""), st.binary(max_size=700)),
    resize_cuts=st.lists(st.integers(0, 2**16), max_size=6),
    order=st.permutations(range(6)),
    junk=st.lists(st.sampled_from(["error", "stdout", "bogus", "stdin-again", "ping", "data-on-stdout"]), max_size=4),
    end_with_headers=st.booleans(),
)
async def test_exec_over_spdy_carries_stdin_exactly(
    version: str,
    tty: bool,
    stderr: bool,
    code: int,
    stdin: bytes,
    stdin_cuts: list[int],
    sizes: list[Any],
    resize_garbage: bytes,
    resize_cuts: list[int],
    order: list[int],
    junk: list[str],
    end_with_headers: bool,
) -> None:
    watch, provider = Watch(), EchoProvider()

    async def serve(request: web.Request) -> web.StreamResponse:
        original = spdysession.Session.attach

        def attach(*args: Any, **kwargs: Any) -> Session:
            session = original(*args, **kwargs)
            watch.session(session)
            return session

        with patched(spdysession.Session, "attach", attach):
            return await remotecommand.serve(request, provider, limits=EXEC_LIMITS)

    app = web.Application()
    app.router.add_route("*", "/exec/{namespace}/{pod}/{container}", guarded(watch, serve))
    query = f"command=fuzz&command={code}&input=1&output=1{'&error=1' if stderr else ''}{'&tty=1' if tty else ''}"
    resize_wanted = tty and version in ("v4.channel.k8s.io", "v3.channel.k8s.io")
    resize_bytes = b"".join(json.dumps(m).encode() + b"\n" for m in sizes) + resize_garbage
    async with watching(app, watch) as port:
        client = await upgrade(port, f"/exec/ns/pod/c?{query}", [version])
        reading = asyncio.create_task(client.read_until(lambda: False), name="fuzz client")  # to the end
        kinds = ["error", "stdin", "stdout", "stderr" if stderr and not tty else "", "resize" if resize_wanted else ""]
        kinds.append("")
        ids = {kind: 1 + 2 * i for i, kind in enumerate(kinds[j] for j in order) if kind}
        for kind in (kinds[j] for j in order):
            if kind:
                client.send(
                    spdy.SynStream(ids[kind], {"streamtype": [kind]}, flags=spdy.FLAG_FIN if kind == "error" else 0)
                )
        for n, extra in enumerate(junk):  # what a confused client also sends; all of it is dropped
            if extra == "ping":
                client.send(spdy.Ping(n))
            elif extra == "data-on-stdout":
                client.send(spdy.DataFrame(ids["stdout"], b"not for you"))
            elif extra == "stdin-again":
                client.send(spdy.SynStream(101 + 2 * n, {"streamtype": ["stdin"]}), spdy.DataFrame(101 + 2 * n, b"x"))
            else:
                client.send(spdy.SynStream(101 + 2 * n, {"streamtype": [extra]}), spdy.DataFrame(101 + 2 * n, b"y"))
        if resize_wanted:
            for piece in chunked(resize_bytes, resize_cuts):
                client.send(spdy.DataFrame(ids["resize"], piece))
            client.send(spdy.DataFrame(ids["resize"], b"", spdy.FLAG_FIN))
        for piece in chunked(stdin, stdin_cuts):
            client.send(spdy.DataFrame(ids["stdin"], piece))
            await client.flush()
        if end_with_headers:
            client.send(spdy.HeadersFrame(ids["stdin"], {}, spdy.FLAG_FIN))
        else:
            client.send(spdy.DataFrame(ids["stdin"], b"", spdy.FLAG_FIN))
        await client.flush()
        await reading  # the server ends the session after the status
        await client.close()
    check(watch, EXEC_LIMITS)

    (seen,) = provider.commands
    assert bytes(seen.stdin) == stdin
    assert client.data(ids["stdout"]) == (stdin, True)
    error, closed = client.data(ids["error"])
    assert closed
    if version == "v4.channel.k8s.io":
        assert json.loads(error) == remotecommand.status(code)
    else:
        assert error == (b"" if code == 0 else remotecommand.status(code)["message"].encode())
    if resize_wanted:
        want = [s for s in map(expected_size, sizes) if s is not None]
        # Garbage after the sizes may be cut short by the resize buffer, never the sizes before.
        assert seen.sizes[: len(want)] == want
        assert all(type(s.width) is int and type(s.height) is int for s in seen.sizes)
    else:
        assert seen.sizes == []


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Any:
    saved = owner.__dict__[name]
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, saved)


# -- 3. exec over a WebSocket: v5, v4, base64, channel.k8s.io ------------------------------------

ws_messages = st.one_of(
    st.tuples(st.just("stdin"), st.binary(min_size=1, max_size=3 * KiB)),
    st.tuples(st.just("resize"), size_messages),
    st.tuples(st.just("resize-garbage"), st.binary(max_size=300)),
    st.tuples(st.just("close"), st.integers(0, 255)),
    st.tuples(st.just("empty")),
    # Neither stdin nor a terminal size nor a close, whatever the protocol.
    st.tuples(
        st.just("junk"),
        st.one_of(
            st.binary(max_size=40).filter(lambda b: not b or b[0] not in (0, 4, 255)),
            st.text(max_size=40).filter(lambda t: not t or t[0] not in "04"),
        ),
    ),
    st.tuples(st.just("other-channel"), st.integers(1, 254).filter(lambda n: n != 4), st.binary(max_size=40)),
    st.tuples(st.just("oversize")),
)


@FUZZ
@given(
    protocol=st.sampled_from(wsremotecommand.PROTOCOLS),
    tty=st.booleans(),
    code=st.integers(0, 255),
    messages=st.lists(ws_messages, max_size=14),
)
async def test_exec_over_a_websocket_carries_stdin_exactly(
    protocol: str, tty: bool, code: int, messages: list[tuple[Any, ...]]
) -> None:
    watch, provider = Watch(), EchoProvider()
    text = "base64" in protocol
    if not tty or protocol == "channel.k8s.io":
        # Nobody reads terminal sizes here: more than the resize buffer of them holds the
        # session's input up (see test_terminal_sizes_nobody_reads_never_hold_up_stdin).
        budget, kept = LIMITS.resize_buffer_bytes - 64, []
        for message in messages:
            if message[0] in ("resize", "resize-garbage"):
                budget -= 1 + len(json.dumps(message[1]) if message[0] == "resize" else message[1])
                if budget < 0:
                    continue
            kept.append(message)
        messages = kept

    # What the command must read: stdin up to the client's close of it or an oversize message;
    # terminal sizes up to the close of theirs.
    stdin, sizes_sent, stopped = b"", [], False
    stdin_open = resize_open = True
    for message in messages:
        if message[0] == "oversize":
            stopped = True
            break
        if message[0] == "stdin" and stdin_open:
            stdin += message[1]
        elif message[0] == "resize" and resize_open:
            sizes_sent.append(message[1])
        elif message[0] == "close":
            stdin_open = stdin_open and message[1] != wsremotecommand.STDIN
            resize_open = resize_open and message[1] != wsremotecommand.RESIZE

    async def serve(request: web.Request) -> web.StreamResponse:
        return await wsremotecommand.serve(request, provider, limits=LIMITS)

    app = web.Application()
    app.router.add_route("*", "/exec/{namespace}/{pod}/{container}", guarded(watch, serve))
    query = [("command", "fuzz"), ("command", str(code)), ("command", str(len(stdin)))]
    query += [("input", "1"), ("output", "1")] + ([("tty", "1")] if tty else [])
    received: list[tuple[int, bytes]] = []
    async with watching(app, watch) as port, aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{port}/exec/ns/pod/c"
        async with asyncio.timeout(WAIT), http.ws_connect(url, params=query, protocols=(protocol,)) as ws:
            for message in messages:
                if ws.closed:
                    break
                with contextlib.suppress(ConnectionError):
                    await send(ws, message, text)
            async for answer in ws:
                if answer.type in (aiohttp.WSMsgType.BINARY, aiohttp.WSMsgType.TEXT):
                    decoded = wsremotecommand.decode(answer.data)
                    assert decoded is not None, answer
                    received.append(decoded)
            close_code = ws.close_code
    assert not watch.errors, watch.errors

    (seen,) = provider.commands
    out = b"".join(data for channel, data in received if channel == wsremotecommand.STDOUT)
    error = b"".join(data for channel, data in received if channel == wsremotecommand.ERROR)
    assert received[0] == (wsremotecommand.STDOUT, b""), "the open signal first"
    if stopped:  # the session ended at the oversize message, maybe before the command read all
        assert stdin.startswith(bytes(seen.stdin)) and stdin.startswith(out)
        assert close_code == 1009 or bytes(seen.stdin) == stdin
    else:
        assert bytes(seen.stdin) == stdin == out
        if protocol.startswith(("v4.", "v5.")):
            assert json.loads(error) == remotecommand.status(code)
        else:
            assert error == (b"" if code == 0 else remotecommand.status(code)["message"].encode())
    want = [s for s in map(expected_size, sizes_sent) if s is not None]
    assert seen.sizes == want[: len(seen.sizes)]
    assert all(type(s.width) is int and type(s.height) is int for s in seen.sizes)


async def send(ws: aiohttp.ClientWebSocketResponse, message: tuple[Any, ...], text: bool) -> None:
    kind = message[0]

    async def channel(number: int, data: bytes) -> None:
        out = wsremotecommand.encode(number, data, text=text)
        if isinstance(out, str):
            await ws.send_str(out)
        else:
            await ws.send_bytes(out)

    if kind == "stdin":
        await channel(wsremotecommand.STDIN, message[1])
    elif kind == "resize":
        await channel(wsremotecommand.RESIZE, json.dumps(message[1]).encode())
    elif kind == "resize-garbage":
        await channel(wsremotecommand.RESIZE, message[1])
    elif kind == "close":
        await ws.send_bytes(bytes([wsremotecommand.CLOSE, message[1]]))
    elif kind == "empty":
        await (ws.send_str("") if text else ws.send_bytes(b""))
    elif kind == "junk":
        await (ws.send_str(message[1]) if isinstance(message[1], str) else ws.send_bytes(message[1]))
    elif kind == "other-channel":
        number = message[1] % 10 if text else message[1]
        await channel(number if number not in (0, 4) else 1, message[2])
    elif kind == "oversize":
        await ws.send_bytes(bytes([wsremotecommand.STDIN]) + bytes(LIMITS.max_message_bytes + 1))


# -- the bugs found, each with its minimal example -----------------------------------------------


async def ws_exec(
    port: int, protocol: str, query: list[tuple[str, str]], messages: list[tuple[Any, ...]], wait: float = WAIT
) -> list[tuple[int, bytes]]:
    """Every (channel, bytes) the server sent for one exec over a WebSocket."""
    received: list[tuple[int, bytes]] = []
    text = "base64" in protocol
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{port}/exec/ns/pod/c"
        async with asyncio.timeout(wait), http.ws_connect(url, params=query, protocols=(protocol,)) as ws:
            for message in messages:
                await send(ws, message, text)
            async for answer in ws:
                decoded = wsremotecommand.decode(answer.data)
                assert decoded is not None, answer
                received.append(decoded)
    return received


@settings(FUZZ, max_examples=5, phases=[Phase.explicit, Phase.generate])
@given(
    st.lists(
        st.fixed_dictionaries({"Width": st.booleans(), "Height": st.one_of(st.integers(0, 65535), st.booleans())}),
        min_size=1,
        max_size=3,
    )
)
async def test_a_boolean_dimension_is_0(sizes: list[dict[str, Any]]) -> None:
    watch, provider = Watch(), EchoProvider()

    async def serve(request: web.Request) -> web.StreamResponse:
        return await wsremotecommand.serve(request, provider, limits=LIMITS)

    app = web.Application()
    app.router.add_route("*", "/exec/{namespace}/{pod}/{container}", guarded(watch, serve))
    query = [("command", "fuzz"), ("command", "0"), ("input", "1"), ("output", "1"), ("tty", "1")]
    messages: list[tuple[Any, ...]] = [("resize", size) for size in sizes]
    messages += [("close", wsremotecommand.RESIZE), ("close", wsremotecommand.STDIN)]
    async with watching(app, watch) as port:
        await ws_exec(port, wsremotecommand.V5, query, messages)
    assert not watch.errors, watch.errors
    (seen,) = provider.commands
    assert seen.sizes == [expected_size(size) for size in sizes]
    assert all(type(s.width) is int and type(s.height) is int for s in seen.sizes)


@settings(FUZZ, max_examples=1, phases=[Phase.explicit, Phase.generate], report_multiple_bugs=False)
@given(
    st.sampled_from([(p, False) for p in wsremotecommand.PROTOCOLS] + [("channel.k8s.io", True)]),
    st.lists(st.binary(min_size=LIMITS.resize_buffer_bytes // 2, max_size=300), min_size=3, max_size=5),
    st.binary(min_size=1, max_size=64),
)
async def test_terminal_sizes_nobody_reads_never_hold_up_stdin(
    protocol_tty: tuple[str, bool], resizes: list[bytes], stdin: bytes
) -> None:
    protocol, tty = protocol_tty
    watch, provider = Watch(), EchoProvider()

    async def serve(request: web.Request) -> web.StreamResponse:
        return await wsremotecommand.serve(request, provider, limits=LIMITS)

    app = web.Application()
    app.router.add_route("*", "/exec/{namespace}/{pod}/{container}", guarded(watch, serve))
    query = [("command", "fuzz"), ("command", "0"), ("command", str(len(stdin))), ("input", "1"), ("output", "1")]
    query += [("tty", "1")] if tty else []
    messages: list[tuple[Any, ...]] = [("resize-garbage", part) for part in resizes] + [("stdin", stdin)]
    before = set(asyncio.all_tasks())
    try:
        async with watching(app, watch) as port:
            received = await ws_exec(port, protocol, query, messages, wait=1.0)  # 30 ms when it works
    finally:  # the hung handler outlives its connection and the server: end it here
        hung = [t for t in asyncio.all_tasks() - before if not t.done() and t is not asyncio.current_task()]
        for task in hung:
            task.cancel()
        await asyncio.gather(*hung, return_exceptions=True)
    (seen,) = provider.commands
    assert bytes(seen.stdin) == stdin
    assert b"".join(data for channel, data in received if channel == wsremotecommand.STDOUT) == stdin
