"""TypedDicts for the API objects the runtime handles on hot paths.

They describe the raw JSON as decoded, not a model: only the fields the runtime reads are
spelled out, and every dict stays a plain dict at run time.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict, TypeVar, cast

import orjson

_T = TypeVar("_T")


class ObjectMeta(TypedDict, total=False):
    name: str
    namespace: str
    uid: str
    resourceVersion: str
    generation: int
    creationTimestamp: str
    deletionTimestamp: str
    deletionGracePeriodSeconds: int
    labels: dict[str, str]
    annotations: dict[str, str]
    ownerReferences: list[dict[str, Any]]
    finalizers: list[str]


class ContainerStatus(TypedDict, total=False):
    name: str
    image: str
    imageID: str
    containerID: str
    ready: bool
    started: bool
    restartCount: int
    state: dict[str, Any]
    lastState: dict[str, Any]


class PodCondition(TypedDict, total=False):
    type: str
    status: str
    reason: str
    message: str
    lastTransitionTime: str
    lastProbeTime: str | None


class PodStatus(TypedDict, total=False):
    phase: str
    reason: str
    message: str
    conditions: list[PodCondition]
    containerStatuses: list[ContainerStatus]
    initContainerStatuses: list[ContainerStatus]
    podIP: str
    podIPs: list[dict[str, str]]
    hostIP: str
    hostIPs: list[dict[str, str]]
    startTime: str
    qosClass: str


class Pod(TypedDict):
    apiVersion: NotRequired[str]
    kind: NotRequired[str]
    metadata: ObjectMeta
    spec: dict[str, Any]
    status: NotRequired[PodStatus]


def pod_key(pod: Pod) -> str:
    """`namespace/name`: the work-queue key of a pod."""
    meta = pod["metadata"]
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def split_key(key: str) -> tuple[str, str]:
    namespace, _, name = key.partition("/")
    return namespace, name


def clone(obj: _T) -> _T:
    """A deep copy of decoded JSON (dicts, lists, strings, numbers): a round trip through orjson,
    several times cheaper than copy.deepcopy on the pod-sized objects of the hot paths."""
    return cast(_T, orjson.loads(orjson.dumps(obj)))


#: Exists in every namespace of every cluster (published by the root CA publisher): never
#: anyone's to copy or to wait for.
EVERYWHERE_CONFIGMAPS = frozenset({"kube-root-ca.crt"})


def references(spec: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(ConfigMap names, Secret names) a pod spec refers to, in its volumes (projected ones
    too), its containers' env and envFrom, and its image pull secrets: what must exist in the
    pod's namespace before it can start. ConfigMaps every namespace has are left out."""
    configmaps: set[str] = set()
    secrets: set[str] = set()
    for volume in spec.get("volumes") or []:
        if volume.get("configMap", {}).get("name"):
            configmaps.add(volume["configMap"]["name"])
        if volume.get("secret", {}).get("secretName"):
            secrets.add(volume["secret"]["secretName"])
        for source in (volume.get("projected") or {}).get("sources") or []:
            if source.get("configMap", {}).get("name"):
                configmaps.add(source["configMap"]["name"])
            if source.get("secret", {}).get("name"):
                secrets.add(source["secret"]["name"])
    for group in ("containers", "initContainers"):
        for container in spec.get(group) or []:
            for env in container.get("env") or []:
                ref = env.get("valueFrom") or {}
                if ref.get("configMapKeyRef", {}).get("name"):
                    configmaps.add(ref["configMapKeyRef"]["name"])
                if ref.get("secretKeyRef", {}).get("name"):
                    secrets.add(ref["secretKeyRef"]["name"])
            for source in container.get("envFrom") or []:
                if source.get("configMapRef", {}).get("name"):
                    configmaps.add(source["configMapRef"]["name"])
                if source.get("secretRef", {}).get("name"):
                    secrets.add(source["secretRef"]["name"])
    for pull in spec.get("imagePullSecrets") or []:
        if pull.get("name"):
            secrets.add(pull["name"])
    return configmaps - EVERYWHERE_CONFIGMAPS, secrets
