"""The kubelet side of port-forward over SPDY, spoken to by a raw SPDY client on loopback:
streams paired by requestID (and by stream id for old clients), data carried both ways, the
provider's failure written on the error stream, a pair left incomplete answered with an error.
The provider is a fake (an echo): the member side is tested end to end in
tests/e2e/test_member_streams.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web

from tests.localhttp import serving
from vkprovider.httpapi import portforward, spdy
from vkprovider.provider import ByteStream, ProviderError


class Echo:
    """Echoes what it reads; port 9 is closed."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, int]] = []

    async def port_forward(self, namespace: str, name: str, port: int, stream: ByteStream) -> None:
        self.calls.append((namespace, name, port))
        if port == 9:
            raise ProviderError("connection refused")
        while data := await stream.read():
            await stream.write(data.upper())


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = spdy.Encoder(), spdy.Decoder()
        self.frames: list[spdy.Frame] = []

    def send(self, *frames: spdy.Frame) -> None:
        for frame in frames:
            self.writer.write(self.encoder.encode(frame))

    def open(self, stream_id: int, kind: str, port: int, request: str | None, fin: bool = False) -> None:
        headers = {"streamtype": [kind], "port": [str(port)]}
        if request is not None:
            headers["requestid"] = [request]
        self.send(spdy.SynStream(stream_id, headers, flags=spdy.FLAG_FIN if fin else 0))

    async def until_closed(self, stream_id: int) -> bytes:
        """The data of `stream_id` up to its FIN."""
        async with asyncio.timeout(10):
            while True:
                for frame in self.frames:
                    if isinstance(frame, spdy.DataFrame) and frame.stream_id == stream_id and frame.fin:
                        return b"".join(
                            f.data for f in self.frames if isinstance(f, spdy.DataFrame) and f.stream_id == stream_id
                        )
                chunk = await self.reader.read(65536)
                assert chunk, "the server closed the connection"
                self.frames += self.decoder.feed(chunk)


@pytest_asyncio.fixture
async def served() -> AsyncIterator[tuple[Echo, int]]:
    provider = Echo()
    app = web.Application()

    async def handler(request: web.Request) -> web.StreamResponse:
        return await portforward.serve(request, provider)

    app.router.add_route("*", "/portForward/{namespace}/{pod}", handler)
    async with serving(app) as port:
        yield provider, port


async def connect(port: int, protocol: str = "portforward.k8s.io") -> tuple[Client, bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        (
            "POST /portForward/ns/pod HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
            f"X-Stream-Protocol-Version: {protocol}\r\nContent-Length: 0\r\n\r\n"
        ).encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    return Client(reader, writer), head


@pytest.mark.asyncio
async def test_pairs_carry_data_and_failures_go_on_the_error_stream(served: tuple[Echo, int]) -> None:
    provider, port = served
    client, head = await connect(port)
    assert head.startswith(b"HTTP/1.1 101") and b"X-Stream-Protocol-Version: portforward.k8s.io" in head
    # As kubectl: the error stream first, half-closed at once, then the data stream.
    client.open(1, "error", 8080, "0", fin=True)
    client.open(3, "data", 8080, "0")
    client.send(spdy.DataFrame(3, b"hello"), spdy.DataFrame(3, b" world", spdy.FLAG_FIN))
    # A second connection to a closed port, paired by stream id (a client without requestID).
    client.open(5, "error", 9, None, fin=True)
    client.open(7, "data", 9, None)
    assert await client.until_closed(3) == b"HELLO WORLD"
    assert await client.until_closed(1) == b""
    refused = (await client.until_closed(5)).decode()
    assert refused == "error forwarding port 9 to pod ns/pod: connection refused"
    assert sorted(provider.calls) == [("ns", "pod", 9), ("ns", "pod", 8080)]
    client.writer.close()


@pytest.mark.asyncio
async def test_a_pair_left_incomplete_or_a_bad_port_is_answered(
    served: tuple[Echo, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    provider, port = served
    monkeypatch.setattr(portforward, "PAIR_WAIT", 0.2)
    client, _ = await connect(port)
    client.open(1, "error", 8080, "lonely", fin=True)
    assert b"timed out waiting for the other stream of request lonely" in await client.until_closed(1)
    client.open(3, "error", 0, "bad", fin=True)
    client.open(5, "data", 0, "bad")
    assert b"invalid port '0'" in await client.until_closed(3)
    assert provider.calls == []
    client.writer.close()


@pytest.mark.asyncio
async def test_only_the_port_forward_protocol_is_spoken(served: tuple[Echo, int]) -> None:
    _, port = served
    client, head = await connect(port, protocol="v4.channel.k8s.io")
    assert head.startswith(b"HTTP/1.1 403")
    client.writer.close()
