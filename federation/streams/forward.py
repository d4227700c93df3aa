"""`kubectl port-forward` to a pod of the virtual node: each forwarded connection becomes one
WebSocket to the member's `pods/portforward` (v4.channel.k8s.io, one port), bridged to the
front-end data stream.

The member speaks two channels per port: 0 carries the data, 1 the error text. It opens each
channel with the port as two little-endian bytes, which are not data. A WebSocket cannot be
half-closed, so when kubectl stops sending we stop too and keep relaying the reply until the
member closes (the target closed its end). Back-pressure holds as in federation.streams.exec.
"""

from __future__ import annotations

import asyncio
import contextlib

import aiohttp

from federation.streams import session
from federation.streams.locate import MemberPodIndex, explained, locate
from federation.streams.session import Activity, StreamLimits
from vkprovider.provider import ByteStream, ProviderError

PROTOCOL = "v4.channel.k8s.io"
DATA, ERROR = 0, 1
CHUNK = 32 * 1024


async def forward(
    index: MemberPodIndex, namespace: str, name: str, port: int, stream: ByteStream, limits: StreamLimits
) -> None:
    key = f"{namespace}/{name}"
    member, pod_path, client = locate(index, key, "forward a port")
    with explained(member, key, "portforward", f"forward port {port}"):
        async with (
            session.total_limit(limits),
            client.websocket(f"{pod_path}/portforward", query=[("ports", str(port))], protocols=(PROTOCOL,)) as ws,
        ):
            error = await _bridge(ws, stream, key, limits)
    if error:
        raise ProviderError(f"member {member}: {error}")


async def _bridge(ws: aiohttp.ClientWebSocketResponse, stream: ByteStream, key: str, limits: StreamLimits) -> str:
    """Relay until the member closes; the member's error text, if any."""
    activity = Activity()

    async def pump_out() -> None:
        while chunk := await stream.read():
            activity.touch()
            for at in range(0, len(chunk), CHUNK):
                await ws.send_bytes(bytes([DATA]) + chunk[at : at + CHUNK])

    sender = asyncio.create_task(pump_out(), name=f"port-forward-out {key}")
    prefixed = {DATA: False, ERROR: False}
    error = b""
    try:
        async for channel, message in session.channels(ws, limits, activity):
            data = message
            if channel in prefixed and not prefixed[channel]:
                prefixed[channel] = True
                data = data[2:]
            if not data:
                continue
            if channel == DATA:
                await stream.write(data)
            elif channel == ERROR:
                error += data
    finally:
        sender.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError, ConnectionError):
            await sender
    if not error and not prefixed[DATA] and not activity.closed_normally:
        code = activity.closed_with or ws.close_code
        return f"the connection to the member ended before the port answered (code {code})"
    return error.decode(errors="replace")
