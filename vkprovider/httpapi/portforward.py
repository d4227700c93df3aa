"""`/portForward` on the kubelet port: the port-forward protocol over SPDY/3.1, as a kubelet
speaks it to the kube-apiserver (kubectl 1.37 tunnels its SPDY through the apiserver inside a
WebSocket; the apiserver unwraps it and speaks plain SPDY to us).

After the upgrade (`X-Stream-Protocol-Version: portforward.k8s.io`), each connection kubectl
accepts on its local port becomes a pair of streams with the same `requestID` header: an
`error` stream (kubectl only reads it) and a `data` stream carrying the bytes, both naming the
pod's `port`. When both are open the provider carries the data stream to the port; whatever goes
wrong is written as text on the error stream, which kubectl prints. A pair that stays incomplete
for `PAIR_WAIT` seconds is answered with an error, as the kubelet does. Many pairs share one
session, and each runs in its own task, owned by the session's handler.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

from vkprovider import logs
from vkprovider.httpapi import spdysession
from vkprovider.httpapi.limits import DEFAULT_LIMITS, StreamLimits
from vkprovider.httpapi.remotecommand import offered
from vkprovider.httpapi.spdysession import Stream, StreamReset
from vkprovider.provider import PortForwardProvider, ProviderError

PROTOCOL = "portforward.k8s.io"
PAIR_WAIT = 30.0  # seconds a pair's second stream may take (the kubelet's stream creation timeout)

_log = logs.get("port-forward")


def request_id(stream: Stream) -> str:
    """The pair a stream belongs to. Clients older than the header were paired by stream id:
    the error stream first, its data stream two ids later."""
    found = stream.header("requestid")
    if found:
        return found
    return str(stream.id - 2 if stream.kind == "data" else stream.id)


def port_of(stream: Stream) -> int | None:
    try:
        port = int(stream.header("port"))
    except ValueError:
        return None
    return port if 0 < port < 65536 else None


class _Forwards:
    """The pairs of one session and the tasks that carry them."""

    def __init__(self, provider: PortForwardProvider, namespace: str, pod: str, limits: StreamLimits) -> None:
        self.provider = provider
        self.namespace = namespace
        self.pod = pod
        self.limits = limits
        self.pairs: dict[str, dict[str, Stream]] = {}
        self.forwarding = 0  # complete pairs being carried
        self.tasks: set[asyncio.Task[None]] = set()

    def add(self, stream: Stream) -> None:
        if stream.kind != "data":
            stream.discard()  # ours to write: kubectl sends nothing on an error stream
        if stream.kind not in ("data", "error"):
            self._spawn(_refuse(stream, f"unknown stream type {stream.kind!r}"), "refuse")
            return
        rid = request_id(stream)
        if rid not in self.pairs and len(self.pairs) + self.forwarding >= self.limits.max_port_forward_pairs:
            # Each pair holds a stream to the member: a session gets a bounded number.
            self.limits.hit("port_forward_pairs")
            limit = self.limits.max_port_forward_pairs
            self._spawn(_refuse(stream, f"too many port-forward connections in one session (limit {limit})"), "refuse")
            return
        pair = self.pairs.setdefault(rid, {})
        if stream.kind in pair:
            self._spawn(_refuse(stream, f"a second {stream.kind} stream for request {rid}"), "refuse")
            return
        pair[stream.kind] = stream
        if len(pair) == 2:
            self._spawn(self._forward(rid), f"forward {rid}")
        elif len(pair) == 1:
            self._spawn(self._expire(rid), f"pair-wait {rid}")

    def _spawn(self, work: Coroutine[Any, Any, None], what: str) -> None:
        task = asyncio.create_task(work, name=f"port-forward {self.namespace}/{self.pod} {what}")
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _expire(self, rid: str) -> None:
        await asyncio.sleep(PAIR_WAIT)
        pair = self.pairs.get(rid)
        if pair is not None and len(pair) == 1:
            del self.pairs[rid]
            (stream,) = pair.values()
            await _refuse(stream, f"timed out waiting for the other stream of request {rid}")

    async def _forward(self, rid: str) -> None:
        pair = self.pairs.pop(rid)
        data, error = pair["data"], pair["error"]
        port = port_of(data)
        self.forwarding += 1
        try:
            if port is None:
                raise ProviderError(f"invalid port {data.header('port')!r}")
            await self.provider.port_forward(self.namespace, self.pod, port, data)
        except (ProviderError, StreamReset) as exc:
            message = f"error forwarding port {data.header('port')} to pod {self.namespace}/{self.pod}: {exc}"
            _log.info("port-forward failed", request=rid, error=message)
            with contextlib.suppress(StreamReset):
                await error.write(message.encode())
        finally:
            self.forwarding -= 1
            for stream in (data, error):
                await stream.close()

    async def stop(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _refuse(stream: Stream, message: str) -> None:
    stream.discard()
    with contextlib.suppress(StreamReset):
        if stream.kind == "error":
            await stream.write(message.encode())
        await stream.close()


async def serve(request: web.Request, provider: object, limits: StreamLimits = DEFAULT_LIMITS) -> web.StreamResponse:
    if not isinstance(provider, PortForwardProvider):
        return web.Response(status=501, text="this provider does not forward ports\n")
    if "spdy/3.1" not in request.headers.get("Upgrade", "").lower():
        return web.Response(status=400, text="port-forward needs an upgrade to SPDY/3.1\n")
    if PROTOCOL not in offered(request):
        return web.Response(status=403, text=f"no protocol in common; this kubelet speaks {PROTOCOL}\n")
    response, session = await spdysession.accept(request, PROTOCOL, limits)
    forwards = _Forwards(provider, request.match_info["namespace"], request.match_info["pod"], limits)
    try:
        # Pairs keep coming as long as kubectl accepts connections; the session ends when
        # kubectl (or the apiserver) goes.
        while (stream := await session.next_stream(3600.0)) is not None or not session.closed:
            if stream is not None:
                forwards.add(stream)
    finally:
        await forwards.stop()
        await session.aclose()
    return response
