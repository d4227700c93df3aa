"""The ConfigMaps and Secrets a pod needs before it starts, and the kubelet's answer when one is
missing: the pod is not started (the provider never sees it); it waits Pending, its containers
waiting with the kubelet's reason, ContainerCreating for a volume (Event FailedMount) and
CreateContainerConfigError for env (Event Failed), plus the Event reasons virtual-kubelet-based
providers emit, which tools built around virtual kubelets watch for (MandatoryConfigMapNotFound,
MandatorySecretNotFound, and ...KeyNotFound for a missing key). It starts once the object
appears: the pod controller looks again every RECHECK seconds. A missing optional reference
starts the pod, with a Normal Event (OptionalConfigMapNotFound, ...).

Image pull secrets are not checked: a kubelet starts a pod whose pull secret is missing (the
pull may not need it). `uses` and `verdict` are pure; `ReferenceGate` does the lookups, each
answer kept a short while so that a burst of pods naming one ConfigMap costs one read.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from cachetools import TTLCache

from vkprovider.events import EventRecorder
from vkprovider.kube import Forbidden, KubeClient, NotFound
from vkprovider.objects import EVERYWHERE_CONFIGMAPS, ContainerStatus, Pod, PodStatus

#: Seconds between looks at a waiting pod's missing references (and how long an answer is kept).
RECHECK = 2.0

Kind = Literal["configmap", "secret"]
_KIND_NAMES: dict[Kind, str] = {"configmap": "ConfigMap", "secret": "Secret"}


@dataclass(frozen=True)
class Use:
    """One reference of a pod to a ConfigMap or Secret: from a volume (named) or a container's
    env; `keys`, the keys it needs there (none: the whole object)."""

    kind: Kind
    name: str
    optional: bool
    volume: str | None = None
    container: str | None = None
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class Missing:
    """A reference that cannot be served, and what the kubelet would say of it."""

    use: Use
    key: str | None  # the missing key, or None when the object itself is missing
    namespace: str

    @property
    def message(self) -> str:
        """The kubelet's words (pkg/volume/configmap, pkg/volume/secret, kubelet_pods.go)."""
        kind, name = self.use.kind, self.use.name
        if self.key is None:
            return f'{kind} "{name}" not found'
        if self.use.volume:
            what = "config" if kind == "configmap" else "secret"
            return f"{kind} references non-existent {what} key: {self.key}"
        return f"couldn't find key {self.key} in {_KIND_NAMES[kind]} {self.namespace}/{name}"

    @property
    def reason(self) -> str:
        """The virtual-kubelet Event reason: Mandatory/Optional, ConfigMap/Secret, (Key)NotFound."""
        which = "Optional" if self.use.optional else "Mandatory"
        return f"{which}{_KIND_NAMES[self.use.kind]}{'Key' if self.key else ''}NotFound"


def _volume_uses(volume: dict[str, Any]) -> Iterator[Use]:
    name = volume.get("name")
    sources: list[tuple[Kind, dict[str, Any], str]] = []
    if volume.get("configMap"):
        sources.append(("configmap", volume["configMap"], "name"))
    if volume.get("secret"):
        sources.append(("secret", volume["secret"], "secretName"))
    for source in (volume.get("projected") or {}).get("sources") or []:
        if source.get("configMap"):
            sources.append(("configmap", source["configMap"], "name"))
        if source.get("secret"):
            sources.append(("secret", source["secret"], "name"))
    for kind, ref, field in sources:
        target = ref.get(field)
        if not target or (kind == "configmap" and target in EVERYWHERE_CONFIGMAPS):
            continue
        keys = tuple(item["key"] for item in ref.get("items") or [] if item.get("key"))
        yield Use(kind, target, bool(ref.get("optional")), volume=name, keys=keys)


def _env_uses(container: dict[str, Any]) -> Iterator[Use]:
    name = container.get("name")
    for env in container.get("env") or []:
        value_from = env.get("valueFrom") or {}
        for kind, field in (("configmap", "configMapKeyRef"), ("secret", "secretKeyRef")):
            ref = value_from.get(field) or {}
            if ref.get("name"):
                keys = (ref["key"],) if ref.get("key") else ()
                yield Use(kind, ref["name"], bool(ref.get("optional")), container=name, keys=keys)  # type: ignore[arg-type]
    for source in container.get("envFrom") or []:
        for kind, field in (("configmap", "configMapRef"), ("secret", "secretRef")):
            ref = source.get(field) or {}
            if ref.get("name"):
                yield Use(kind, ref["name"], bool(ref.get("optional")), container=name)  # type: ignore[arg-type]


