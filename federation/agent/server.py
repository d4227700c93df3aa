"""The agent's side: a member's inventory from direct watches, streamed to every client as a
snapshot, then deltas of the nodes that changed (coalesced), and heartbeats when idle."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from federation.agent import capacity_pb2 as pb
from federation.agent import capacity_pb2_grpc as pb_grpc
from federation.agent.convert import node_message
from federation.members.watch import MemberWatcher
from vkprovider import logs


class CapacityAgent(pb_grpc.CapacityAgentServicer):
    def __init__(self, watcher: MemberWatcher, *, heartbeat: float = 5.0, coalesce: float = 0.2) -> None:
        self._watcher = watcher
        self._heartbeat = heartbeat
        self._coalesce = coalesce
        self._log = logs.get("agent", cluster=watcher.name)

    def _update(self, *, version: int, snapshot: bool, names: list[str], removed: list[str], owner: str) -> pb.Update:
        inv = self._watcher.inventory
        return pb.Update(
            version=version,
            snapshot=snapshot,
            nodes=[node_message(inv, n, owner) for n in names if n in inv.nodes],
            removed=removed,
            member=self._watcher.name,
            sent_unix_ms=int(time.time() * 1000),
        )

    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.Update]:
        self._log.info("client connected", client=request.client, owner=request.owner)
        await self._watcher.synced.wait()
        inv = self._watcher.inventory
        sent = dict(inv.node_versions)
        yield self._update(version=inv.version, snapshot=True, names=list(inv.nodes), removed=[], owner=request.owner)
        last_sent = time.monotonic()
        try:
            while True:
                await asyncio.sleep(self._coalesce)
                current = inv.node_versions
                changed = [n for n, v in current.items() if sent.get(n) != v]
                removed = [n for n in sent if n not in current]
                if changed or removed:
                    for name in removed:
                        del sent[name]
                    for name in changed:
                        sent[name] = current[name]
                    yield self._update(
                        version=inv.version, snapshot=False, names=changed, removed=removed, owner=request.owner
                    )
                    last_sent = time.monotonic()
                elif time.monotonic() - last_sent >= self._heartbeat:
                    yield pb.Update(
                        version=inv.version,
                        heartbeat=True,
                        member=self._watcher.name,
                        sent_unix_ms=int(time.time() * 1000),
                    )
                    last_sent = time.monotonic()
        finally:
            self._log.info("client gone", client=request.client)


async def serve(
    watcher: MemberWatcher,
    *,
    listen: str,
    tls: tuple[bytes, bytes] | None = None,
    heartbeat: float = 5.0,
) -> None:
    """Run the watcher and the gRPC server until cancelled."""
    server = grpc.aio.server()
    pb_grpc.add_CapacityAgentServicer_to_server(  # type: ignore[no-untyped-call]
        CapacityAgent(watcher, heartbeat=heartbeat), server
    )
    if tls:
        port = server.add_secure_port(listen, grpc.ssl_server_credentials([(tls[1], tls[0])]))
    else:
        port = server.add_insecure_port(listen)
    if port == 0:
        raise OSError(f"cannot listen on {listen}")
    await server.start()
    log = logs.get("agent", cluster=watcher.name)
    log.info("serving", listen=listen, tls=bool(tls))
    watch = asyncio.create_task(watcher.run(), name=f"agent/watch/{watcher.name}")
    try:
        await asyncio.gather(watch, server.wait_for_termination())
    finally:
        watch.cancel()
        await server.stop(grace=2)
        await asyncio.gather(watch, return_exceptions=True)
