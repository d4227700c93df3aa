"""A kubelet on this host for the pods of one namespace that no node takes: each is run from its
image with e2e.podrun, and its status written back as a kubelet writes it.

The lab's nodes run no containers (KWOK only writes statuses, and completes a Job's pod by
itself after 2 s), so a test that wants a chart's pods to really run keeps them off every node
(a nodeSelector no node matches, say) and serves them here. A pod is taken when it has no
`nodeName`, has not ended, and names an image this kubelet has; then:

- started: phase Running, the pod's IP (127.0.0.1: the host's network), its container running;
  Ready once its readiness probe (exec) passes, at once if it has none;
- its container ended: phase Succeeded (exit 0 and restartPolicy not Always) or Failed, the
  container terminated with its exit code, as the Job controller and `helm test` read it. A
  container of a restartPolicy Always pod that ends is not restarted: it is reported waiting in
  CrashLoopBackOff (a test's provider must not end);
- deleted (gone, or marked for deletion): stopped with the grace period the deletion gives;
- not startable (e2e.podrun.PodRunError): left Pending, its container waiting with reason
  CreateContainerConfigError and the message, and the error kept in `errors`.

The lab deletes an unbound pod at once (no grace), so a kubelet here never confirms a deletion.
Liveness probes are not run. Polls the namespace every `poll` seconds: one list, not a watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e import podrun
from e2e.image.unpack import Unpacked
from vkprovider.kube import ApiError, KubeClient, NotFound


def _stamp(at: float | None = None) -> str:
    moment = datetime.datetime.fromtimestamp(time.time() if at is None else at, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(*, ready: bool, reason: str | None = None) -> list[dict[str, Any]]:
    now = _stamp()
    out = [{"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now}]
    out.append({"type": "Initialized", "status": "True", "lastTransitionTime": now})
    for kind in ("ContainersReady", "Ready"):
        condition = {"type": kind, "status": "True" if ready else "False", "lastTransitionTime": now}
        if reason:
            condition["reason"] = reason
        out.append(condition)
    return out


@dataclass
class _Served:
    pod: dict[str, Any]
    run: podrun.Running
    ready: bool = False
    next_probe: float = 0.0
    ended: bool = False


@dataclass
class HostKubelet:
    """Serves the unbound pods of `namespace` (use `async with`; everything it started is
    stopped on leaving)."""

    client: KubeClient
    namespace: str
    images: Mapping[str, Unpacked]  # image reference as pods name it -> its unpacked tree
    host: podrun.Host
    workdir: Path
    poll: float = 0.5
    #: namespace/pod -> exit status, for every container that ended (or was stopped).
    exits: dict[str, int] = field(default_factory=dict)
    #: namespace/pod -> why it could not start; "(kubelet)" -> the last failure of a round.
    errors: dict[str, str] = field(default_factory=dict)
    #: pod UID -> what runs it (a pod made again under its name, as a test hook is, is another).
    served: dict[str, _Served] = field(default_factory=dict)
    _refused: set[str] = field(default_factory=set)
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> HostKubelet:
        self._task = asyncio.create_task(self._loop(), name=f"hostkubelet-{self.namespace}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        try:
            for served in self.served.values():
                if not served.ended:
                    self.exits[served.run.name] = await served.run.stop()
                    served.ended = True
        finally:
            for served in self.served.values():
                served.run.ensure_stopped()

    def started(self, prefix: str = "") -> list[str]:
        """Names of the pods started here (whose names start with `prefix`), in order."""
        names = (s.pod["metadata"]["name"] for s in self.served.values())
        return [n for n in names if n.startswith(prefix)]

    def log(self, pod: str) -> str:
        """The output of the last container run here for the pod named `pod`, "" if none."""
        runs = [s for s in self.served.values() if s.pod["metadata"]["name"] == pod]
        return runs[-1].run.log_path.read_text(errors="replace") if runs else ""

    async def _loop(self) -> None:
        while True:
            try:
                await self._sync()
            except ApiError:
                pass  # the next round lists again
            except Exception as exc:  # kept for the test to see; the next round goes on
                self.errors["(kubelet)"] = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(self.poll)

    async def _sync(self) -> None:
        listed = await self.client.list(f"/api/v1/namespaces/{self.namespace}/pods")
        pods = {p["metadata"]["uid"]: p for p in listed["items"]}
        for uid, served in self.served.items():
            if served.ended:
                continue
            current = pods.get(uid)
            if current is None or current["metadata"].get("deletionTimestamp"):
                grace = (current or {}).get("metadata", {}).get("deletionGracePeriodSeconds")
                self.exits[served.run.name] = await served.run.stop(None if grace is None else float(grace))
                served.ended = True
            elif served.run.returncode is not None:
                await self._ended(served)
            else:
                await self._probe(served)
        for uid, pod in pods.items():
            if uid not in self.served and uid not in self._refused and self._takes(pod):
                await self._start(pod)

    def _takes(self, pod: dict[str, Any]) -> bool:
        spec, status = pod["spec"], pod.get("status") or {}
        return (
            not spec.get("nodeName")
            and not pod["metadata"].get("deletionTimestamp")
            and status.get("phase", "Pending") == "Pending"
            and spec["containers"][0]["image"] in self.images
        )

    async def _start(self, pod: dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        image = self.images[container["image"]]
        try:
            run = await podrun.start(pod, image=image, client=self.client, host=self.host, workdir=self.workdir)
        except podrun.PodRunError as exc:
            self._refused.add(pod["metadata"]["uid"])
            self.errors[f"{self.namespace}/{pod['metadata']['name']}"] = str(exc)
            waiting = {"reason": "CreateContainerConfigError", "message": str(exc)}
            await self._status(pod, {"containerStatuses": [self._container(pod, image, {"waiting": waiting})]})
            return
        probe = container.get("readinessProbe") or {}
        served = _Served(pod=pod, run=run, ready=not probe)
        served.next_probe = time.monotonic() + float(probe.get("initialDelaySeconds", 0))
        self.served[pod["metadata"]["uid"]] = served
        running = {"running": {"startedAt": _stamp(run.started_at)}}
        ip = [{"ip": self.host.pod_ip}]
        await self._status(
            pod,
            {
                "phase": "Running",
                "hostIP": self.host.pod_ip,
                "hostIPs": ip,
                "podIP": self.host.pod_ip,
                "podIPs": ip,
                "startTime": _stamp(run.started_at),
                "conditions": _conditions(ready=served.ready),
                "containerStatuses": [self._container(pod, image, running, ready=served.ready, started=True)],
            },
        )

    async def _probe(self, served: _Served) -> None:
        """The readiness probe (exec), every periodSeconds; the Ready condition follows it."""
        container = served.pod["spec"]["containers"][0]
        probe = container.get("readinessProbe") or {}
        if "exec" not in probe or time.monotonic() < served.next_probe:
            return
        served.next_probe = time.monotonic() + float(probe.get("periodSeconds", 10))
        timeout = float(probe.get("timeoutSeconds", 1))
        result = await asyncio.to_thread(served.run.exec, list(probe["exec"]["command"]), timeout=timeout)
        ready = result.returncode == 0
        if ready != served.ready:
            served.ready = ready
            image = self.images[container["image"]]
            running = {"running": {"startedAt": _stamp(served.run.started_at)}}
            await self._status(
                served.pod,
                {
                    "conditions": _conditions(ready=ready),
                    "containerStatuses": [self._container(served.pod, image, running, ready=ready, started=True)],
                },
            )

    async def _ended(self, served: _Served) -> None:
        run, pod = served.run, served.pod
        code = run.returncode
        assert code is not None
        self.exits[run.name] = code
        served.ended = True
        image = self.images[pod["spec"]["containers"][0]["image"]]
        terminated = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": _stamp(run.started_at),
            "finishedAt": _stamp(run.finished_at),
        }
        if pod["spec"].get("restartPolicy", "Always") == "Always":
            waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": f"exited with {code}; not restarted here"}}
            status = self._container(pod, image, waiting) | {"lastState": {"terminated": terminated}}
            await self._status(pod, {"conditions": _conditions(ready=False), "containerStatuses": [status]})
            return
        await self._status(
            pod,
            {
                "phase": "Succeeded" if code == 0 else "Failed",
                "conditions": _conditions(ready=False, reason="PodCompleted"),
                "containerStatuses": [self._container(pod, image, {"terminated": terminated})],
            },
        )

    def _container(
        self, pod: dict[str, Any], image: Unpacked, state: dict[str, Any], *, ready: bool = False, started: bool = False
    ) -> dict[str, Any]:
        container = pod["spec"]["containers"][0]
        return {
            "name": container["name"],
            "image": container["image"],
            "imageID": image.digest,
            "containerID": f"podrun://{pod['metadata']['uid']}",
            "ready": ready,
            "started": started,
            "restartCount": 0,
            "state": state,
        }

    async def _status(self, pod: dict[str, Any], status: dict[str, Any]) -> None:
        meta = pod["metadata"]
        with contextlib.suppress(NotFound):
            await self.client.patch(
                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                {"metadata": {"uid": meta["uid"]}, "status": status},
                patch_type="strategic",
            )
