"""Pod security at the member boundary (pure): whether a pod may run at a member's level, and
which fields say no.

Each member has a level of the Kubernetes Pod Security Standards (the "latest" version):
`privileged` (anything), `baseline` (the default: no known privilege escalation, so no host
namespaces, hostPath volumes, privileged containers and the like) or `restricted` (baseline
plus hardening: allowed volume types, no privilege escalation, non-root, seccomp, capabilities
dropped). Levels are cumulative: a pod `restricted` admits is admitted by `baseline`, and one
`baseline` admits by `privileged`. The dispatcher checks every pod here before it goes to a
member, and the member namespaces we create carry the Pod Security Admission labels of the
same level, so the member enforces it too.

Violations name the field as the pod spells it (`spec.volumes[0].hostPath`,
`spec.containers[1].securityContext.privileged`), in a fixed order: pod-level fields first,
then containers, init containers and ephemeral containers.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, cast

from cachetools import TTLCache

Level = Literal["privileged", "baseline", "restricted"]
LEVELS: tuple[Level, ...] = ("privileged", "baseline", "restricted")  # from most to least permissive
DEFAULT: Level = "baseline"
#: The pod reason (and Event reason) of a pod no member may run.
REASON = "ForbiddenByMemberPolicy"

LABEL_PREFIX = "pod-security.kubernetes.io/"
MODES = ("enforce", "warn", "audit")

CONTAINER_GROUPS = ("containers", "initContainers", "ephemeralContainers")
HOST_NAMESPACES = ("hostNetwork", "hostPID", "hostIPC")
#: Capabilities baseline lets a container add (the container runtimes' default set).
BASELINE_CAPABILITIES = frozenset(
    {
        "AUDIT_WRITE",
        "CHOWN",
        "DAC_OVERRIDE",
        "FOWNER",
        "FSETID",
        "KILL",
        "MKNOD",
        "NET_BIND_SERVICE",
        "SETFCAP",
        "SETGID",
        "SETPCAP",
        "SETUID",
        "SYS_CHROOT",
    }
)
RESTRICTED_CAPABILITIES = frozenset({"NET_BIND_SERVICE"})
#: Namespaced sysctls, isolated from other pods and the node.
SAFE_SYSCTLS = frozenset(
    {
        "kernel.shm_rmid_forced",
        "net.ipv4.ip_local_port_range",
        "net.ipv4.ip_unprivileged_port_start",
        "net.ipv4.tcp_syncookies",
        "net.ipv4.ping_group_range",
        "net.ipv4.ip_local_reserved_ports",
        "net.ipv4.tcp_keepalive_time",
        "net.ipv4.tcp_fin_timeout",
        "net.ipv4.tcp_keepalive_intvl",
        "net.ipv4.tcp_keepalive_probes",
    }
)
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})
APPARMOR_TYPES = frozenset({"RuntimeDefault", "Localhost"})
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/"
SECCOMP_TYPES = frozenset({"RuntimeDefault", "Localhost"})
#: The only volume sources restricted allows.
RESTRICTED_VOLUMES = frozenset(
    {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}
)
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")
HOOKS = ("postStart", "preStop")
#: Tolerations every pod may carry into a tenant's fence: the ones Kubernetes itself adds to
#: every pod (DefaultTolerationSeconds admission), which only bound how long it stays on a failed node.
LIFECYCLE_TOLERATIONS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")


@dataclass(frozen=True)
class Violation:
    path: str  # the field, as the pod spells it
    detail: str  # what is wrong with it

    def __str__(self) -> str:
        return f"{self.path} ({self.detail})"


def namespace_labels(level: Level) -> dict[str, str]:
    """The Pod Security Admission labels of a member namespace at `level`."""
    out: dict[str, str] = {}
    for mode in MODES:
        out[f"{LABEL_PREFIX}{mode}"] = level
        out[f"{LABEL_PREFIX}{mode}-version"] = "latest"
    return out


def _map(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _containers(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for group in CONTAINER_GROUPS:
        for i, container in enumerate(spec.get(group) or []):
            yield f"spec.{group}[{i}]", _map(container)


def _contexts(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The pod's security context, then each container's, with their paths."""
    yield "spec.securityContext", _map(spec.get("securityContext"))
    for path, container in _containers(spec):
        yield f"{path}.securityContext", _map(container.get("securityContext"))


