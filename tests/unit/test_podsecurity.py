"""The Pod Security Standards checker (federation.podsecurity), table-tested: pods and the
fields each level refuses, for containers, init containers and ephemeral containers."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from federation import podsecurity
from federation.config import MemberConfig
from federation.members.objects import member_from_object
from federation.podsecurity import Level


def pod(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A plain pod (baseline admits it), with `spec` fields replaced."""
    body: dict[str, Any] = {
        "metadata": {"name": "p", "namespace": "ns", "annotations": annotations or {}},
        "spec": {"containers": [{"name": "main", "image": "app:1"}]},
    }
    body["spec"].update(spec)
    return body


HARDENED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}


def restricted_pod(**spec: Any) -> dict[str, Any]:
    """A pod restricted admits: non-root and RuntimeDefault for the pod, hardened containers."""
    body = pod(
        securityContext={"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        containers=[{"name": "main", "image": "app:1", "securityContext": copy.deepcopy(HARDENED)}],
        initContainers=[{"name": "init", "image": "app:1", "securityContext": copy.deepcopy(HARDENED)}],
        volumes=[
            {"name": "cfg", "configMap": {"name": "settings"}},
            {"name": "scratch", "emptyDir": {}},
            {"name": "token", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}},
        ],
    )
    body["spec"].update(spec)
    return body


def with_context(body: dict[str, Any], group: str, index: int, **context: Any) -> dict[str, Any]:
    """`body` with fields merged into one container's security context."""
    container = body["spec"][group][index]
    container.setdefault("securityContext", {}).update(context)
    return body


def paths(body: dict[str, Any], level: Level) -> list[str]:
    return [v.path for v in podsecurity.check(body, level)]


C0 = "spec.containers[0]"
I0 = "spec.initContainers[0]"
E0 = "spec.ephemeralContainers[0]"
EPHEMERAL = [{"name": "debug", "image": "busybox:1", "targetContainerName": "main"}]

