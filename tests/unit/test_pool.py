"""The apiserver connection pool (vkprovider.kube.pool): after a burst, a trickle of requests
keeps only the connections it needs; the rest idle out. Against a real aiohttp server on
localhost (the order of reuse does not depend on TLS); connections are counted from the kernel's
table of TCP sockets."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from aiohttp import web

from tests.localhttp import serving
from vkprovider.kube.pool import NewestFirst


def _established_to(port: int) -> int:
    count = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            remote, state = fields[2], fields[3]
            if int(remote.rsplit(":", 1)[1], 16) == port and state == "01":
                count += 1
    return count


async def _open_after_burst_and_trickle(connector: aiohttp.TCPConnector, keepalive: float) -> int:
    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(0.05)  # concurrent requests need connections of their own
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/", slow)
    async with serving(app) as port, aiohttp.ClientSession(connector=connector) as session:

        async def get() -> None:
            async with session.get(f"http://127.0.0.1:{port}/") as resp:
                await resp.read()

        await asyncio.gather(*(get() for _ in range(20)))
        assert _established_to(port) == 20
        deadline = time.monotonic() + 3 * keepalive + 0.1
        while time.monotonic() < deadline:
            await get()
            await asyncio.sleep(0.02)
        return _established_to(port)


@pytest.mark.asyncio
async def test_after_a_burst_a_trickle_keeps_one_connection_and_the_rest_idle_out() -> None:
    assert await _open_after_burst_and_trickle(NewestFirst(keepalive_timeout=0.5), 0.5) <= 2


async def _peers_of_a_trickle(connector: aiohttp.TCPConnector) -> list[int]:
    """After 5 requests at once (5 connections), the client port of each of 10 requests one
    after the other, as the server saw it."""
    peers: list[int] = []
    release, all_in = asyncio.Event(), asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername")[1] if request.transport else 0)
        if len(peers) == 5:
            all_in.set()
        await release.wait()
        return web.json_response({})

    app = web.Application()
    app.router.add_get("/", handler)
    async with serving(app) as port, aiohttp.ClientSession(connector=connector) as session:

        async def get() -> None:
            async with session.get(f"http://127.0.0.1:{port}/") as resp:
                await resp.read()

        burst = [asyncio.create_task(get(), name=f"burst-{i}") for i in range(5)]
        await asyncio.wait_for(all_in.wait(), 10)  # all five in the handler at once: five connections
        release.set()
        await asyncio.gather(*burst)
        assert len(set(peers)) == 5
        peers.clear()
        for _ in range(10):
            await get()
    return peers


@pytest.mark.asyncio
async def test_a_trickle_reuses_the_connection_released_last() -> None:
    # The order itself, with no clock: newest first, one connection serves the whole trickle
    # and the other four stay idle (to time out). If aiohttp changes the private queue the pool
    # turns, the order falls back to aiohttp's own (oldest first, cycling through all five),
    # and this fails.
    peers = await _peers_of_a_trickle(NewestFirst())
    assert len(set(peers)) == 1, peers