def _baseline(pod: Mapping[str, object], *, restricted: bool) -> Iterator[Violation]:
    """Baseline's controls; `restricted` leaves out those restricted replaces by stricter ones
    (volume types, seccomp and capabilities on Linux)."""
    spec = _map(pod.get("spec"))
    linux_restricted = restricted and not _windows(spec)
    for path, context in _contexts(spec):
        if _map(context.get("windowsOptions")).get("hostProcess") is True:
            yield Violation(f"{path}.windowsOptions.hostProcess", "host process")
    for name in HOST_NAMESPACES:
        if spec.get(name) is True:
            yield Violation(f"spec.{name}", "shares the node's namespace")
    for path, container in _containers(spec):
        if _map(container.get("securityContext")).get("privileged") is True:
            yield Violation(f"{path}.securityContext.privileged", "privileged container")
    if not linux_restricted:
        yield from _capabilities_added(spec, BASELINE_CAPABILITIES)
    if not restricted:
        for i, volume in enumerate(spec.get("volumes") or []):
            if _map(volume).get("hostPath") is not None:
                yield Violation(f"spec.volumes[{i}].hostPath", "hostPath volume")
    for path, container in _containers(spec):
        for j, port in enumerate(container.get("ports") or []):
            if _map(port).get("hostPort"):
                yield Violation(f"{path}.ports[{j}].hostPort", "host port")
    for path, container in _containers(spec):
        yield from _host_handlers(path, container)
    for path, context in _contexts(spec):
        kind = _map(context.get("appArmorProfile")).get("type")
        if kind is not None and kind not in APPARMOR_TYPES:
            yield Violation(f"{path}.appArmorProfile.type", f"AppArmor profile {kind}")
    annotations = _map(_map(pod.get("metadata")).get("annotations"))
    for key, value in sorted(annotations.items()):
        allowed = not value or value == "runtime/default" or str(value).startswith("localhost/")
        if key.startswith(APPARMOR_ANNOTATION) and not allowed:
            yield Violation(f"metadata.annotations[{key}]", f"AppArmor profile {value}")
    for path, context in _contexts(spec):
        options = _map(context.get("seLinuxOptions"))
        if (options.get("type") or "") not in SELINUX_TYPES:
            yield Violation(f"{path}.seLinuxOptions.type", f"SELinux type {options['type']}")
        for field in ("user", "role"):
            if options.get(field):
                yield Violation(f"{path}.seLinuxOptions.{field}", f"SELinux {field}")
    for path, container in _containers(spec):
        mount = _map(container.get("securityContext")).get("procMount")
        if mount not in (None, "Default"):
            yield Violation(f"{path}.securityContext.procMount", f"/proc mount {mount}")
    if not linux_restricted:
        for path, context in _contexts(spec):
            if _map(context.get("seccompProfile")).get("type") == "Unconfined":
                yield Violation(f"{path}.seccompProfile.type", "seccomp Unconfined")
    sysctls = _map(spec.get("securityContext")).get("sysctls") or []
    for i, sysctl in enumerate(sysctls):
        sysctl_name = _map(sysctl).get("name")
        if sysctl_name not in SAFE_SYSCTLS:
            yield Violation(f"spec.securityContext.sysctls[{i}].name", f"unsafe sysctl {sysctl_name}")


