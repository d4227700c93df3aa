"""The in-memory reference provider: pods "run" in this process, following their clock.

Used by tests and the demo until the federation provider exists. Status is computed from
timestamps (created, started, exited, deleted), so it is the same after a restart when the
optional SQLite state file keeps the pods: that file stands in for a remote backend that
outlives the runtime, which is what restart tests need.

Pods are steered with annotations:
  vkprovider.io/memory-fail-create: "<message>"   create fails with that message (transient)
  vkprovider.io/memory-run-seconds: "5"           the containers exit after 5 s of running ...
  vkprovider.io/memory-exit-code: "3"             ... with this code (default 0)
  vkprovider.io/memory-action: fail|exit|evict|lose   applied when the pod is created or updated
"""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from vkprovider.memory.containers import MemoryContainers
from vkprovider.memory.statefile import StateFile
from vkprovider.memory.timeline import ANNOTATION_PREFIX, MemorySettings, Record, Timeline
from vkprovider.objects import Pod, PodStatus
from vkprovider.provider import (
    PROVIDER_LABEL,
    ExecStreams,
    LogOptions,
    NodeStatus,
    PodChanged,
    ProviderError,
    ProviderNotFound,
)


class MemoryProvider:
    """Implements PodLifecycle, PodNotifier, NodeProvider, LogProvider and StatsProvider."""

    def __init__(self, settings: MemorySettings | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings or MemorySettings()
        self._clock = clock
        self._timeline = Timeline(self.settings)
        self._records: dict[str, Record] = {}  # key -> live record
        self._callbacks: list[PodChanged] = []
        self._node_callbacks: list[Callable[[str], None]] = []
        self._timers: dict[str, list[asyncio.TimerHandle]] = {}
        self._state: StateFile | None = None
        #: Calls per method: what tests check for duplicates.
        self.calls: dict[str, int] = {}
        self.containers = MemoryContainers(
            records=self._records, live=self._expire, timeline=self._timeline, clock=clock
        )

    # -- persistence (vkprovider.memory.statefile) -------------------------------------------------

    def _save(self, record: Record) -> None:
        if self._state:
            self._state.save(record)

    def _drop(self, key: str) -> None:
        self._records.pop(key, None)
        for handle in self._timers.pop(key, []):
            handle.cancel()
        if self._state:
            self._state.drop(key)

    def _call_recorded(self, uid: str, outcome: str) -> None:
        if self._state:
            self._state.called(uid, outcome)

    def create_count(self, uid: str) -> int:
        """How many times a pod with this UID was created (across restarts with a state file)."""
        return self._state.create_count(uid) if self._state else 0

    def close(self) -> None:
        for handles in self._timers.values():
            for handle in handles:
                handle.cancel()
        self._timers.clear()
        if self._state:
            self._state.close()
            self._state = None

    # -- time-derived state (vkprovider.memory.timeline) -------------------------------------------

    def _expire(self, key: str) -> Record | None:
        record = self._records.get(key)
        if record is None:
            return None
        gone = self._timeline.gone_at(record)
        if gone is not None and self._clock() >= gone:
            self._drop(key)
            return None
        return record

    def _status(self, record: Record) -> PodStatus:
        return self._timeline.status(record, self._clock())

    # -- notifications ---------------------------------------------------------------------------

    def notify_pods(self, callback: PodChanged) -> None:
        self._callbacks.append(callback)

    def _emit(self, key: str) -> None:
        record = self._records.get(key)
        pod: Pod
        if record is None:
            namespace, _, name = key.partition("/")
            pod = {"metadata": {"namespace": namespace, "name": name}, "spec": {}}
        else:
            pod = copy.deepcopy(record.pod)
            pod["status"] = self._status(record)
        for callback in self._callbacks:
            callback(pod)

    def _schedule(self, record: Record) -> None:
        """Notify at each moment the time-derived status changes (start, exit, gone)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        key = record.key
        for handle in self._timers.pop(key, []):
            handle.cancel()
        moments = self._timeline.moments(record)
        now = self._clock()
        self._timers[key] = [loop.call_later(m - now + 0.001, self._tick, key) for m in moments if m > now]

    def _tick(self, key: str) -> None:
        self._expire(key)
        self._emit(key)

    def resume(self) -> None:
        """Load the state file (if any) and arm the status notifications; call inside the event
        loop when the runtime starts driving pods, which for a standby replica is only once it
        leads, so it sees the backend as the previous leader left it."""
        if self.settings.state_file and self._state is None:
            self._records.clear()
            self._state = StateFile(self.settings.state_file, clock=self._clock)
            self._records.update(self._state.records())
        for record in list(self._records.values()):
            self._schedule(record)

    # -- PodLifecycle ----------------------------------------------------------------------------

    async def _call(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1
        if self.settings.latency:
            await asyncio.sleep(self.settings.latency)

    async def create_pod(self, pod: Pod) -> None:
        await self._call("create_pod")
        key = f"{pod['metadata'].get('namespace', '')}/{pod['metadata'].get('name', '')}"
        uid = pod["metadata"].get("uid", "")
        existing = self._expire(key)
        if existing is not None:
            if existing.uid == uid:
                self._call_recorded(uid, "repeated")
                return  # idempotent: the same pod again (e.g. after a restart)
            self._call_recorded(uid, "refused")
            raise ProviderError(f"another pod named {key} (uid {existing.uid}) is still terminating")
        message = pod["metadata"].get("annotations", {}).get(ANNOTATION_PREFIX + "fail-create")
        if message:
            self._call_recorded(uid, "refused")
            raise ProviderError(message)
        record = Record(copy.deepcopy(pod), self._clock())
        self._apply_action(record)
        self._records[key] = record
        if self._state:
            self._state.created(record)
        self._schedule(record)
        self._emit(key)

    def _apply_action(self, record: Record) -> None:
        action = record.annotation("action")
        if action and action != record.action:
            record.action = action
            record.action_at = self._clock()

    async def update_pod(self, pod: Pod) -> None:
        await self._call("update_pod")
        key = f"{pod['metadata'].get('namespace', '')}/{pod['metadata'].get('name', '')}"
        record = self._expire(key)
        if record is None or record.uid != pod["metadata"].get("uid"):
            raise ProviderNotFound(f"pod {key} not found")
        record.pod = copy.deepcopy(pod)
        self._apply_action(record)
        if record.action == "lose":
            self._drop(key)
        else:
            self._save(record)
            self._schedule(record)
        self._emit(key)

    async def delete_pod(self, pod: Pod) -> None:
        await self._call("delete_pod")
        key = f"{pod['metadata'].get('namespace', '')}/{pod['metadata'].get('name', '')}"
        record = self._expire(key)
        if record is None or record.uid != pod["metadata"].get("uid"):
            raise ProviderNotFound(f"pod {key} not found")
        if record.deleting_at is None:
            record.deleting_at = self._clock()
            grace = pod["metadata"].get("deletionGracePeriodSeconds")
            record.pod["metadata"]["deletionGracePeriodSeconds"] = 30 if grace is None else grace
            self._save(record)
            self._schedule(record)
            self._expire(key)
            # Only on a change: a notice for a repeated delete sends the runtime back here at
            # once (its pod is gone from the API), a busy loop for the whole stop period.
            self._emit(key)

    async def get_pod(self, namespace: str, name: str) -> Pod | None:
        await self._call("get_pod")
        record = self._expire(f"{namespace}/{name}")
        if record is None:
            return None
        pod = copy.deepcopy(record.pod)
        pod["status"] = self._status(record)
        return pod

    async def get_pod_status(self, namespace: str, name: str) -> PodStatus | None:
        await self._call("get_pod_status")
        record = self._expire(f"{namespace}/{name}")
        return None if record is None else self._status(record)

    async def list_pods(self) -> list[Pod]:
        await self._call("list_pods")
        out = []
        for key in list(self._records):
            record = self._expire(key)
            if record is not None:
                pod = copy.deepcopy(record.pod)
                pod["status"] = self._status(record)
                out.append(pod)
        return out

    # -- NodeProvider ------------------------------------------------------------------------------

    async def node_status(self, node_name: str) -> NodeStatus:
        return NodeStatus(capacity=dict(self.settings.capacity), labels={PROVIDER_LABEL: "memory"})

    def notify_node_status(self, callback: Callable[[str], None]) -> None:
        self._node_callbacks.append(callback)

    # -- exec, logs and stats (vkprovider.memory.containers) -------------------------------------

    async def exec_in_container(
        self, namespace: str, name: str, container: str, command: list[str], streams: ExecStreams
    ) -> int:
        """A built-in command (vkprovider.minishell) in a running container of the pod."""
        return await self.containers.exec(namespace, name, container, command, streams)

    async def attach_to_container(self, namespace: str, name: str, container: str, streams: ExecStreams) -> None:
        await self.containers.attach(namespace, name, container, streams)

    def container_logs(self, namespace: str, name: str, container: str, options: LogOptions) -> AsyncIterator[bytes]:
        return self.containers.logs(namespace, name, container, options)

    async def stats_summary(self, node_name: str) -> dict[str, Any]:
        return await self.containers.stats(node_name)
