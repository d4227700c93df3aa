"""One pod's container run on this host from an unpacked image, with what a kubelet gives it.

Given a pod (an object from the apiserver, or a pod template as `helm template` renders it) and
the image its container names (e2e.image.unpack), it starts the container in a sandbox
(e2e.image.sandbox) the way a kubelet and its runtime would:

- the command: the image's Entrypoint and Cmd, replaced by the container's `command` (both) or
  `args` (Cmd only), `$(VAR)` references expanded from the container's environment;
- the environment: the image's, then the `kubernetes` Service's (KUBERNETES_SERVICE_HOST/PORT:
  the lab's front-end apiserver, whose serving certificate names 127.0.0.1), then `envFrom` and
  `env` as rendered, `valueFrom` resolved (fieldRef, configMapKeyRef, secretKeyRef);
- the volumes at their mount paths: ConfigMap, Secret, projected and downwardAPI volumes written
  as files (items, modes), emptyDir as a directory or, with medium Memory, a tmpfs of its
  sizeLimit; the ServiceAccount token the ServiceAccount admission plugin would mount (unless
  automountServiceAccountToken is false), got by TokenRequest (bound to the pod when it has a
  UID), with ca.crt and namespace, at /var/run/secrets/kubernetes.io/serviceaccount;
- the security context (container over pod): runAsUser, runAsGroup, fsGroup and
  supplementalGroups, runAsNonRoot checked, readOnlyRootFilesystem, allowPrivilegeEscalation;
- the pod's hostname, /etc/hosts and the host's /etc/resolv.conf.

The network is the host's (the lab's apiservers listen on its loopback), so the pod's IP is
127.0.0.1 and its ports are the host's: a test picks free ones through the chart's values.
Tokens are not renewed (they last an hour; a test lasts minutes). What cannot be given (a volume
kind, a second container, resourceFieldRef) raises PodRunError before anything starts, as a
kubelet's CreateContainerConfigError.

Stopping is a kubelet's: SIGTERM to the container's first process, SIGKILL after the grace
period (the pod's terminationGracePeriodSeconds unless told), the whole sandbox then gone.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e.image import sandbox
from e2e.image.unpack import Unpacked
from vkprovider.kube import KubeClient, NotFound

SERVICE_ACCOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
#: What the ServiceAccount admission plugin projects there (kube-api-access-*).
TOKEN_SECONDS = 3607
DEFAULT_GRACE = 30
_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class PodRunError(Exception):
    """The pod cannot be run as specified (what a kubelet reports as CreateContainerConfigError)."""


@dataclass(frozen=True, kw_only=True)
class Host:
    """What the node gives every pod: the apiserver the `kubernetes` Service leads to, and the
    pod's address (the host's network)."""

    service_host: str
    service_port: int
    pod_ip: str = "127.0.0.1"

    @classmethod
    def for_server(cls, server: str) -> Host:
        """The Host of a pod whose cluster's apiserver is at the URL `server`."""
        hostport = server.removeprefix("https://").rstrip("/")
        address, _, port = hostport.rpartition(":")
        return cls(service_host=address.strip("[]"), service_port=int(port))


# -- pure: what the pod's spec says ----------------------------------------------------------------