def _host_handlers(path: str, container: dict[str, Any]) -> Iterator[Violation]:
    """Probes and lifecycle hooks aimed at another host."""
    handlers = [(probe, _map(container.get(probe))) for probe in PROBES]
    lifecycle = _map(container.get("lifecycle"))
    handlers += [(f"lifecycle.{hook}", _map(lifecycle.get(hook))) for hook in HOOKS]
    for where, handler in handlers:
        for action in ("httpGet", "tcpSocket"):
            if _map(handler.get(action)).get("host"):
                yield Violation(f"{path}.{where}.{action}.host", "probe or hook aimed at another host")


def _capabilities_added(spec: dict[str, Any], allowed: frozenset[str]) -> Iterator[Violation]:
    for path, container in _containers(spec):
        added = _map(_map(container.get("securityContext")).get("capabilities")).get("add") or []
        extra = [str(c) for c in added if c not in allowed]
        if extra:
            yield Violation(f"{path}.securityContext.capabilities.add", f"adds {', '.join(extra)}")


def _windows(spec: dict[str, Any]) -> bool:
    return _map(spec.get("os")).get("name") == "windows"


def _restricted(pod: Mapping[str, object]) -> Iterator[Violation]:
    """Restricted's controls beyond baseline."""
    spec = _map(pod.get("spec"))
    for i, volume in enumerate(spec.get("volumes") or []):
        sources = [k for k, v in _map(volume).items() if k != "name" and v is not None]
        if not any(k in RESTRICTED_VOLUMES for k in sources):
            kind = sources[0] if sources else ""
            yield Violation(f"spec.volumes[{i}].{kind}" if kind else f"spec.volumes[{i}]", f"{kind or 'no'} volume")
    pod_context = _map(spec.get("securityContext"))
    linux = not _windows(spec)
    if linux:
        for path, container in _containers(spec):
            if _map(container.get("securityContext")).get("allowPrivilegeEscalation") is not False:
                yield Violation(f"{path}.securityContext.allowPrivilegeEscalation", "must be false")
    pod_non_root = pod_context.get("runAsNonRoot")
    if pod_non_root is False:
        yield Violation("spec.securityContext.runAsNonRoot", "must be true")
    for path, container in _containers(spec):
        own = _map(container.get("securityContext")).get("runAsNonRoot")
        if own is False or (own is None and pod_non_root is not True):
            yield Violation(f"{path}.securityContext.runAsNonRoot", "must be true, here or for the pod")
    for path, context in _contexts(spec):
        if context.get("runAsUser") == 0:
            yield Violation(f"{path}.runAsUser", "runs as root")
    if linux:
        pod_seccomp = _map(pod_context.get("seccompProfile")).get("type")
        if pod_seccomp is not None and pod_seccomp not in SECCOMP_TYPES:
            yield Violation("spec.securityContext.seccompProfile.type", f"seccomp {pod_seccomp}")
        for path, container in _containers(spec):
            own = _map(_map(container.get("securityContext")).get("seccompProfile")).get("type")
            if own is None and pod_seccomp not in SECCOMP_TYPES:
                yield Violation(
                    f"{path}.securityContext.seccompProfile.type",
                    "must be RuntimeDefault or Localhost, here or for the pod",
                )
            elif own is not None and own not in SECCOMP_TYPES:
                yield Violation(f"{path}.securityContext.seccompProfile.type", f"seccomp {own}")
        for path, container in _containers(spec):
            dropped = _map(_map(container.get("securityContext")).get("capabilities")).get("drop") or []
            if "ALL" not in dropped:
                yield Violation(f"{path}.securityContext.capabilities.drop", "must include ALL")
        yield from _capabilities_added(spec, RESTRICTED_CAPABILITIES)


def check(pod: Mapping[str, object], level: Level) -> list[Violation]:
    """What keeps `pod` from running at `level`; empty when it may."""
    if level == "privileged":
        return []
    found = list(_baseline(pod, restricted=level == "restricted"))
    if level == "restricted":
        found += _restricted(pod)
    return found


def needed(pod: Mapping[str, object]) -> Level:
    """The strictest level that admits the pod."""
    if not check(pod, "restricted"):
        return "restricted"
    if not check(pod, "baseline"):
        return "baseline"
    return "privileged"


