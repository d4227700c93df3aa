"""A memory pod's life, derived from its timestamps (pure): created, started after the startup
delay, exited (by its annotations or an action), gone after a delete's stop period. The same
record gives the same status after a restart, which is what restart tests rely on."""

from __future__ import annotations

import datetime
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vkprovider.objects import ContainerStatus, Pod, PodCondition, PodStatus

#: Annotations that script a pod of the in-memory provider (`memory-fail-create`, `memory-exit-after`,
#: ...): how it starts, runs and ends, for tests and the demo.
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


def rfc3339(ts: float, *, nanos: bool = False) -> str:
    dt = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    if nanos:
        return dt.strftime("%Y-%m-%dT%H:%M:%S.%f") + "000Z"
    return dt.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class Record:
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


class Timeline:
    """When each moment of a record's life comes, and its status at any time."""

    def __init__(self, settings: MemorySettings) -> None:
        self.settings = settings

    def started_at(self, record: Record) -> float:
        return record.created + self.settings.startup_delay

    def exit(self, record: Record) -> tuple[float, int, str] | None:
        """(when, exit code, reason) if the containers have ended by themselves."""
        if record.action in ("fail", "exit", "evict") and record.action_at is not None:
            code = {"fail": 1, "exit": 0, "evict": 137}[record.action]
            return max(record.action_at, self.started_at(record)), code, record.action
        run = record.annotation("run-seconds")
        if run:
            code = int(record.annotation("exit-code") or 0)
            return self.started_at(record) + float(run), code, "exit" if code == 0 else "fail"
        return None

    def gone_at(self, record: Record) -> float | None:
        if record.deleting_at is None:
            return None
        grace = record.pod["metadata"].get("deletionGracePeriodSeconds")
        stop = self.settings.stop_seconds if grace is None else min(float(grace), self.settings.stop_seconds)
        return record.deleting_at + stop

    def moments(self, record: Record) -> list[float]:
        """Every time the record's status changes by itself: start, exit, gone."""
        moments = [self.started_at(record)]
        ended = self.exit(record)
        if ended:
            moments.append(ended[0])
        gone = self.gone_at(record)
        if gone is not None:
            moments.append(gone)
        return moments

    def status(self, record: Record, now: float) -> PodStatus:
        started = self.started_at(record)
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
        base: PodStatus = {"startTime": rfc3339(started), "podIP": ip, "podIPs": [{"ip": ip}]}
        ended = self.exit(record)
        if ended and now >= ended[0]:
            when, code, how = ended
            terminated = {
                "exitCode": code,
                "reason": {"exit": "Completed", "fail": "Error", "evict": "Evicted"}[how],
                "startedAt": rfc3339(started),
                "finishedAt": rfc3339(when),
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
                _container(c, state={"running": {"startedAt": rfc3339(started)}}, ready=True) for c in containers
            ],
        }


def _pod_ip(uid: str) -> str:
    digest = hashlib.sha256(uid.encode()).digest()
    return f"10.{200 + digest[0] % 50}.{digest[1]}.{digest[2] % 254 + 1}"


def _conditions(*, ready: bool, started: bool, at: float) -> list[PodCondition]:
    ts = rfc3339(at)

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