def argv(image: Mapping[str, Any], container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The command line as Kubernetes defines it from the image's Entrypoint and Cmd and the
    container's command and args."""
    if container.get("command"):
        words = [*container["command"], *(container.get("args") or [])]
    elif container.get("args"):
        words = [*(image.get("Entrypoint") or []), *container["args"]]
    else:
        words = [*(image.get("Entrypoint") or []), *(image.get("Cmd") or [])]
    if not words:
        raise PodRunError("no command: neither the container nor the image names one")
    return [expand(w, env) for w in words]


def expand(text: str, env: Mapping[str, str]) -> str:
    """`$(NAME)` replaced by NAME's value when defined (left as it is when not), `$$` by `$`."""

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _REFERENCE.sub(one, text)


def quantity_bytes(quantity: str | int) -> int:
    """A Kubernetes memory quantity (16Mi, 1G, 1048576) in bytes."""
    text = str(quantity)
    for suffix, factor in _UNITS.items():
        if text.endswith(suffix):
            return int(float(text[: -len(suffix)]) * factor)
    return int(float(text))


@dataclass(frozen=True)
class Identity:
    uid: int
    gid: int
    groups: tuple[int, ...]
    read_only_root: bool
    no_new_privileges: bool


def identity(pod: Mapping[str, Any], container: Mapping[str, Any], image: Mapping[str, Any]) -> Identity:
    """Who the container runs as: the container's securityContext over the pod's over the
    image's User (numeric, `uid[:gid]`); runAsNonRoot refused for UID 0."""
    pod_context = (pod.get("spec") or {}).get("securityContext") or {}
    own = container.get("securityContext") or {}
    image_uid, _, image_gid = str(image.get("User") or "0").partition(":")
    if not image_uid.isdigit() or not (image_gid or "0").isdigit():
        raise PodRunError(f"image user {image.get('User')!r}: only numeric users are run here")

    def pick(key: str, default: Any) -> Any:
        return own.get(key, pod_context.get(key, default))

    uid = int(pick("runAsUser", int(image_uid)))
    gid = int(pick("runAsGroup", int(image_gid or 0)))
    if pick("runAsNonRoot", False) and uid == 0:
        raise PodRunError("container has runAsNonRoot and would run as root (UID 0)")
    groups = [int(g) for g in pod_context.get("supplementalGroups") or []]
    if pod_context.get("fsGroup") is not None:
        groups.insert(0, int(pod_context["fsGroup"]))
    return Identity(
        uid=uid,
        gid=gid,
        groups=tuple(dict.fromkeys(groups)),
        read_only_root=bool(own.get("readOnlyRootFilesystem", False)),
        # Kubernetes' default is true; it is false only when asked.
        no_new_privileges=own.get("allowPrivilegeEscalation") is False,
    )


def field_value(pod: Mapping[str, Any], path: str, host: Host) -> str:
    """A downward API fieldRef's value, as the kubelet resolves it when the container starts."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    labels = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if labels:
        return str((meta.get(labels.group(1)) or {}).get(labels.group(2), ""))
    values = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": host.pod_ip,
        "status.podIPs": host.pod_ip,
        "status.hostIP": host.pod_ip,
        "status.hostIPs": host.pod_ip,
    }
    if path not in values:
        raise PodRunError(f"fieldRef {path}: not one a kubelet resolves")
    return str(values[path])


def service_account_volume() -> tuple[dict[str, Any], dict[str, Any]]:
    """The volume and mount the ServiceAccount admission plugin adds to a pod (kube-api-access)."""
    volume = {
        "name": "kube-api-access",
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": TOKEN_SECONDS, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}},
            ],
        },
    }
    return volume, {"name": "kube-api-access", "mountPath": SERVICE_ACCOUNT_PATH, "readOnly": True}


# -- I/O: the objects a pod refers to, written where the container finds them ----------------------


@dataclass
class _Files:
    """A volume's files as a kubelet writes them: path in the volume -> (content, mode)."""

    files: dict[str, tuple[bytes, int]] = field(default_factory=dict)

    def add(self, path: str, content: bytes, mode: int) -> None:
        if path.startswith("/") or ".." in path.split("/"):
            raise PodRunError(f"volume item path {path!r}: must be relative, without '..'")
        self.files[path] = (content, mode)

    def write(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o755)
        for path, (content, mode) in self.files.items():
            target = directory / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            target.chmod(mode)


class _Sources:
    """Reads a pod's ConfigMaps, Secrets and ServiceAccount tokens from its namespace."""

    def __init__(self, client: KubeClient, pod: Mapping[str, Any]) -> None:
        self.client, self.pod = client, pod
        self.namespace = pod["metadata"]["namespace"]

    async def data(self, kind: str, name: str, *, optional: bool) -> dict[str, bytes] | None:
        """A ConfigMap's or Secret's keys (None if it is missing and optional)."""
        plural = "configmaps" if kind == "configMap" else "secrets"
        try:
            obj = await self.client.get(f"/api/v1/namespaces/{self.namespace}/{plural}/{name}")
        except NotFound:
            if optional:
                return None
            raise PodRunError(f"{kind} {self.namespace}/{name} not found") from None
        if plural == "secrets":
            return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
        out = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
        out.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
        return out

    async def account(self) -> dict[str, Any]:
        name = self.pod["spec"].get("serviceAccountName") or "default"
        try:
            return await self.client.get(f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{name}")
        except NotFound:
            raise PodRunError(f"ServiceAccount {self.namespace}/{name} not found") from None

    async def token(self, source: Mapping[str, Any]) -> bytes:
        account = self.pod["spec"].get("serviceAccountName") or "default"
        spec: dict[str, Any] = {"expirationSeconds": int(source.get("expirationSeconds", TOKEN_SECONDS))}
        if source.get("audience"):
            spec["audiences"] = [source["audience"]]
        meta = self.pod["metadata"]
        if meta.get("uid"):
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
        answer = await self.client.create(
            f"/api/v1/namespaces/{self.namespace}/serviceaccounts/{account}/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec},
        )
        return str(answer["status"]["token"]).encode()


async def _keyed(sources: _Sources, files: _Files, kind: str, ref: Mapping[str, Any], default_mode: int) -> None:
    """A ConfigMap's or Secret's keys as files: all, or the items named (path, mode)."""
    name = ref.get("name") if kind == "configMap" else ref.get("secretName", ref.get("name"))
    data = await sources.data(kind, str(name), optional=bool(ref.get("optional")))
    if data is None:
        return
    mode = int(ref.get("defaultMode", default_mode))
    items = ref.get("items")
    if not items:
        for key, value in data.items():
            files.add(key, value, mode)
        return
    for item in items:
        if item["key"] not in data:
            if ref.get("optional"):
                continue
            raise PodRunError(f"{kind} {name} has no key {item['key']!r}")
        files.add(item["path"], data[item["key"]], int(item.get("mode", mode)))


async def _volume_files(sources: _Sources, volume: Mapping[str, Any], host: Host) -> _Files:
    files = _Files()
    if "configMap" in volume:
        await _keyed(sources, files, "configMap", volume["configMap"], 0o644)
    elif "secret" in volume:
        await _keyed(sources, files, "secret", volume["secret"], 0o644)
    elif "downwardAPI" in volume:
        mode = int(volume["downwardAPI"].get("defaultMode", 0o644))
        for item in volume["downwardAPI"].get("items") or []:
            value = field_value(sources.pod, item["fieldRef"]["fieldPath"], host)
            files.add(item["path"], value.encode(), int(item.get("mode", mode)))
    elif "projected" in volume:
        mode = int(volume["projected"].get("defaultMode", 0o644))
        for source in volume["projected"].get("sources") or []:
            if "serviceAccountToken" in source:
                files.add(
                    source["serviceAccountToken"]["path"], await sources.token(source["serviceAccountToken"]), mode
                )
            elif "configMap" in source or "secret" in source:
                kind = "configMap" if "configMap" in source else "secret"
                await _keyed(sources, files, kind, {"defaultMode": mode, **source[kind]}, mode)
            elif "downwardAPI" in source:
                for item in source["downwardAPI"].get("items") or []:
                    value = field_value(sources.pod, item["fieldRef"]["fieldPath"], host)
                    files.add(item["path"], value.encode(), int(item.get("mode", mode)))
            else:
                raise PodRunError(f"projected source {sorted(source)}: not run here")
    return files


async def _environment(
    sources: _Sources, container: Mapping[str, Any], image: Mapping[str, Any], host: Host
) -> dict[str, str]:
    """The image's environment, then the `kubernetes` Service's, then envFrom, then env: later
    ones win, and `$(VAR)` in a value refers to those defined before it."""
    env = dict(item.split("=", 1) for item in image.get("Env") or [])
    port = str(host.service_port)
    env.update(
        KUBERNETES_SERVICE_HOST=host.service_host,
        KUBERNETES_SERVICE_PORT=port,
        KUBERNETES_SERVICE_PORT_HTTPS=port,
        KUBERNETES_PORT=f"tcp://{host.service_host}:{port}",
        HOSTNAME=sources.pod["metadata"]["name"][:63],
    )
    for source in container.get("envFrom") or []:
        kind = "configMap" if "configMapRef" in source else "secret"
        ref = source.get("configMapRef") or source.get("secretRef") or {}
        data = await sources.data(kind, ref["name"], optional=bool(ref.get("optional")))
        for key, value in (data or {}).items():
            env[source.get("prefix", "") + key] = value.decode()
    for var in container.get("env") or []:
        if "valueFrom" not in var:
            env[var["name"]] = expand(str(var.get("value", "")), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[var["name"]] = field_value(sources.pod, source["fieldRef"]["fieldPath"], host)
        elif "configMapKeyRef" in source or "secretKeyRef" in source:
            kind = "configMap" if "configMapKeyRef" in source else "secret"
            ref = source.get("configMapKeyRef") or source.get("secretKeyRef")
            data = await sources.data(kind, ref["name"], optional=bool(ref.get("optional")))
            if data is not None and ref["key"] in data:
                env[var["name"]] = data[ref["key"]].decode()
            elif not ref.get("optional"):
                raise PodRunError(f"env {var['name']}: {kind} {ref['name']} has no key {ref['key']!r}")
        else:
            raise PodRunError(f"env {var['name']}: {sorted(source)} is not resolved here")
    return env


async def _mounts(
    sources: _Sources, pod: Mapping[str, Any], container: Mapping[str, Any], host: Host, where: Path, gid: int | None
) -> list[sandbox.Mount]:
    volumes = {v["name"]: v for v in pod["spec"].get("volumes") or []}
    mounts_of = list(container.get("volumeMounts") or [])
    if not any(m["mountPath"].rstrip("/") == SERVICE_ACCOUNT_PATH for m in mounts_of):
        # A template, not yet through admission: what the ServiceAccount admission plugin adds.
        automount = pod["spec"].get("automountServiceAccountToken")
        if automount is None:  # the pod does not say: its ServiceAccount does, true unless it says no
            automount = (await sources.account()).get("automountServiceAccountToken", True)
        if automount:
            added, mount = service_account_volume()
            volumes[added["name"]] = added
            mounts_of.append(mount)
    out = []
    for mount in mounts_of:
        volume = volumes.get(mount["name"])
        if volume is None:
            raise PodRunError(f"volumeMount {mount['name']}: no such volume")
        read_only = bool(mount.get("readOnly"))
        if "emptyDir" in volume:
            empty = volume["emptyDir"] or {}
            if empty.get("medium") == "Memory":
                size = str(quantity_bytes(empty["sizeLimit"])) if empty.get("sizeLimit") else "50%"
                out.append(
                    sandbox.Mount(target=mount["mountPath"], size=size, mode="0777", gid=gid, read_only=read_only)
                )
                continue
            directory = where / "volumes" / mount["name"]
            directory.mkdir(parents=True, exist_ok=True)
            directory.chmod(0o777)
        elif any(kind in volume for kind in ("configMap", "secret", "projected", "downwardAPI")):
            directory = where / "volumes" / mount["name"]
            if not directory.exists():
                (await _volume_files(sources, volume, host)).write(directory)
            read_only = True  # a kubelet mounts these read-only whatever the mount says
        else:
            kinds = sorted(set(volume) - {"name"})
            raise PodRunError(f"volume {mount['name']}: {kinds} not run here")
        source = directory / mount["subPath"] if mount.get("subPath") else directory
        out.append(sandbox.Mount(target=mount["mountPath"], source=source, read_only=read_only))
    return out


def _host_files(pod: Mapping[str, Any], host: Host, where: Path) -> list[sandbox.Mount]:
    """/etc/hosts and /etc/hostname as a kubelet manages them, the host's /etc/resolv.conf."""
    name = pod["metadata"]["name"][:63]
    etc = where / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "hosts").write_text(
        f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n{host.pod_ip}\t{name}\n"
    )
    (etc / "hostname").write_text(name + "\n")
    shutil.copyfile("/etc/resolv.conf", etc / "resolv.conf")
    for path in etc.iterdir():
        path.chmod(0o644)
    return [
        sandbox.Mount(target="/etc/hosts", source=etc / "hosts"),
        sandbox.Mount(target="/etc/hostname", source=etc / "hostname", read_only=True),
        sandbox.Mount(target="/etc/resolv.conf", source=etc / "resolv.conf", read_only=True),
    ]


# -- the running container ------------------------------------------------------------------------


@dataclass
class Running:
    """A started container; `stop` and `wait` are a kubelet's."""

    name: str  # namespace/pod
    log_path: Path
    grace: float
    process: subprocess.Popen[bytes]
    container: sandbox.Container
    started_at: float = field(default_factory=time.time)
    finished_at: float | None = None
    killed: bool = False

    @property
    def returncode(self) -> int | None:
        """The container's exit status as Kubernetes reports it, None while it runs. Killed, it
        is 137 (128 + SIGKILL): `unshare` (util-linux 2.38) answers 1 for a child ended by a
        signal, and only SIGKILL ends the first process of a PID namespace from outside."""
        code = self.process.poll()
        if code is None:
            return None
        if self.finished_at is None:
            self.finished_at = time.time()
        return 128 + signal.SIGKILL if self.killed else code

    def exec(self, argv: list[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """`argv` run inside the container (an exec probe, `kubectl exec`); exit status 1 with
        no output if the container has ended."""
        pid = sandbox.first_process(self.process)
        if pid is None:
            return subprocess.CompletedProcess(argv, 1, "", "container not running")
        command = sandbox.exec_command(self.container, pid, argv)
        try:
            return subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(argv, 1, "", f"timed out after {timeout:.0f}s")

    async def wait(self, timeout: float | None = None) -> int | None:
        """The exit status once it ended, None if still running after `timeout` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if deadline is not None and time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.1)
        return self.returncode

    async def stop(self, grace: float | None = None) -> int:
        """SIGTERM to the container's first process, SIGKILL after `grace` seconds (the pod's
        terminationGracePeriodSeconds by default); its exit status."""
        self._signal(signal.SIGTERM)
        code = await self.wait(self.grace if grace is None else grace)
        if code is None:
            self.kill()
            code = await self.wait()
        assert code is not None
        return code

    def kill(self) -> None:
        """SIGKILL to the sandbox; everything in it ends with its first process."""
        if self.process.poll() is None:
            self.killed = True
        self._signal(signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    def ensure_stopped(self) -> None:
        """For clean-up paths that cannot await: killed and reaped."""
        if self.process.poll() is None:
            self.kill()
            self.process.wait(10)

    def _signal(self, number: signal.Signals) -> None:
        pid = sandbox.first_process(self.process)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, number)


async def start(pod: Mapping[str, Any], *, image: Unpacked, client: KubeClient, host: Host, workdir: Path) -> Running:
    """Starts the pod's container; raises PodRunError (before starting anything) when the pod
    asks for what cannot be given. `workdir` holds its volumes' files and its log."""
    spec = pod["spec"]
    if len(spec["containers"]) != 1 or spec.get("initContainers"):
        raise PodRunError("one container and no init containers: that is all run here")
    container = spec["containers"][0]
    meta = pod["metadata"]
    where = workdir / f"{meta['namespace']}_{meta['name']}_{str(meta.get('uid', 'template'))[:8]}"
    where.mkdir(parents=True, exist_ok=True)
    sources = _Sources(client, pod)
    who = identity(pod, container, image.config)
    env = await _environment(sources, container, image.config, host)
    fs_group = (spec.get("securityContext") or {}).get("fsGroup")
    mounts = await _mounts(sources, pod, container, host, where, fs_group)
    mounts += _host_files(pod, host, where)
    command = argv(image.config, container, env)
    log_path = where / f"{container['name']}.log"
    run = sandbox.Container(
        root=image.root,
        argv=command,
        env=[f"{k}={v}" for k, v in env.items()],
        workdir=container.get("workingDir") or image.config.get("WorkingDir") or "/",
        user=f"{who.uid}:{who.gid}",
        groups=who.groups,
        mounts=mounts,
        read_only_root=who.read_only_root,
        hostname=meta["name"][:63],
        no_new_privileges=who.no_new_privileges,
    )
    process = sandbox.start(run, log=log_path)
    grace = float(spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE))
    name = f"{meta['namespace']}/{meta['name']}"
    return Running(name=name, log_path=log_path, grace=grace, process=process, container=run)