class NeededLevels:
    """`needed` worked out once per pod (by UID): what pod security judges (security contexts,
    volumes, host namespaces) cannot change after creation, and a dispatch asks 4-5 times."""

    def __init__(self) -> None:
        self._by_uid: TTLCache[str, Level] = TTLCache(maxsize=100_000, ttl=3600)

    def __call__(self, pod: Mapping[str, object]) -> Level:
        uid = str(cast(Mapping[str, object], pod.get("metadata") or {}).get("uid") or "")
        level = self._by_uid.get(uid) if uid else None
        if level is None:
            level = needed(pod)
            if uid:
                self._by_uid[uid] = level
        return level


def admits(level: Level, needs: Level) -> bool:
    """Whether a member at `level` admits a pod that needs `needs` (levels are cumulative)."""
    return LEVELS.index(level) <= LEVELS.index(needs)


def describe(violations: list[Violation], *, limit: int = 4) -> str:
    """The first violations, for a pod's message."""
    shown = ", ".join(str(v) for v in violations[:limit])
    more = len(violations) - limit
    return f"{shown} and {more} more" if more > 0 else shown


def fence(pod: Mapping[str, object], tolerations: Collection[str], *, ignored: Collection[str] = ()) -> list[Violation]:
    """What keeps `pod` out of a tenant's fence in a member (federation.tenancy.policy, which the
    member enforces too): a toleration whose key is neither `tolerations` nor a lifecycle one
    (`ignored`: keys taken off before the pod is sent), a hostPort. Empty when it may go."""
    spec = _map(pod.get("spec"))
    allowed = {*tolerations, *LIFECYCLE_TOLERATIONS, *ignored}
    found = [
        Violation(f"spec.tolerations[{i}].key", f"{t.get('key') or 'every taint'} is not allowed")
        for i, t in enumerate(spec.get("tolerations") or [])
        if (t.get("key") or "") not in allowed
    ]
    for path, container in _containers(spec):
        for i, port in enumerate(container.get("ports") or []):
            if port.get("hostPort"):
                found.append(Violation(f"{path}.ports[{i}].hostPort", "not allowed"))
    return found


def refusal(
    pod: Mapping[str, object],
    levels: Mapping[str, Level],
    needs: Level,
    *,
    pinned: str | None,
    fences: Mapping[str, list[Violation]] | None = None,
) -> str | None:
    """Why the pod may go to none of `levels` (member -> level; just its job's member when
    `pinned`) by their pod security, or by their tenant fence (`fences`: member -> what keeps
    the pod out), for its Failed message; None when some member admits it."""
    fences = fences or {}
    if not levels or any(admits(level, needs) and not fences.get(n) for n, level in levels.items()):
        return None
    if pinned:
        if fences.get(pinned):
            return f"the tenant fence of member {pinned}, where its job runs, forbids {describe(fences[pinned])}"
        found = describe(check(pod, levels[pinned]))
        return f"pod security of member {pinned} ({levels[pinned]}), where its job runs, forbids {found}"
    parts = []
    for level in LEVELS:
        at = [n for n, lv in levels.items() if lv == level and not admits(lv, needs)]
        if at:
            verb = "forbids" if len(at) == 1 else "forbid"
            parts.append(f"{', '.join(at)} ({level}) {verb} {describe(check(pod, level))}")
    for n, violations in sorted(fences.items()):
        if violations and admits(levels.get(n, "privileged"), needs):
            parts.append(f"{n} (tenant fence) forbids {describe(violations)}")
    return f"no member's pod security admits the pod: {'; '.join(parts)}"


def refusing(levels: Mapping[str, Level], needs: set[Level]) -> set[str]:
    """The members whose level refuses some of the pods that need `needs` (placement skips them)."""
    return {n for n, level in levels.items() if not all(admits(level, x) for x in needs)}
