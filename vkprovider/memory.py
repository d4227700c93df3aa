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
import datetime
import hashlib
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vkprovider.minishell import Shell
from vkprovider.objects import ContainerStatus, Pod, PodCondition, PodStatus
from vkprovider.provider import (
    ExecStreams,
    LogOptions,
    NodeStatus,
    PodChanged,
    ProviderError,
    ProviderNotFound,
)

ANNOTATION_PREFIX = "vkprovider.io/memory-"


@dataclass(kw_only=True)
class MemorySettings:
    startup_delay: float = 0.5  # seconds from create to Running
    stop_seconds: float = 0.5  # seconds a graceful delete takes (capped by the grace period)
    log_interval: float = 1.0  # seconds between log lines of a running container
    latency: float = 0.0  # added to every call, to simulate a slow backend
    capacity: dict[str, str] = field(
        default_factory=lambda: {"cpu": "1000", "memory": "4Ti", "pods": "10000", "ephemeral-storage": "100Ti"}
    )
    state_file: Path | None = None


def _rfc3339(ts: float, *, nanos: bool = False) -> str:
    dt = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    if nanos:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_time(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class _Record:
    pod: Pod
    created: float
    action: str | None = None
    action_at: float | None = None
    deleting_at: float | None = None

    @property
    def uid(self) -> str:
        return self.pod["metadata"].get("uid", "")

    @property
    def key(self) -> str:
        meta = self.pod["metadata"]
        return f"{meta.get('namespace', '')}/{meta.get('name', '')}"

    def annotation(self, name: str) -> str | None:
        return self.pod["metadata"].get("annotations", {}).get(ANNOTATION_PREFIX + name)


class MemoryProvider:
    """Implements PodLifecycle, PodNotifier, NodeProvider, LogProvider and StatsProvider."""

    def __init__(self, settings: MemorySettings | None = None, *, clock: Callable[[], float] = time.time) -> None:
        self.settings = settings or MemorySettings()
        self._clock = clock
        self._records: dict[str, _Record] = {}  # key -> live record
        self._callbacks: list[PodChanged] = []
        self._node_callbacks: list[Callable[[str], None]] = []
        self._timers: dict[str, list[asyncio.TimerHandle]] = {}
        self._db: sqlite3.Connection | None = None
        self._run = 0  # this process's run of the backend (counted in the state file)
        #: Calls per method: what tests check for duplicates.
        self.calls: dict[str, int] = {}

    # -- persistence -----------------------------------------------------------------------------

    def _open(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS pods (key TEXT PRIMARY KEY, body TEXT, created REAL,"
            " action TEXT, action_at REAL, deleting_at REAL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS creates (uid TEXT, at REAL)")
        # Every create call, whatever its outcome, per provider run: a second call for a pod
        # the backend already has is accepted silently (idempotence), so only this table shows
        # a runtime that asks twice.
        self._db.execute("CREATE TABLE IF NOT EXISTS create_calls (uid TEXT, run INTEGER, outcome TEXT, at REAL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS runs (run INTEGER PRIMARY KEY AUTOINCREMENT, at REAL)")
        self._run = int(self._db.execute("INSERT INTO runs (at) VALUES (?)", (self._clock(),)).lastrowid or 0)
        for key, body, created, action, action_at, deleting_at in self._db.execute("SELECT * FROM pods"):
            self._records[key] = _Record(json.loads(body), created, action, action_at, deleting_at)

    def _save(self, record: _Record) -> None:
        if self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO pods VALUES (?, ?, ?, ?, ?, ?)",
                (
                    record.key,
                    json.dumps(record.pod),
                    record.created,
                    record.action,
                    record.action_at,
                    record.deleting_at,
                ),
            )

    def _drop(self, key: str) -> None:
        self._records.pop(key, None)
        for handle in self._timers.pop(key, []):
            handle.cancel()
        if self._db:
            self._db.execute("DELETE FROM pods WHERE key = ?", (key,))

    def _call_recorded(self, uid: str, outcome: str) -> None:
        if self._db:
            self._db.execute("INSERT INTO create_calls VALUES (?, ?, ?, ?)", (uid, self._run, outcome, self._clock()))

    def create_count(self, uid: str) -> int:
        """How many times a pod with this UID was created (across restarts with a state file)."""
        if self._db:
            return int(self._db.execute("SELECT COUNT(*) FROM creates WHERE uid = ?", (uid,)).fetchone()[0])
        return 0

    def close(self) -> None:
        for handles in self._timers.values():
            for handle in handles:
                handle.cancel()
        self._timers.clear()
        if self._db:
            self._db.close()
            self._db = None

    # -- time-derived state ----------------------------------------------------------------------

    def _started_at(self, record: _Record) -> float:
        return record.created + self.settings.startup_delay

    def _exit(self, record: _Record) -> tuple[float, int, str] | None:
        """(when, exit code, reason) if the containers have ended by themselves."""
        if record.action in ("fail", "exit", "evict") and record.action_at is not None:
            code = {"fail": 1, "exit": 0, "evict": 137}[record.action]
            return max(record.action_at, self._started_at(record)), code, record.action
        run = record.annotation("run-seconds")
        if run:
            code = int(record.annotation("exit-code") or 0)
            return self._started_at(record) + float(run), code, "exit" if code == 0 else "fail"
        return None

    def _gone_at(self, record: _Record) -> float | None:
        if record.deleting_at is None:
            return None
        grace = record.pod["metadata"].get("deletionGracePeriodSeconds")
        stop = self.settings.stop_seconds if grace is None else min(float(grace), self.settings.stop_seconds)
        return record.deleting_at + stop

    def _expire(self, key: str) -> _Record | None:
        record = self._records.get(key)
        if record is None:
            return None
        gone = self._gone_at(record)
        if gone is not None and self._clock() >= gone:
            self._drop(key)
            return None
        return record

    def _status(self, record: _Record) -> PodStatus:
        now = self._clock()
        started = self._started_at(record)
        pod = record.pod
        containers = pod["spec"].get("containers", [])
        ip = _pod_ip(record.uid)
        if now < started:
            return {
                "phase": "Pending",
                "conditions": _conditions(ready=False, started=False, at=record.created),
                "containerStatuses": [
                    _container(c, state={"waiting": {"reason": "ContainerCreating"}}, ready=False) for c in containers
                ],
            }
        base: PodStatus = {"startTime": _rfc3339(started), "podIP": ip, "podIPs": [{"ip": ip}]}
        ended = self._exit(record)
        if ended and now >= ended[0]:
            when, code, how = ended
            terminated = {
                "exitCode": code,
                "reason": {"exit": "Completed", "fail": "Error", "evict": "Evicted"}[how],
                "startedAt": _rfc3339(started),
                "finishedAt": _rfc3339(when),
            }
            status: PodStatus = {
                **base,
                "phase": "Succeeded" if code == 0 and how == "exit" else "Failed",
                "conditions": _conditions(ready=False, started=True, at=when),
                "containerStatuses": [_container(c, state={"terminated": terminated}, ready=False) for c in containers],
            }
            if how == "evict":
                status["reason"] = "Evicted"
                status["message"] = "The backend was low on resource: memory."
            return status
        return {
            **base,
            "phase": "Running",
            "conditions": _conditions(ready=True, started=True, at=started),
            "containerStatuses": [
                _container(c, state={"running": {"startedAt": _rfc3339(started)}}, ready=True) for c in containers
            ],
        }

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

    def _schedule(self, record: _Record) -> None:
        """Notify at each moment the time-derived status changes (start, exit, gone)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        key = record.key
        for handle in self._timers.pop(key, []):
            handle.cancel()
        moments = [self._started_at(record)]
        ended = self._exit(record)
        if ended:
            moments.append(ended[0])
        gone = self._gone_at(record)
        if gone is not None:
            moments.append(gone)
        now = self._clock()
        self._timers[key] = [loop.call_later(m - now + 0.001, self._tick, key) for m in moments if m > now]

    def _tick(self, key: str) -> None:
        self._expire(key)
        self._emit(key)

    def resume(self) -> None:
        """Load the state file (if any) and arm the status notifications; call inside the event
        loop when the runtime starts driving pods, which for a standby replica is only once it
        leads, so it sees the backend as the previous leader left it."""
        if self.settings.state_file and self._db is None:
            self._records.clear()
            self._open(self.settings.state_file)
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
        record = _Record(copy.deepcopy(pod), self._clock())
        self._apply_action(record)
        self._records[key] = record
        if self._db:
            # The pod and the record of its creation land together or not at all, so a crash
            # in between can neither hide a create nor allow a second one.
            with self._db:
                self._db.execute("BEGIN")
                self._save(record)
                self._db.execute("INSERT INTO creates VALUES (?, ?)", (record.uid, record.created))
                self._call_recorded(record.uid, "created")
        self._schedule(record)
        self._emit(key)

    def _apply_action(self, record: _Record) -> None:
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
        return NodeStatus(capacity=dict(self.settings.capacity), labels={"vkprovider.io/provider": "memory"})

    def notify_node_status(self, callback: Callable[[str], None]) -> None:
        self._node_callbacks.append(callback)

    # -- exec, logs and stats --------------------------------------------------------------------

    def _container(self, key: str, container: str) -> _Record:
        record = self._expire(key)
        if record is None:
            raise ProviderNotFound(f"pod {key} not found")
        if container not in {c.get("name") for c in record.pod["spec"].get("containers", [])}:
            raise ProviderNotFound(f"container {container} is not valid for pod {key.partition('/')[2]}")
        return record

    async def exec_in_container(
        self, namespace: str, name: str, container: str, command: list[str], streams: ExecStreams
    ) -> int:
        """A built-in command (vkprovider.minishell) in a running container of the pod."""
        key = f"{namespace}/{name}"
        record = self._container(key, container)
        if self._status(record).get("phase") != "Running":
            raise ProviderError(f"container {container} of pod {key} is not running")
        return await Shell(streams).run(command)

    async def attach_to_container(self, namespace: str, name: str, container: str, streams: ExecStreams) -> None:
        """The container's output is its simulated log: new lines as they are written, until the
        container ends or the client closes its input."""
        key = f"{namespace}/{name}"
        record = self._container(key, container)
        if self._status(record).get("phase") != "Running":
            raise ProviderError(f"container {container} of pod {key} is not running")
        out = streams.stdout or streams.stderr
        lines = self.container_logs(namespace, name, container, LogOptions(follow=True, tail_lines=0))

        async def relay() -> None:
            async for line in lines:
                if out is not None:
                    await out.write(line.replace(b"\n", b"\r\n") if streams.tty else line)

        async def until_input_ends() -> None:
            assert streams.stdin is not None
            while await streams.stdin.read():
                pass  # a simulated process reads nothing

        waits = [asyncio.create_task(relay(), name=f"attach-relay {key}")]
        if streams.stdin is not None:
            waits.append(asyncio.create_task(until_input_ends(), name=f"attach-stdin {key}"))
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if (error := task.exception()) is not None:
                    raise error
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def container_logs(
        self, namespace: str, name: str, container: str, options: LogOptions
    ) -> AsyncIterator[bytes]:
        key = f"{namespace}/{name}"
        record = self._container(key, container)
        if options.previous:
            raise ProviderNotFound(f"previous terminated container {container!r} in pod {name!r} not found")
        uid = record.uid
        interval = self.settings.log_interval
        start = self._started_at(record)
        since = None
        if options.since_seconds is not None:
            since = self._clock() - options.since_seconds
        elif options.since_time:
            since = _parse_time(options.since_time)

        def end_time() -> float | None:
            current = self._records.get(key)
            if current is None or current.uid != uid:
                return self._clock()
            ended = self._exit(current)
            gone = self._gone_at(current)
            candidates = [t for t in (ended[0] if ended else None, gone) if t is not None]
            return min(candidates) if candidates else None

        def line(index: int) -> bytes:
            at = start + index * interval
            text = f"{namespace}/{name}/{container} line {index}\n"
            return (f"{_rfc3339(at, nanos=True)} {text}" if options.timestamps else text).encode()

        def available(limit: float) -> int:
            return 0 if limit < start else int((limit - start) // interval) + 1

        now = self._clock()
        end = end_time()
        upto = available(min(now, end) if end is not None else now)
        first = 0 if since is None else max(0, available(since - 1e-9))
        if options.tail_lines is not None:
            first = max(first, upto - options.tail_lines)
        sent = 0
        index = first
        while True:
            while index < upto:
                chunk = line(index)
                if options.limit_bytes is not None:
                    if sent >= options.limit_bytes:
                        return
                    chunk = chunk[: options.limit_bytes - sent]
                sent += len(chunk)
                yield chunk
                index += 1
            if not options.follow:
                return
            end = end_time()
            if end is not None and self._clock() >= end:
                return
            next_at = start + index * interval
            await asyncio.sleep(max(0.0, next_at - self._clock()) + 0.001)
            now = self._clock()
            end = end_time()
            upto = available(min(now, end) if end is not None else now)

    async def stats_summary(self, node_name: str) -> dict[str, Any]:
        now = _rfc3339(self._clock())
        pods = []
        total_cpu = total_mem = 0
        for key in list(self._records):
            record = self._expire(key)
            if record is None or self._status(record).get("phase") != "Running":
                continue
            containers = []
            for c in record.pod["spec"].get("containers", []):
                requests = c.get("resources", {}).get("requests", {})
                cpu = int(_cpu_nanos(requests.get("cpu", "10m")) * 0.5)
                mem = int(_bytes(requests.get("memory", "16Mi")) * 0.5)
                total_cpu += cpu
                total_mem += mem
                containers.append(
                    {
                        "name": c.get("name"),
                        "startTime": _rfc3339(self._started_at(record)),
                        "cpu": {"time": now, "usageNanoCores": cpu, "usageCoreNanoSeconds": cpu},
                        "memory": {"time": now, "workingSetBytes": mem, "usageBytes": mem},
                    }
                )
            meta = record.pod["metadata"]
            pods.append(
                {
                    "podRef": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
                    "startTime": _rfc3339(self._started_at(record)),
                    "containers": containers,
                    "cpu": {"time": now, "usageNanoCores": sum(c["cpu"]["usageNanoCores"] for c in containers)},
                    "memory": {"time": now, "workingSetBytes": sum(c["memory"]["workingSetBytes"] for c in containers)},
                }
            )
        return {
            "node": {
                "nodeName": node_name,
                "startTime": now,
                "cpu": {"time": now, "usageNanoCores": total_cpu, "usageCoreNanoSeconds": total_cpu},
                "memory": {"time": now, "workingSetBytes": total_mem, "usageBytes": total_mem},
            },
            "pods": pods,
        }


def _pod_ip(uid: str) -> str:
    digest = hashlib.sha256(uid.encode()).digest()
    return f"10.{200 + digest[0] % 50}.{digest[1]}.{digest[2] % 254 + 1}"


def _conditions(*, ready: bool, started: bool, at: float) -> list[PodCondition]:
    ts = _rfc3339(at)

    def cond(ctype: str, ok: bool) -> PodCondition:
        return {"type": ctype, "status": "True" if ok else "False", "lastTransitionTime": ts}

    return [
        cond("PodReadyToStartContainers", started),
        cond("Initialized", True),
        cond("Ready", ready),
        cond("ContainersReady", ready),
    ]


def _container(spec: dict[str, Any], *, state: dict[str, Any], ready: bool) -> ContainerStatus:
    image = spec.get("image", "")
    return {
        "name": spec.get("name", ""),
        "image": image,
        "imageID": f"memory://{image}",
        "containerID": f"memory://{spec.get('name', '')}",
        "ready": ready,
        "started": "running" in state,
        "restartCount": 0,
        "state": state,
    }


_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def _bytes(quantity: str) -> float:
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * _SUFFIX[suffix]
    return float(quantity)


def _cpu_nanos(quantity: str) -> float:
    if quantity.endswith("m"):
        return float(quantity[:-1]) * 1e6
    return float(quantity) * 1e9
