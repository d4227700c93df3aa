"""The kubelet side of port-forward over SPDY, spoken to by a raw SPDY client on loopback:
streams paired by requestID (and by stream id for old clients), data carried both ways, the
provider's failure written on the error stream, a pair left incomplete answered with an error.
The provider is a fake (an echo): the member side is tested end to end in
tests/e2e/test_member_streams.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web

from tests import spdyclient
from tests.localhttp import serving
from tests.spdyclient import Client
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
    return await spdyclient.connect(port, "/portForward/ns/pod", protocol)


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