# (case, pod, what baseline refuses); privileged refuses nothing.
BASELINE_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("plain pod", pod(), []),
    ("hostPath volume", pod(volumes=[{"name": "h", "hostPath": {"path": "/etc"}}]), ["spec.volumes[0].hostPath"]),
    (
        "hostPath behind an allowed volume",
        pod(volumes=[{"name": "e", "emptyDir": {}}, {"name": "h", "hostPath": {"path": "/"}}]),
        ["spec.volumes[1].hostPath"],
    ),
    ("hostNetwork", pod(hostNetwork=True), ["spec.hostNetwork"]),
    ("hostPID", pod(hostPID=True), ["spec.hostPID"]),
    ("hostIPC", pod(hostIPC=True), ["spec.hostIPC"]),
    ("host namespaces off", pod(hostNetwork=False, hostPID=False, hostIPC=False), []),
    (
        "privileged container",
        with_context(pod(), "containers", 0, privileged=True),
        [f"{C0}.securityContext.privileged"],
    ),
    (
        "privileged init container",
        with_context(pod(initContainers=[{"name": "i", "image": "x"}]), "initContainers", 0, privileged=True),
        [f"{I0}.securityContext.privileged"],
    ),
    (
        "privileged ephemeral container",
        with_context(pod(ephemeralContainers=copy.deepcopy(EPHEMERAL)), "ephemeralContainers", 0, privileged=True),
        [f"{E0}.securityContext.privileged"],
    ),
    ("privileged: false", with_context(pod(), "containers", 0, privileged=False), []),
    (
        "capability beyond the default set",
        with_context(pod(), "containers", 0, capabilities={"add": ["CHOWN", "SYS_ADMIN"]}),
        [f"{C0}.securityContext.capabilities.add"],
    ),
    (
        "NET_RAW is not in the default set",
        with_context(
            pod(ephemeralContainers=copy.deepcopy(EPHEMERAL)),
            "ephemeralContainers",
            0,
            capabilities={"add": ["NET_RAW"]},
        ),
        [f"{E0}.securityContext.capabilities.add"],
    ),
    ("default capabilities", with_context(pod(), "containers", 0, capabilities={"add": ["CHOWN", "KILL"]}), []),
    (
        "host port",
        pod(
            containers=[
                {"name": "m", "image": "x", "ports": [{"containerPort": 80}, {"containerPort": 81, "hostPort": 81}]}
            ]
        ),
        [f"{C0}.ports[1].hostPort"],
    ),
    ("host port 0", pod(containers=[{"name": "m", "image": "x", "ports": [{"containerPort": 80, "hostPort": 0}]}]), []),
    (
        "hostProcess (pod)",
        pod(securityContext={"windowsOptions": {"hostProcess": True}}),
        ["spec.securityContext.windowsOptions.hostProcess"],
    ),
    (
        "hostProcess (init container)",
        with_context(
            pod(initContainers=[{"name": "i", "image": "x"}]), "initContainers", 0, windowsOptions={"hostProcess": True}
        ),
        [f"{I0}.securityContext.windowsOptions.hostProcess"],
    ),
    (
        "probe aimed at another host",
        pod(containers=[{"name": "m", "image": "x", "livenessProbe": {"httpGet": {"host": "10.0.0.1", "port": 80}}}]),
        [f"{C0}.livenessProbe.httpGet.host"],
    ),
    (
        "hook aimed at another host",
        pod(
            initContainers=[
                {"name": "i", "image": "x", "lifecycle": {"preStop": {"tcpSocket": {"host": "db", "port": 5}}}}
            ]
        ),
        [f"{I0}.lifecycle.preStop.tcpSocket.host"],
    ),
    (
        "probe on the pod itself",
        pod(containers=[{"name": "m", "image": "x", "readinessProbe": {"httpGet": {"port": 8}}}]),
        [],
    ),
    (
        "AppArmor Unconfined",
        with_context(pod(), "containers", 0, appArmorProfile={"type": "Unconfined"}),
        [f"{C0}.securityContext.appArmorProfile.type"],
    ),
    (
        "AppArmor Localhost",
        pod(securityContext={"appArmorProfile": {"type": "Localhost", "localhostProfile": "p"}}),
        [],
    ),
    (
        "AppArmor annotation unconfined",
        pod(annotations={"container.apparmor.security.beta.kubernetes.io/main": "unconfined"}),
        ["metadata.annotations[container.apparmor.security.beta.kubernetes.io/main]"],
    ),
    (
        "AppArmor annotation localhost",
        pod(annotations={"container.apparmor.security.beta.kubernetes.io/main": "localhost/p"}),
        [],
    ),
    (
        "SELinux type",
        pod(securityContext={"seLinuxOptions": {"type": "spc_t"}}),
        ["spec.securityContext.seLinuxOptions.type"],
    ),
    (
        "SELinux user and role",
        with_context(pod(), "containers", 0, seLinuxOptions={"user": "system_u", "role": "system_r"}),
        [f"{C0}.securityContext.seLinuxOptions.user", f"{C0}.securityContext.seLinuxOptions.role"],
    ),
    (
        "SELinux container_t and level",
        pod(securityContext={"seLinuxOptions": {"type": "container_t", "level": "s0:c1"}}),
        [],
    ),
    (
        "/proc unmasked",
        with_context(pod(), "containers", 0, procMount="Unmasked"),
        [f"{C0}.securityContext.procMount"],
    ),
    ("/proc Default", with_context(pod(), "containers", 0, procMount="Default"), []),
    (
        "seccomp Unconfined (pod and container)",
        with_context(
            pod(securityContext={"seccompProfile": {"type": "Unconfined"}}),
            "containers",
            0,
            seccompProfile={"type": "Unconfined"},
        ),
        ["spec.securityContext.seccompProfile.type", f"{C0}.securityContext.seccompProfile.type"],
    ),
    (
        "unsafe sysctl",
        pod(
            securityContext={
                "sysctls": [{"name": "net.ipv4.tcp_syncookies", "value": "1"}, {"name": "kernel.msgmax", "value": "1"}]
            }
        ),
        ["spec.securityContext.sysctls[1].name"],
    ),
    (
        "several at once, pod fields first",
        with_context(
            pod(hostNetwork=True, volumes=[{"name": "h", "hostPath": {"path": "/"}}]), "containers", 0, privileged=True
        ),
        ["spec.hostNetwork", f"{C0}.securityContext.privileged", "spec.volumes[0].hostPath"],
    ),
]


