"""`/exec` and `/attach` on the kubelet port: the remote-command protocol over SPDY/3.1, as a
kubelet speaks it to the kube-apiserver (which translates kubectl's WebSockets to it, or passes
kubectl's SPDY on).

The request names the command (`command`, repeated; exec only) and the streams (`input`, `output`,
`error`, `tty`) and offers protocol versions in `X-Stream-Protocol-Version`; we answer 101 with
the newest we speak (v4.channel.k8s.io; v5 clients fall back to it as they do with a real
kubelet). The peer then opens one stream per channel, each named by its `streamtype` header:
`error`, `stdin`, `stdout`, `stderr` (not with a tty) and `resize` (with a tty, JSON
`{"Width":..,"Height":..}` messages). When the command ends, the error stream carries a
metav1.Status: Success, or Failure with reason NonZeroExitCode and the exit code as a cause. An
attach ends with Success when either side goes, as the kubelet's does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web

from vkprovider.httpapi import spdysession
from vkprovider.httpapi.limits import DEFAULT_LIMITS, StreamLimits
from vkprovider.httpapi.spdysession import Session, Stream, StreamReset
from vkprovider.provider import AttachProvider, ExecProvider, ExecStreams, ProviderError, TermSize

#: Newest first; what a real kubelet speaks (v5 is a client-side refinement of v4).
PROTOCOLS = ("v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io")
STREAM_WAIT = 30.0  # seconds the peer has to open every stream it asked for (as the kubelet)


def _flag(query: Any, name: str) -> bool:
    return str(query.get(name, "")).lower() in ("1", "true")


def offered(request: web.Request) -> list[str]:
    out: list[str] = []
    for value in request.headers.getall("X-Stream-Protocol-Version", []):
        out += [v.strip() for v in value.split(",") if v.strip()]
    return out


def choose(offers: list[str]) -> str | None:
    return next((p for p in PROTOCOLS if p in offers), None)


def status(exit_code: int | None, message: str = "") -> dict[str, Any]:
    """The metav1.Status a v4 client reads from the error stream."""
    if exit_code == 0:
        return {"metadata": {}, "status": "Success"}
    if exit_code is None:
        return {"metadata": {}, "status": "Failure", "message": message, "reason": "InternalError"}
    return {
        "metadata": {},
        "status": "Failure",
        "message": f"command terminated with non-zero exit code: exit status {exit_code}",
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(exit_code)}]},
    }


async def _resizes(stream: Stream, limits: StreamLimits) -> AsyncIterator[TermSize]:
    """Terminal sizes as the client sends them; a message longer than `resize_buffer_bytes`
    ends them (what is left of the stream is dropped, the command runs on)."""
    decoder = json.JSONDecoder()
    buffer = ""
    while True:
        chunk = await stream.read()
        if not chunk:
            return
        buffer = (buffer + chunk.decode(errors="replace")).lstrip()
        while buffer:
            try:
                value, end = decoder.raw_decode(buffer)
            except ValueError:
                break  # an incomplete message: wait for more
            except RecursionError:  # nested deeper than Python parses: no terminal size
                limits.hit("resize_buffer")
                stream.discard()
                return
            buffer = buffer[end:].lstrip()
            size = term_size(value)
            if size is not None:
                yield size
        if len(buffer) > limits.resize_buffer_bytes:
            limits.hit("resize_buffer")
            stream.discard()
            return


def term_size(value: Any) -> TermSize | None:
    """A terminal-size message as the kubelet reads it (uint16 Width and Height; a dimension of
    any other kind is 0); None for a message that is not an object."""
    if not isinstance(value, dict):
        return None

    def dimension(found: Any) -> int:
        is_int = isinstance(found, int) and not isinstance(found, bool)  # JSON true is no size
        return found if is_int and 0 <= found < 65536 else 0

    return TermSize(width=dimension(value.get("Width")), height=dimension(value.get("Height")))


def refusal(request: web.Request, provider: object, *, attach: bool) -> web.Response | None:
    """What to answer before any upgrade, when the request cannot be served at all."""
    if attach and not isinstance(provider, AttachProvider):
        return web.Response(status=501, text="this provider does not attach to containers\n")
    if not attach and not isinstance(provider, ExecProvider):
        return web.Response(status=501, text="this provider does not run commands in containers\n")
    if not attach and not request.query.getall("command", []):
        return web.Response(status=400, text="no command given\n")
    return None


def wanted(query: Any) -> tuple[bool, bool, bool, bool]:
    """stdin, stdout, stderr, tty as the request asks (no stderr with a tty, as the kubelet)."""
    tty = _flag(query, "tty")
    return _flag(query, "input"), _flag(query, "output"), _flag(query, "error") and not tty, tty


async def run(
    provider: object,
    request: web.Request,
    command: list[str],
    io: ExecStreams,
    guard: Callable[[Coroutine[Any, Any, Any]], Awaitable[Any]],
) -> tuple[int | None, str]:
    """(exit status, "") of the command, or of an attach 0; (None, why) when it could not run.
    `guard` runs the provider's call for as long as the client's connection lasts."""
    namespace, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
    try:
        if request.path.startswith("/attach/") and isinstance(provider, AttachProvider):
            await guard(provider.attach_to_container(namespace, pod, container, io))
            return 0, ""
        assert isinstance(provider, ExecProvider)
        return int(await guard(provider.exec_in_container(namespace, pod, container, command, io))), ""
    except (ProviderError, StreamReset) as exc:
        return None, str(exc)


async def serve(
    request: web.Request, provider: object, *, attach: bool = False, limits: StreamLimits = DEFAULT_LIMITS
) -> web.StreamResponse:
    """Answer an exec (or, with `attach`, an attach) request."""
    refused = refusal(request, provider, attach=attach)
    if refused is not None:
        return refused
    if "spdy/3.1" not in request.headers.get("Upgrade", "").lower():
        what = "attach" if attach else "exec"
        return web.Response(status=400, text=f"{what} needs an upgrade to SPDY/3.1 or a WebSocket\n")
    protocol = choose(offered(request))
    if protocol is None:
        speaks = ", ".join(PROTOCOLS)
        return web.Response(status=403, text=f"no protocol in common; this kubelet speaks {speaks}\n")
    command = request.query.getall("command", [])
    stdin, stdout, stderr, tty = wanted(request.query)
    wants = {"error"} | {name for name, on in (("stdin", stdin), ("stdout", stdout), ("stderr", stderr)) if on}
    if tty and protocol not in {"channel.k8s.io", "v2.channel.k8s.io"}:
        wants.add("resize")
    response, session = await spdysession.accept(request, protocol, limits)
    try:
        streams = await _collect(session, wants)
        if streams is None:
            return response
        for kind in ("error", "stdout", "stderr"):  # ours to write; the client sends nothing on them
            if kind in streams:
                streams[kind].discard()
        namespace, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        io = ExecStreams(
            stdin=streams.get("stdin"),
            stdout=streams.get("stdout"),
            stderr=streams.get("stderr"),
            tty=tty,
            resizes=_resizes(streams["resize"], limits) if "resize" in streams else None,
        )
        name = f"{'attach' if attach else 'exec'} {namespace}/{pod}/{container}"
        code, message = await run(provider, request, command, io, lambda work: session.while_open(work, name))
        for kind in ("stdout", "stderr"):
            if kind in streams:
                await streams[kind].close()
        with contextlib.suppress(StreamReset):
            if protocol == PROTOCOLS[0]:
                await streams["error"].write(json.dumps(status(code, message)).encode())
            elif code != 0:  # before v4: the error's text alone
                await streams["error"].write((message or status(code)["message"]).encode())
            await streams["error"].close()
    finally:  # what is queued still leaves, for a bounded time
        await session.aclose()
    return response


async def _collect(session: Session, wants: set[str]) -> dict[str, Stream] | None:
    streams: dict[str, Stream] = {}
    deadline = asyncio.get_running_loop().time() + STREAM_WAIT
    while not wants <= set(streams):
        left = deadline - asyncio.get_running_loop().time()
        stream = await session.next_stream(max(left, 0.0)) if left > 0 else None
        if stream is None:
            return None
        if stream.kind in wants and stream.kind not in streams:
            streams[stream.kind] = stream
        else:
            stream.discard()  # not asked for, or a second one: nobody reads it
    return streams
