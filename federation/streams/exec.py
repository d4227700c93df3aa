"""`kubectl exec` and `kubectl attach` on a pod of the virtual node: the command runs in (or the
streams attach to) its member pod, through the member's `pods/exec` or `pods/attach` over a
WebSocket (v5.channel.k8s.io, else v4), bridged to the streams the front-end apiserver opened
on our kubelet port.

Each WebSocket message is one channel's bytes, the channel in its first byte: 0 stdin, 1
stdout, 2 stderr, 3 the error channel (a metav1.Status when the command ends), 4 terminal
resizes (JSON), and in v5 255 to close a channel (our stdin's end). Back-pressure holds both
ways: a front-end stream that is slow to take output stops us reading the WebSocket (aiohttp
then stops reading its socket), and stdin is read only as fast as the member takes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp

from federation.streams import session
from federation.streams.locate import MemberPodIndex, explained, locate
from federation.streams.session import Activity, StreamLimits
from vkprovider.provider import ExecStreams, ProviderError

V5, V4 = "v5.channel.k8s.io", "v4.channel.k8s.io"
STDIN, STDOUT, STDERR, ERROR, RESIZE, CLOSE = 0, 1, 2, 3, 4, 255
CHUNK = 32 * 1024
#: With a tty, seconds stdin waits for the client's first terminal size (kubectl sends it at
#: once; a client that never does only delays its first input this long).
FIRST_SIZE_WAIT = 2.0


def stream_query(container: str, command: list[str], streams: ExecStreams) -> list[tuple[str, str]]:
    query = [("container", container)] + [("command", part) for part in command]
    for name, wanted in (
        ("stdin", streams.stdin is not None),
        ("stdout", streams.stdout is not None),
        ("stderr", streams.stderr is not None),
        ("tty", streams.tty),
    ):
        if wanted:
            query.append((name, "true"))
    return query


def exit_code(status: dict[str, Any]) -> int:
    """The command's exit status from the error channel's metav1.Status; ProviderError when the
    member could not run it at all."""
    if not status or status.get("status") == "Success":
        return 0
    if status.get("reason") == "NonZeroExitCode":
        for cause in (status.get("details") or {}).get("causes") or []:
            if cause.get("reason") == "ExitCode":
                with contextlib.suppress(ValueError):
                    return int(cause.get("message", ""))
    raise ProviderError(str(status.get("message") or status))


async def run(
    index: MemberPodIndex,
    namespace: str,
    name: str,
    container: str,
    command: list[str],
    streams: ExecStreams,
    limits: StreamLimits,
) -> int:
    """Run `command` in the member pod; its exit status."""
    query = stream_query(container, command, streams)
    return await _open(index, f"{namespace}/{name}", "exec", query, streams, limits)


async def attach(
    index: MemberPodIndex, namespace: str, name: str, container: str, streams: ExecStreams, limits: StreamLimits
) -> None:
    """Attach to the member pod's container until either side ends."""
    await _open(index, f"{namespace}/{name}", "attach", stream_query(container, [], streams), streams, limits)


async def _open(
    index: MemberPodIndex,
    key: str,
    subresource: str,
    query: list[tuple[str, str]],
    streams: ExecStreams,
    limits: StreamLimits,
) -> int:
    doing = "run a command" if subresource == "exec" else "attach"
    member, pod_path, client = locate(index, key, doing)
    with explained(member, key, subresource, doing):
        async with (
            session.total_limit(limits),
            client.websocket(f"{pod_path}/{subresource}", query=query, protocols=(V5, V4)) as ws,
        ):
            return await _bridge(ws, streams, key, limits)


async def _bridge(ws: aiohttp.ClientWebSocketResponse, streams: ExecStreams, key: str, limits: StreamLimits) -> int:
    v5 = ws.protocol == V5
    activity = Activity()
    # The client's stdin and its resizes reach us on separate streams, so input typed at once
    # can overtake the first size: the command would read its terminal as 0x0 (`stty size` said
    # "0 0" in CI). A tty's stdin therefore waits until the first size went to the member.
    sized = asyncio.Event()
    if streams.resizes is None:
        sized.set()

    async def pump_stdin() -> None:
        assert streams.stdin is not None
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(sized.wait(), FIRST_SIZE_WAIT)
        while chunk := await streams.stdin.read():
            activity.touch()
            for at in range(0, len(chunk), CHUNK):
                await ws.send_bytes(bytes([STDIN]) + chunk[at : at + CHUNK])
        if v5:
            await ws.send_bytes(bytes([CLOSE, STDIN]))

    async def pump_resizes() -> None:
        assert streams.resizes is not None
        try:
            async for size in streams.resizes:
                activity.touch()
                message = json.dumps({"Width": size.width, "Height": size.height}).encode()
                await ws.send_bytes(bytes([RESIZE]) + message)
                sized.set()
        finally:
            sized.set()

    tasks: list[asyncio.Task[None]] = []
    if streams.stdin is not None:
        tasks.append(asyncio.create_task(pump_stdin(), name=f"exec-stdin {key}"))
    if streams.resizes is not None:
        tasks.append(asyncio.create_task(pump_resizes(), name=f"exec-resize {key}"))
    status = b""
    try:
        async for channel, data in session.channels(ws, limits, activity):
            if channel == STDOUT and streams.stdout is not None:
                await streams.stdout.write(data)
            elif channel == STDERR and streams.stderr is not None:
                await streams.stderr.write(data)
            elif channel == ERROR:
                status += data
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError, ConnectionError):
                await task
    if not status and not activity.closed_normally:
        code = activity.closed_with or ws.close_code
        raise ProviderError(f"the connection to the member ended before the command did (code {code})")
    try:
        decoded = json.loads(status) if status else {}
    except ValueError:
        raise ProviderError(f"the member's exec answered {status[:200]!r}") from None
    return exit_code(decoded)
