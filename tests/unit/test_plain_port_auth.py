"""The plain port's gate (vkprovider.httpapi.server.kubelet_auth) when the port listens beyond
the pod: the probes' paths and the pod's loopback pass, everything else needs a token the
apiserver accepts and the right the kubelet port would ask. Pure request logic: the token and
access reviews are stand-ins here (the kubelet port's own tests run them against a real
apiserver, tests/e2e/test_runtime.py)."""

from __future__ import annotations

from typing import Any, cast
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from vkprovider.httpapi.auth import User, subresource_for, verb_for
from vkprovider.httpapi.server import kubelet_auth


class Reviews:
    """Tokens `good` (may read metrics) and `reader` (may read nothing)."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str]] = []

    async def token(self, token: str) -> User | None:
        return User(name=token) if token in ("good", "reader") else None

    async def check(self, user: User, *, method: str, path: str, node: str | None = None) -> tuple[bool, str]:
        self.asked.append((user.name, verb_for(method, path), subresource_for(path)))
        return user.name == "good", "no"


async def answer(path: str, peer: str, token: str | None = None) -> tuple[int, list[tuple[str, str, str]]]:
    reviews = Reviews()
    gate = kubelet_auth(cast(Any, reviews), cast(Any, reviews), node="vk", open_paths=frozenset({"/healthz"}))
    transport = mock.Mock()
    transport.get_extra_info = lambda key, default=None: {"peername": (peer, 40000), "peercert": None}.get(key)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = make_mocked_request("GET", path, headers=headers, transport=transport)

    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    response = await gate(request, handler)
    return response.status, reviews.asked


@pytest.mark.asyncio
async def test_probes_and_the_loopback_pass_without_a_token() -> None:
    assert await answer("/healthz", "10.0.0.7") == (200, [])
    assert await answer("/metrics", "127.0.0.1") == (200, [])  # kubectl port-forward, exec probes
    assert await answer("/capacity", "::1") == (200, [])


@pytest.mark.asyncio
async def test_everything_else_asks_what_the_kubelet_port_asks() -> None:
    assert (await answer("/metrics", "10.0.0.7"))[0] == 401
    assert (await answer("/metrics", "10.0.0.7", "forged"))[0] == 401
    assert await answer("/metrics", "10.0.0.7", "good") == (200, [("good", "get", "metrics")])
    assert await answer("/capacity", "10.0.0.7", "reader") == (403, [("reader", "get", "proxy")])
    assert await answer("/", "10.0.0.7", "good") == (200, [("good", "get", "proxy")])
