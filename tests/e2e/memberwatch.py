"""Watching members for the whole of a test: every pod and gang object of a job that appears
in any member, when, and under which UID, so tests can assert on what happened in between and
not only on the end state.

The watch must not go blind without the test knowing: the first list is retried like the
watch, an expired resourceVersion (410) lists again and reports what changed meanwhile, and a
member that cannot be watched for `max_blind` seconds fails the test at `check()` or `stop()`.
`start()` returns only once every watch has listed, so nothing the test does after it is missed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from e2e.fixtures import Lab
from federation import labels
from vkprovider.kube import ApiError, Gone

PODS = "/api/v1/pods"
PODGROUPS = "/apis/scheduling.k8s.io/v1beta1/podgroups"


@dataclass(frozen=True)
class Sighting:
    """One change seen in a member: ADDED, MODIFIED or DELETED (also when found by a re-list)."""

    at: float  # time.monotonic()
    member: str
    path: str
    type: str
    namespace: str
    name: str
    uid: str
    origin_uid: str
    bound: bool
    annotations: dict[str, str] = field(default_factory=dict)


@dataclass
class MemberWatch:
    lab: Lab
    members: list[str]
    selector: str
    paths: tuple[str, ...] = (PODS, PODGROUPS)
    max_blind: float = 15.0
    #: Called after every sighting (the test's invariant checks run here, as things happen).
    on_sighting: Callable[[Sighting], None] | None = None
    history: list[Sighting] = field(default_factory=list)
    #: What each member holds now: (member, path) -> uid -> object.
    live: dict[tuple[str, str], dict[str, dict[str, Any]]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)
    _listed: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)

    @classmethod
    def for_job(cls, lab: Lab, members: list[str], job_hash: str, **kwargs: Any) -> MemberWatch:
        return cls(lab=lab, members=members, selector=f"{labels.JOB_LABEL}={job_hash}", **kwargs)

    # -- what was seen ---------------------------------------------------------------------------

    @property
    def seen(self) -> dict[str, set[str]]:
        """Names of everything each member ever held during the watch."""
        out: dict[str, set[str]] = {m: set() for m in self.members}
        for s in self.history:
            out[s.member].add(s.name)
        return out

    def holding(self, member: str, path: str = PODS) -> list[dict[str, Any]]:
        return list(self.live.get((member, path), {}).values())

    def uids_by_name(self, path: str = PODS) -> dict[tuple[str, str, str], list[str]]:
        """(member, namespace, name) -> the distinct UIDs seen under that name, in order."""
        out: dict[tuple[str, str, str], list[str]] = {}
        for s in self.history:
            if s.path != path:
                continue
            uids = out.setdefault((s.member, s.namespace, s.name), [])
            if s.uid not in uids:
                uids.append(s.uid)
        return out

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start watching; return once every member and path has been listed."""
        for member in self.members:
            for path in self.paths:
                self._listed[(member, path)] = asyncio.Event()
                self.live[(member, path)] = {}
                task = asyncio.create_task(self._watch(member, path), name=f"test-watch/{member}{path}")
                task.add_done_callback(self._died)
                self._tasks.append(task)
        waiting = [asyncio.create_task(e.wait(), name="test-watch/listed") for e in self._listed.values()]
        try:
            done, _ = await asyncio.wait(waiting, timeout=self.max_blind * 2)
        finally:
            for waiter in waiting:
                waiter.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
        if len(done) != len(waiting):
            await self.stop()
            raise AssertionError(f"member watches never listed: {self.failures}")

    def _died(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        self.failures.append(f"{task.get_name()} stopped: {exc!r}")

    def check(self) -> None:
        """Fail if any watch has gone blind or stopped."""
        if self.failures:
            raise AssertionError("a member watch stopped watching: " + "; ".join(self.failures))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self.check()

    # -- the watch -------------------------------------------------------------------------------

    def _record(self, member: str, path: str, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = meta.get("uid", "")
        held = self.live[(member, path)]
        if kind == "DELETED":
            held.pop(uid, None)
        else:
            held[uid] = obj
        sighting = Sighting(
            at=time.monotonic(),
            member=member,
            path=path,
            type=kind,
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            uid=uid,
            origin_uid=(meta.get("labels") or {}).get(labels.ORIGIN_UID, ""),
            bound=bool((obj.get("spec") or {}).get("nodeName")),
            annotations=dict(meta.get("annotations") or {}),
        )
        self.history.append(sighting)
        if self.on_sighting is not None:
            try:
                self.on_sighting(sighting)
            except AssertionError as exc:
                self.failures.append(str(exc))

    def _relisted(self, member: str, path: str, items: list[dict[str, Any]]) -> None:
        """Apply a full list: whatever went missing was deleted while we were not watching."""
        held = self.live[(member, path)]
        now = {i["metadata"]["uid"]: i for i in items}
        for uid, obj in list(held.items()):
            if uid not in now:
                self._record(member, path, "DELETED", obj)
        for uid, obj in now.items():
            if uid not in held:
                self._record(member, path, "ADDED", obj)
            else:
                held[uid] = obj

    async def _watch(self, member: str, path: str) -> None:
        params = {"labelSelector": self.selector}
        blind_since: float | None = None
        async with self.lab.client(member) as client:
            while True:
                try:
                    listed = await client.list(path, params=params)
                    self._relisted(member, path, listed["items"])
                    self._listed[(member, path)].set()
                    rv = listed["metadata"]["resourceVersion"]
                    blind_since = None
                    while True:  # a watch the server ends normally resumes from where it was
                        async for event in client.watch(path, resource_version=rv, params=params):
                            rv = event["object"].get("metadata", {}).get("resourceVersion", rv)
                            if event["type"] != "BOOKMARK":
                                self._record(member, path, event["type"], event["object"])
                except Gone:
                    continue  # list again; the diff reports what changed in between
                except ApiError as exc:
                    now = time.monotonic()
                    blind_since = blind_since or now
                    if now - blind_since > self.max_blind:
                        blind = f"could not watch {member}{path} for {self.max_blind:.0f}s"
                        raise AssertionError(f"{blind}: {exc}") from exc
                    await asyncio.sleep(0.2)


def partial_spans(history: list[Sighting], *, member: str, minimum: int, end: float) -> list[tuple[float, float]]:
    """The spans (start, end) during which `member` held some pods of a gang but fewer than its
    minimum, replayed from the sightings; a span still open is closed at `end`."""
    held: set[str] = set()
    spans: list[tuple[float, float]] = []
    since: float | None = None
    for s in history:
        if s.member != member or s.path != PODS:
            continue
        if s.type == "DELETED":
            held.discard(s.uid)
        else:
            held.add(s.uid)
        partial = 0 < len(held) < minimum
        if partial and since is None:
            since = s.at
        elif not partial and since is not None:
            spans.append((since, s.at))
            since = None
    if since is not None:
        spans.append((since, end))
    return spans
