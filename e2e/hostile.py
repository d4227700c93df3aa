"""Clients that try to exhaust a kubelet port, for the tests and the stress benchmark of its
limits (issue 35). Each speaks to the port directly over TLS, as an authorized tenant could
(or, for the stalled kind, anyone who can reach it):

- `stalled`: opens TLS, starts a request and never finishes its headers;
- `stream_flood`: an exec session (SPDY) that opens thousands of streams;
- `ping_flood`: an exec session that sends PINGs without end and never reads the answers;
- `never_read`: `cat` over SPDY, fed without end, its output never read;
- `big_message`: a WebSocket exec that announces a 64 MiB message.

And what an authorized tenant holds: a client certificate from the offline cluster's CA and
the RBAC grant (create and get on nodes/proxy).

The exec sessions open the streams an exec needs (error, stdin, stdout of `cat`) before they
misbehave, so the command runs and the session stays. Each returns how its session ended:
"refused" (an HTTP status other than 101, with the status), "closed" (the server ended it) or
"held" (still open when the caller stopped it, by cancelling); a `Tally` counts the answers to
the upgrades as they come.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import ssl
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from e2e import pki
from vkprovider.httpapi import spdy
from vkprovider.kube import AlreadyExists, KubeClient

MIB = 1024 * 1024


@dataclass
class Tally:
    """Upgrades answered so far: 101 (admitted) or anything else (refused)."""

    admitted: int = 0
    refused: int = 0

    @property
    def answered(self) -> int:
        return self.admitted + self.refused


@dataclass(frozen=True)
class Target:
    """A pod's container behind a kubelet port, and how to reach it."""

    port: int
    namespace: str
    pod: str
    container: str
    ssl: ssl.SSLContext
    host: str = "127.0.0.1"
    local: str | None = None  # the client's source address (127.0.0.2, ...)

    def path(self, query: str) -> str:
        return f"/exec/{self.namespace}/{self.pod}/{self.container}?{query}"


async def _open(target: Target) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(
        target.host, target.port, ssl=target.ssl, local_addr=(target.local, 0) if target.local else None
    )


async def _upgrade(target: Target, query: str, tally: Tally) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, str]:
    """An exec request upgraded to SPDY/3.1 (v4): the connection and "" or, refused, why."""
    reader, writer = await _open(target)
    writer.write(
        (
            f"POST {target.path(query)} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
            "X-Stream-Protocol-Version: v4.channel.k8s.io\r\nContent-Length: 0\r\n\r\n"
        ).encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1].decode()
    _count(tally, status)
    return reader, writer, "" if status == "101" else f"refused {status}"


def _count(tally: Tally, status: str) -> None:
    if status == "101":
        tally.admitted += 1
    else:
        tally.refused += 1


def _cat(writer: asyncio.StreamWriter) -> spdy.Encoder:
    """Open the streams of `cat` (error, stdin, stdout): the command runs."""
    encoder = spdy.Encoder()
    for stream_id, kind in ((1, "error"), (3, "stdin"), (5, "stdout")):
        writer.write(encoder.encode(spdy.SynStream(stream_id, {"streamtype": [kind]})))
    return encoder


async def _ended(reader: asyncio.StreamReader) -> None:
    """Until the server closes the connection (what it sends meanwhile is dropped)."""
    with contextlib.suppress(ConnectionError, ssl.SSLError):
        while await reader.read(MIB):
            pass


async def _hold(writer: asyncio.StreamWriter, work: Awaitable[None]) -> str:
    """Run `work` (writing without reading); "closed" when the server ended the connection,
    "held" when cancelled first."""
    try:
        await work  # ends only when the connection does
        return "closed"
    except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
        return "closed"
    except asyncio.CancelledError:
        return "held"
    finally:
        writer.transport.abort()


async def stalled(target: Target) -> str:
    try:
        reader, writer = await _open(target)
    except (ConnectionError, ssl.SSLError):
        return "closed"  # refused during the handshake
    writer.write(b"GET /pods HTTP/1.1\r\nHost: x\r\n")
    try:
        await _ended(reader)
        return "closed"
    except asyncio.CancelledError:
        return "held"
    finally:
        writer.transport.abort()


async def _exec_cat(target: Target, tally: Tally) -> tuple[asyncio.StreamWriter, spdy.Encoder] | str:
    """An exec of `cat` with its streams open, or why it was refused."""
    _reader, writer, refused = await _upgrade(target, "command=cat&input=1&output=1", tally)
    if refused:
        writer.transport.abort()
        return refused
    return writer, _cat(writer)