@pytest.mark.parametrize(("case", "body", "refused"), BASELINE_CASES, ids=[c[0] for c in BASELINE_CASES])
def test_baseline(case: str, body: dict[str, Any], refused: list[str]) -> None:
    assert paths(body, "baseline") == refused
    assert paths(body, "privileged") == []
    # Restricted refuses everything baseline does (and more).
    assert set(refused) <= set(paths(body, "restricted"))


# (case, pod, what restricted refuses)
RESTRICTED_CASES: list[tuple[str, dict[str, Any], list[str]]] = [
    ("hardened pod", restricted_pod(), []),
    (
        "plain pod",
        pod(),
        [
            f"{C0}.securityContext.allowPrivilegeEscalation",
            f"{C0}.securityContext.runAsNonRoot",
            f"{C0}.securityContext.seccompProfile.type",
            f"{C0}.securityContext.capabilities.drop",
        ],
    ),
    (
        "NET_BIND_SERVICE added back",
        with_context(restricted_pod(), "containers", 0, capabilities={"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}),
        [],
    ),
    (
        "a default capability added",
        with_context(restricted_pod(), "containers", 0, capabilities={"drop": ["ALL"], "add": ["CHOWN"]}),
        [f"{C0}.securityContext.capabilities.add"],
    ),
    (
        "not all dropped (init container)",
        with_context(restricted_pod(), "initContainers", 0, capabilities={"drop": ["NET_RAW"]}),
        [f"{I0}.securityContext.capabilities.drop"],
    ),
    (
        "privilege escalation allowed",
        with_context(restricted_pod(), "containers", 0, allowPrivilegeEscalation=True),
        [f"{C0}.securityContext.allowPrivilegeEscalation"],
    ),
    (
        "ephemeral container not hardened",
        restricted_pod(ephemeralContainers=copy.deepcopy(EPHEMERAL)),
        [f"{E0}.securityContext.allowPrivilegeEscalation", f"{E0}.securityContext.capabilities.drop"],
    ),
    (
        "root by the pod",
        restricted_pod(securityContext={"runAsNonRoot": False, "seccompProfile": {"type": "RuntimeDefault"}}),
        [
            "spec.securityContext.runAsNonRoot",
            f"{C0}.securityContext.runAsNonRoot",
            f"{I0}.securityContext.runAsNonRoot",
        ],
    ),
    (
        "root allowed by one container",
        with_context(restricted_pod(), "initContainers", 0, runAsNonRoot=False),
        [f"{I0}.securityContext.runAsNonRoot"],
    ),
    (
        "non-root and seccomp per container",
        restricted_pod(
            securityContext={},
            containers=[
                {
                    "name": "m",
                    "image": "x",
                    "securityContext": {
                        **HARDENED,
                        "runAsNonRoot": True,
                        "seccompProfile": {"type": "Localhost", "localhostProfile": "p"},
                    },
                }
            ],
            initContainers=[],
        ),
        [],
    ),
    (
        "uid 0",
        with_context(
            restricted_pod(
                securityContext={"runAsNonRoot": True, "runAsUser": 0, "seccompProfile": {"type": "RuntimeDefault"}}
            ),
            "containers",
            0,
            runAsUser=0,
        ),
        ["spec.securityContext.runAsUser", f"{C0}.securityContext.runAsUser"],
    ),
    (
        "seccomp Unconfined in a container",
        with_context(restricted_pod(), "containers", 0, seccompProfile={"type": "Unconfined"}),
        [f"{C0}.securityContext.seccompProfile.type"],
    ),
    (
        "no seccomp for one container",
        restricted_pod(
            securityContext={"runAsNonRoot": True},
            containers=[
                {
                    "name": "m",
                    "image": "x",
                    "securityContext": {**HARDENED, "seccompProfile": {"type": "RuntimeDefault"}},
                }
            ],
            initContainers=[{"name": "i", "image": "x", "securityContext": dict(HARDENED)}],
        ),
        [f"{I0}.securityContext.seccompProfile.type"],
    ),
    (
        "volume types",
        restricted_pod(
            volumes=[
                {"name": "ok", "secret": {"secretName": "s"}},
                {"name": "n", "nfs": {"server": "x", "path": "/"}},
                {"name": "h", "hostPath": {"path": "/"}},
                {"name": "c", "csi": {"driver": "d"}},
                {"name": "p", "persistentVolumeClaim": {"claimName": "data"}},
            ]
        ),
        ["spec.volumes[1].nfs", "spec.volumes[2].hostPath"],
    ),
    (
        "Windows: the Linux-only controls do not apply",
        restricted_pod(
            os={"name": "windows"},
            securityContext={"runAsNonRoot": True},
            containers=[{"name": "m", "image": "x"}],
            initContainers=[],
        ),
        [],
    ),
    (
        "Windows: non-root and baseline still apply",
        restricted_pod(
            os={"name": "windows"},
            securityContext={},
            hostNetwork=True,
            containers=[{"name": "m", "image": "x"}],
            initContainers=[],
        ),
        ["spec.hostNetwork", f"{C0}.securityContext.runAsNonRoot"],
    ),
]


@pytest.mark.parametrize(("case", "body", "refused"), RESTRICTED_CASES, ids=[c[0] for c in RESTRICTED_CASES])
def test_restricted(case: str, body: dict[str, Any], refused: list[str]) -> None:
    assert paths(body, "restricted") == refused


def test_levels_are_cumulative_and_needed_is_the_strictest_that_admits() -> None:
    assert podsecurity.needed(restricted_pod()) == "restricted"
    assert podsecurity.needed(pod()) == "baseline"
    assert podsecurity.needed(pod(hostPID=True)) == "privileged"
    assert podsecurity.admits("privileged", "privileged")
    assert podsecurity.admits("baseline", "restricted")
    assert not podsecurity.admits("baseline", "privileged")
    assert not podsecurity.admits("restricted", "baseline")
    for case, body, _ in BASELINE_CASES + RESTRICTED_CASES:
        needs = podsecurity.needed(body)
        for level in podsecurity.LEVELS:
            assert podsecurity.admits(level, needs) == (not podsecurity.check(body, level)), (case, level)


def test_a_pod_without_a_spec_or_with_odd_values_does_not_break_the_checker() -> None:
    assert podsecurity.check({"metadata": {}}, "baseline") == []
    odd = {"metadata": {"annotations": None}, "spec": {"containers": None, "volumes": [None], "securityContext": None}}
    assert podsecurity.check(odd, "baseline") == []
    assert paths(odd, "restricted") == ["spec.volumes[0]"]


def test_namespace_labels_and_messages() -> None:
    assert podsecurity.namespace_labels("restricted") == {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
        "pod-security.kubernetes.io/warn": "restricted",
        "pod-security.kubernetes.io/warn-version": "latest",
        "pod-security.kubernetes.io/audit": "restricted",
        "pod-security.kubernetes.io/audit-version": "latest",
    }
    found = podsecurity.check(
        pod(hostNetwork=True, hostPID=True, hostIPC=True, volumes=[{"name": "h", "hostPath": {"path": "/"}}]),
        "baseline",
    )
    assert podsecurity.describe(found[:1]) == "spec.hostNetwork (shares the node's namespace)"
    assert podsecurity.describe(found, limit=2) == (
        "spec.hostNetwork (shares the node's namespace), spec.hostPID (shares the node's namespace) and 2 more"
    )


def test_member_objects_and_settings_carry_the_level() -> None:
    assert MemberConfig(name="m").pod_security == "baseline"
    assert MemberConfig.model_validate({"name": "m", "pod_security": "restricted"}).pod_security == "restricted"
    with pytest.raises(ValueError, match="podSecurity"):
        MemberConfig.model_validate({"name": "m", "podSecurity": "open"})
    spec = {"kubeconfigSecretRef": {"namespace": "s", "name": "k"}, "podSecurity": "privileged"}
    assert member_from_object({"metadata": {"name": "m"}, "spec": spec}).pod_security == "privileged"
    assert member_from_object({"metadata": {"name": "m"}, "spec": {}}).pod_security == "baseline"
