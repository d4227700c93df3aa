"""The provider's side of the agent: a member's inventory read from its agent's stream, so the
same capacity arithmetic gives the same summary as watching the member directly.

A stream that stays silent longer than three heartbeats counts as broken; the client
reconnects with backoff, and the member's reachability follows the last message received.
"""

from __future__ import annotations

import asyncio
import socket
import time
from collections.abc import Callable

import grpc

from federation.agent import capacity_pb2 as pb
from federation.agent import capacity_pb2_grpc as pb_grpc
from federation.agent.convert import apply_node, remove_node
from federation.capacity.inventory import Inventory
from federation.capacity.summary import CapacityPolicy, MemberCapacity, Summarizer
from federation.config import MemberConfig
from vkprovider import logs


class AgentSource:
    def __init__(
        self, config: MemberConfig, *, on_change: Callable[[], None], owner: str = "", silence: float = 15.0
    ) -> None:
        if not config.agent_address:
            raise ValueError(f"member {config.name}: source agent needs agent_address")
        self.name = config.name
        self._address = config.agent_address
        self._owner = owner  # whose pods the agent counts as ours (federation.labels.Owner.key)
        self._tls_ca = config.agent_tls_ca.read_bytes() if config.agent_tls_ca else None
        self._on_change = on_change
        self._silence = silence
        self.inventory = Inventory(network_pod_label=config.network_pod_label)
        self._synced = asyncio.Event()
        self._last_contact: float | None = None
        self._started = time.monotonic()
        self._last_contact_wall: float | None = None
        self._last_error: str | None = None
        self.updates = 0
        self._summarizer = Summarizer(config.name)
        self._log = logs.get("agent-client", cluster=config.name, agent=config.agent_address)

    @property
    def synced(self) -> asyncio.Event:
        return self._synced

    @property
    def last_error(self) -> str | None:
        return self._last_error

    @property
    def last_contact_wall(self) -> float | None:
        return self._last_contact_wall

    def unreachable_for(self) -> float:
        since = self._last_contact if self._last_contact is not None else self._started
        return time.monotonic() - since

    def summarize(self, policy: CapacityPolicy) -> MemberCapacity:
        return self._summarizer.summarize(self.inventory, policy)

    def _apply(self, update: pb.Update) -> None:
        self._last_contact = time.monotonic()
        self._last_contact_wall = time.time()
        self._last_error = None
        if update.heartbeat:
            return
        if update.snapshot:
            self.inventory = Inventory(network_pod_label=self.inventory.network_pod_label)
        for node in update.nodes:
            apply_node(self.inventory, node)
        for name in update.removed:
            remove_node(self.inventory, name)
        self.updates += 1
        self._synced.set()
        self._on_change()

    def _channel(self) -> grpc.aio.Channel:
        if self._tls_ca:
            return grpc.aio.secure_channel(self._address, grpc.ssl_channel_credentials(root_certificates=self._tls_ca))
        return grpc.aio.insecure_channel(self._address)

    async def run(self) -> None:
        self._started = time.monotonic()
        failures = 0
        while True:
            try:
                async with self._channel() as channel:
                    stub = pb_grpc.CapacityAgentStub(channel)  # type: ignore[no-untyped-call]
                    call = stub.Watch(pb.WatchRequest(client=f"vkprovider@{socket.gethostname()}", owner=self._owner))
                    while True:
                        update = await asyncio.wait_for(call.read(), timeout=self._silence)
                        if update is grpc.aio.EOF:
                            raise ConnectionError("the agent closed the stream")
                        self._apply(update)
                        failures = 0
            except (grpc.aio.AioRpcError, TimeoutError, ConnectionError, OSError) as exc:
                failures += 1
                detail = exc.details() if isinstance(exc, grpc.aio.AioRpcError) else repr(exc)
                self._last_error = f"agent {self._address}: {detail}"
                self._on_change()
                delay = min(10.0, 0.25 * 2**failures)
                self._log.warning("agent stream broken; reconnecting", error=self._last_error, retry_in=delay)
                await asyncio.sleep(delay)