async def _forever(writer: asyncio.StreamWriter, data: bytes) -> None:
    while True:
        writer.write(data)
        await writer.drain()


async def stream_flood(target: Target, tally: Tally) -> str:
    opened = await _exec_cat(target, tally)
    if isinstance(opened, str):
        return opened
    writer, encoder = opened

    async def flood() -> None:
        for stream_id in range(7, 4000, 2):
            writer.write(encoder.encode(spdy.SynStream(stream_id, {"streamtype": [f"s{stream_id}"]})))
            await writer.drain()
        await asyncio.Event().wait()  # then hold the session

    return await _hold(writer, flood())


async def ping_flood(target: Target, tally: Tally) -> str:
    opened = await _exec_cat(target, tally)
    if isinstance(opened, str):
        return opened
    writer, encoder = opened
    burst = b"".join(encoder.encode(spdy.Ping(i)) for i in range(1, 20000, 2))
    return await _hold(writer, _forever(writer, burst))


async def never_read(target: Target, tally: Tally) -> str:
    opened = await _exec_cat(target, tally)
    if isinstance(opened, str):
        return opened
    writer, encoder = opened
    return await _hold(writer, _forever(writer, encoder.encode(spdy.DataFrame(3, os.urandom(32 * 1024)))))


async def big_message(target: Target, tally: Tally) -> str:
    reader, writer = await _open(target)
    key = base64.b64encode(os.urandom(16)).decode()
    writer.write(
        (
            f"GET {target.path('command=cat&input=1&output=1')} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
            f"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Protocol: v5.channel.k8s.io\r\n\r\n"
        ).encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1].decode()
    _count(tally, status)
    if status != "101":
        writer.transport.abort()
        return f"refused {status}"
    # A masked binary frame that announces 64 MiB; its first MiB follows.
    writer.write(struct.pack(">BBQ", 0x82, 0x80 | 127, 64 * MIB) + os.urandom(4) + bytes(MIB))

    async def wait() -> None:
        await _ended(reader)

    return await _hold(writer, wait())


KINDS: dict[str, Callable[[Target, Tally], Awaitable[str]]] = {
    "stream_flood": stream_flood,
    "ping_flood": ping_flood,
    "never_read": never_read,
    "big_message": big_message,
}


async def mix(targets: list[Target], per_kind: int, tally: Tally) -> tuple[list[asyncio.Task[str]], dict[str, str]]:
    """`per_kind` sessions of each hostile kind, started, taking `targets` (one per identity,
    say) in turn; the tasks (cancel them to stop, their results say how each ended) and each
    task's kind by name."""
    tasks: list[asyncio.Task[str]] = []
    kinds: dict[str, str] = {}
    for i in range(per_kind):
        for kind, client in KINDS.items():
            name = f"hostile {kind} {i}"
            tasks.append(asyncio.create_task(_safe(client(targets[i % len(targets)], tally)), name=name))
            kinds[name] = kind
    return tasks, kinds


async def _safe(work: Awaitable[str]) -> str:
    """Whatever went wrong on a hostile client's side is its result, not an error of the caller."""
    try:
        return await work
    except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError, OSError) as exc:
        return f"closed ({type(exc).__name__})"


async def stop(tasks: list[asyncio.Task[str]]) -> list[str]:
    for task in tasks:
        task.cancel()
    return [r if isinstance(r, str) else f"error {r!r}" for r in await asyncio.gather(*tasks, return_exceptions=True)]


# -- credentials: a tenant that may exec through the kubelet port -------------------------------


def client_cert(state_dir: Path, user: str, directory: Path) -> tuple[Path, Path]:
    """A client certificate for `user`, signed by the offline cluster's CA: (certificate, key) files."""
    pki_dir = state_dir / "clusters" / "offline" / "pki"
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    pair = pki.issue(pki.KeyPair(ca_key, ca_cert), user, client=True)  # type: ignore[arg-type]
    return pair.write(directory, f"client-{user}")


def with_cert(pair: tuple[Path, Path]) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(pair[0]), str(pair[1]))
    return ctx


async def grant_nodes_proxy(client: KubeClient, user: str) -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"test-{user}"},
        "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get", "create"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"test-{user}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"test-{user}"},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
    }
    for path, body in (
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
        ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding),
    ):
        with contextlib.suppress(AlreadyExists):  # made by an earlier run against this lab
            await client.create(path, body)