def uses(spec: dict[str, Any]) -> list[Use]:
    """Every ConfigMap and Secret reference of a pod spec, volumes first (the kubelet mounts
    them before it makes any container's environment)."""
    found = [u for volume in spec.get("volumes") or [] for u in _volume_uses(volume)]
    for group in ("initContainers", "containers"):
        found += [u for container in spec.get(group) or [] for u in _env_uses(container)]
    return found


def verdict(
    refs: list[Use], objects: dict[tuple[Kind, str], dict[str, Any] | None], *, namespace: str
) -> list[Missing]:
    """The references `objects` (kind and name -> the object, None when it does not exist)
    cannot serve: the object missing, or a key it lacks."""
    out: list[Missing] = []
    for use in refs:
        obj = objects.get((use.kind, use.name))
        if obj is None:
            out.append(Missing(use, None, namespace))
            continue
        if obj.get("unchecked"):
            continue
        present = set(obj.get("data") or {}) | set(obj.get("binaryData") or {})
        out += [Missing(use, key, namespace) for key in use.keys if key not in present]
    return out


def waiting_status(pod: Pod, missing: list[Missing]) -> PodStatus:
    """The kubelet's status of a pod held by mandatory references: Pending; a missing volume
    keeps every container ContainerCreating, else each container whose env lacks something
    waits with CreateContainerConfigError and the first thing it lacks."""
    volume_missing = any(m.use.volume for m in missing)
    statuses: list[ContainerStatus] = []
    for container in pod["spec"].get("containers") or []:
        name = container.get("name", "")
        waiting: dict[str, str] = {"reason": "ContainerCreating"}
        if not volume_missing:
            own = [m for m in missing if m.use.container == name]
            if own:
                waiting = {"reason": "CreateContainerConfigError", "message": own[0].message}
        statuses.append(
            {
                "name": name,
                "image": container.get("image", ""),
                "imageID": "",
                "ready": False,
                "started": False,
                "restartCount": 0,
                "state": {"waiting": waiting},
            }
        )
    return {"phase": "Pending", "containerStatuses": statuses}


def kubelet_event(missing: Missing) -> tuple[str, str]:
    """The kubelet's own Event for a missing mandatory reference: (reason, message)."""
    if missing.use.volume:
        return "FailedMount", f'MountVolume.SetUp failed for volume "{missing.use.volume}" : {missing.message}'
    return "Failed", f"Error: {missing.message}"


class ReferenceGate:
    """Holds back pods whose mandatory references are missing at the API (the front end)."""

    def __init__(
        self,
        client: KubeClient,
        events: EventRecorder,
        write_status: Callable[[Pod, PodStatus], Awaitable[None]],
        differs: Callable[[PodStatus, PodStatus], bool],
    ) -> None:
        self._client = client
        self._events = events
        self._write_status = write_status
        self._differs = differs
        self._objects: TTLCache[tuple[str, Kind, str], dict[str, Any] | None] = TTLCache(maxsize=4096, ttl=RECHECK)

    async def _object(self, namespace: str, kind: Kind, name: str) -> dict[str, Any] | None:
        cached = (namespace, kind, name)
        if cached in self._objects:
            return self._objects[cached]
        try:
            found: dict[str, Any] | None = await self._client.get(f"/api/v1/namespaces/{namespace}/{kind}s/{name}")
        except NotFound:
            found = None
        except Forbidden:
            # Not ours to read (the chart's rbac.secretNamespaces leaves other namespaces out):
            # the pod is not held for what cannot be checked; where it runs, a missing object
            # is that runtime's error.
            found = {"data": None, "unchecked": True}
        else:
            # Only what `verdict` reads: the values of Secrets are not kept in memory.
            assert found is not None
            found = {field: dict.fromkeys(found.get(field) or {}, "") for field in ("data", "binaryData")}
        self._objects[cached] = found
        return found

    async def hold(self, pod: Pod) -> bool:
        """Whether the pod must wait for a mandatory reference; if so its status and Events say
        why (Events repeat at most once a minute, as EventRecorder dedupes). Optional ones that
        are missing are told in a Normal Event and let the pod start."""
        refs = uses(pod["spec"])
        if not refs:
            return False
        namespace = pod["metadata"].get("namespace") or "default"
        objects = {(u.kind, u.name): await self._object(namespace, u.kind, u.name) for u in refs}
        missing = verdict(refs, objects, namespace=namespace)
        mandatory = [m for m in missing if not m.use.optional]
        if not mandatory:
            for m in missing:
                await self._events.emit(pod, reason=m.reason, message=m.message)
            return False
        status = waiting_status(pod, mandatory)
        if self._differs(pod.get("status", {}), status):
            await self._write_status(pod, status)
        for m in mandatory:
            reason, message = kubelet_event(m)
            await self._events.emit(pod, reason=reason, message=message, warning=True)
            await self._events.emit(pod, reason=m.reason, message=m.message, warning=True)
        return True
