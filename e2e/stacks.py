"""Offline stacks in the lab's front end: JobSet and Kueue (and Volcano, e2e.volcano), unmodified,
run as processes beside its control plane (`python -m e2e up --with jobset,kueue,volcano`).

Training and batch teams do not submit bare pods: they run JobSets, queue with Kueue. So the
lab runs those controllers as a cluster would, built from their pinned Go modules like the
control plane (e2e.binaries), with the CRDs of the same module versions (read from the Go module
cache, never copied into the repository) and their admission webhooks served by the controllers
themselves on loopback.

The webhooks are registered as a cluster registers them, through a Service: an ExternalName
Service resolving to 127.0.0.1 (as the lab's metrics-server is reached), so the apiserver checks
the serving certificate against the Service's DNS name as it would in a cluster:
- JobSet serves a certificate of the lab's CA (its own rotator writes to a fixed path under /tmp,
  which two labs on one machine would share), named in its webhook configurations' caBundle;
- Kueue keeps its own certificates (its built-in rotator, writing into the lab's directory and
  injecting its CA into its webhook configurations and CRD conversion webhooks), as its release
  manifests run it: without the rotator it insists on a certificate under /etc.

Only the webhooks of what is enabled are registered: Kueue's pod, Deployment and StatefulSet
webhooks would put every pod of the front end behind Kueue.
"""

from __future__ import annotations

import asyncio
import base64
import json
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from e2e import binaries, pki
from e2e.state import LabState, ProcessState
from vkprovider.kube import KubeClient, NotFound
from vkprovider.kube.upsert import create_or_replace

CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
WEBHOOKS = {
    "MutatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    "ValidatingWebhookConfiguration": "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations",
}

#: What `--with` may name, in the order they start (Kueue's JobSet integration wants the JobSet CRD).
KNOWN = ("jobset", "kueue", "volcano")
#: Each stack's processes in the lab's state (the offline cluster's), in the order they stop.
PROCESSES = {
    "jobset": ("jobset",),
    "kueue": ("kueue",),
    "volcano": ("volcano-controller-manager", "volcano-scheduler", "volcano-webhook-manager"),
}


class StackError(RuntimeError):
    """A stack could not be set up; the message is one line meant for a person."""


@dataclass(frozen=True, kw_only=True)
class Stack:
    name: str
    module: str  # the Go module whose files (CRDs, webhook manifests) are those of the build
    binary: str
    namespace: str
    crds: str  # directory of the CRDs in the module
    webhooks: str  # the webhook manifests in the module (kubebuilder's, before kustomize)
    #: The webhook paths registered (None: every one in the manifests).
    paths: tuple[str, ...] | None = None
    #: CRDs whose versions are converted by the stack's /convert webhook (its kustomize patches).
    conversion: tuple[str, ...] = ()
    #: Pod webhooks are limited to pods carrying this label (its kustomize patch), if set.
    pod_label: str | None = None
    #: The lab's CA signs the serving certificate (else the stack's own rotator makes it).
    lab_certificate: bool = False

    @property
    def service(self) -> str:
        return f"{self.name}-webhook-service"

    @property
    def secret(self) -> str:
        return f"{self.name}-webhook-server-cert"

    def configuration(self, kind: str) -> str:
        """The name the stack's own cert rotator patches (and its manifests give)."""
        role = "mutating" if kind == "MutatingWebhookConfiguration" else "validating"
        return f"{self.name}-{role}-webhook-configuration"


STACKS = {
    "jobset": Stack(
        name="jobset",
        module="sigs.k8s.io/jobset",
        binary="jobset",
        namespace="jobset-system",
        crds="config/components/crd/bases",
        webhooks="config/components/webhook/manifests.yaml",
        pod_label="jobset.sigs.k8s.io/jobset-name",
        lab_certificate=True,
    ),
    "kueue": Stack(
        name="kueue",
        module="sigs.k8s.io/kueue",
        binary="kueue",
        namespace="kueue-system",
        crds="config/components/crd/bases",
        webhooks="config/components/webhook/manifests.yaml",
        paths=tuple(
            f"/{verb}-{group}"
            for verb in ("mutate", "validate")
            for group in (
                "kueue-x-k8s-io-v1beta2-clusterqueue",
                "kueue-x-k8s-io-v1beta2-resourceflavor",
                "kueue-x-k8s-io-v1beta2-workload",
                "kueue-x-k8s-io-v1beta2-cohort",
                "batch-v1-job",
                "jobset-x-k8s-io-v1alpha2-jobset",
            )
        ),
        conversion=tuple(
            f"{plural}.kueue.x-k8s.io"
            for plural in ("localqueues", "clusterqueues", "workloads", "cohorts", "multikueueclusters")
        ),
    ),
}


def parse(value: str) -> tuple[str, ...]:
    """`--with jobset,kueue`: the stacks named, in start order; unknown names are refused."""
    names = {n.strip() for n in value.split(",") if n.strip()}
    unknown = sorted(names - set(KNOWN))
    if unknown:
        raise StackError(f"unknown stack(s) {', '.join(unknown)} for --with; known: {', '.join(KNOWN)}")
    return tuple(n for n in KNOWN if n in names)


def module_source(stack: Stack) -> Path:
    """The stack's module, at the version its tools module pins, in the Go module cache."""
    return source_of(stack.name, stack.module)


def source_of(build_name: str, module: str) -> Path:
    """`module`, at the version tools module `build_name` pins, in the Go module cache."""
    build = binaries.tool_builds()[build_name]
    version = build.required_version(module)
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"{module}@{version}"],
        cwd=build.module_dir,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise StackError(f"go mod download {module}@{version} failed: {result.stderr.strip()[-300:]}")
    return Path(json.loads(result.stdout)["Dir"])


def crds(stack: Stack, source: Path, *, port: int) -> list[dict[str, Any]]:
    """The stack's CRDs, with the conversion webhooks its kustomize patches add."""
    out = []
    for path in sorted((source / stack.crds).glob("*.yaml")):
        crd: dict[str, Any] = yaml.safe_load(path.read_text())
        if crd["metadata"]["name"] in stack.conversion:
            crd["spec"]["conversion"] = {
                "strategy": "Webhook",
                "webhook": {
                    "clientConfig": {"service": _service_ref(stack, port, "/convert")},
                    "conversionReviewVersions": ["v1"],
                },
            }
        out.append(crd)
    return out


def webhook_configurations(stack: Stack, source: Path, *, port: int, ca_bundle: bytes | None) -> list[dict[str, Any]]:
    """The stack's webhook configurations from its manifests: the paths enabled, through the
    stack's Service, pod webhooks limited to its pods."""
    out = []
    for doc in yaml.safe_load_all((source / stack.webhooks).read_text()):
        if not doc:
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if stack.paths is not None and path not in stack.paths:
                continue
            hook["clientConfig"] = {"service": _service_ref(stack, port, path)}
            if ca_bundle is not None:
                hook["clientConfig"]["caBundle"] = base64.b64encode(ca_bundle).decode()
            pods = any("pods" in (rule.get("resources") or []) for rule in hook.get("rules") or [])
            if pods and stack.pod_label:
                hook["objectSelector"] = {"matchExpressions": [{"key": stack.pod_label, "operator": "Exists"}]}
            hooks.append(hook)
        if hooks:
            kind = doc["kind"]
            out.append(
                {
                    "apiVersion": doc["apiVersion"],
                    "kind": kind,
                    "metadata": {"name": stack.configuration(kind)},
                    "webhooks": hooks,
                }
            )
    return out


def _service_ref(stack: Stack, port: int, path: str) -> dict[str, Any]:
    return {"namespace": stack.namespace, "name": stack.service, "path": path, "port": port}


def service(name: str, namespace: str, port: int) -> dict[str, Any]:
    """The Service the apiserver reaches a stack's webhooks through: loopback, as an ExternalName
    (Endpoints may not name a loopback address)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"type": "ExternalName", "externalName": "127.0.0.1", "ports": [{"name": "webhook", "port": port}]},
    }


def config(stack: Stack, *, webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    """The stack's own configuration file: one replica (no leader election), webhooks on
    loopback, metrics off (the lab does not scrape them)."""
    common: dict[str, Any] = {
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
    }
    if stack.name == "jobset":
        return {"apiVersion": "config.jobset.x-k8s.io/v1alpha1", **common, "internalCertManagement": {"enable": False}}
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        **common,
        "namespace": stack.namespace,
        "internalCertManagement": {"enable": True},
        "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]},
        # The on-demand visibility API is an aggregated apiserver the lab does not register.
        "featureGates": {"VisibilityOnDemand": False},
    }


def serving_certificate(stack: Stack, ca: pki.KeyPair, cert_dir: Path) -> None:
    """A certificate of the lab's CA for the stack's Service name, where the stack reads it."""
    dns = (f"{stack.service}.{stack.namespace}.svc", f"{stack.service}.{stack.namespace}.svc.cluster.local")
    pair = pki.issue(ca, stack.service, dns_names=dns, server=True)
    cert_dir.mkdir(parents=True, exist_ok=True)
    pair.write(cert_dir, "tls")


def argv(stack: Stack, *, binary: Path, kubeconfig: Path, config_file: Path) -> list[str]:
    return [str(binary), f"--kubeconfig={kubeconfig}", f"--config={config_file}", "--zap-log-level=info"]


def http_ok(port: int, path: str) -> Callable[[], Awaitable[bool]]:
    """A check that a health endpoint on loopback answers 200."""

    async def check() -> bool:
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}{path}") as resp:
            return resp.status == 200

    return check


def free_port() -> int:
    """A loopback port free now (the stacks' ports are not part of the lab's fixed plan)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


#: Starts a process of the lab (named, with its command line) and returns it once recorded.
Spawn = Callable[[str, list[str]], ProcessState]
#: Waits for a started process to pass a check, failing at once if it dies.
Await = Callable[[ProcessState, Callable[[], Awaitable[bool]], str], Awaitable[None]]


async def bring_up(
    lab: LabState, names: tuple[str, ...], *, client: KubeClient, bins: dict[str, Path], spawn: Spawn, wait: Await
) -> dict[str, ProcessState]:
    """Each named stack in the front end (`client`), started and ready: its objects, then its
    process, then its webhooks answering with a certificate the apiserver trusts."""
    offline = lab.clusters["offline"]
    ca = pki.load(lab.root / "clusters" / offline.name / "pki", "ca")
    started = {}
    for name in names:
        if name not in STACKS:
            continue  # Volcano is not a controller-runtime manager: e2e.volcano
        stack = STACKS[name]
        source = module_source(stack)
        webhook_port, health_port = free_port(), free_port()
        work = lab.root / "stacks" / name
        cert_dir = work / "certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        await create_or_replace(
            client,
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": stack.namespace}},
        )
        await create_or_replace(
            client,
            f"/api/v1/namespaces/{stack.namespace}/services",
            service(stack.service, stack.namespace, webhook_port),
        )
        bundle = None
        if stack.lab_certificate:
            serving_certificate(stack, ca, cert_dir)
            bundle = ca.cert_pem
        else:  # the stack's rotator fills it, as its manifests ship it empty
            secret = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": stack.secret, "namespace": stack.namespace},
            }
            await create_or_replace(client, f"/api/v1/namespaces/{stack.namespace}/secrets", secret)
        for crd in crds(stack, source, port=webhook_port):
            await create_or_replace(client, CRDS, crd)
            await established(client, crd["metadata"]["name"])
        configurations = webhook_configurations(stack, source, port=webhook_port, ca_bundle=bundle)
        for body in configurations:
            await create_or_replace(client, WEBHOOKS[body["kind"]], body)
        config_file = work / "config.yaml"
        config_file.write_text(
            yaml.safe_dump(config(stack, webhook_port=webhook_port, health_port=health_port, cert_dir=cert_dir))
        )
        proc = spawn(
            f"offline-{name}",
            argv(stack, binary=bins[stack.binary], kubeconfig=lab.kubeconfig(offline.name), config_file=config_file),
        )
        started[name] = proc

        if not stack.lab_certificate:

            async def mounted(stack: Stack = stack, cert_dir: Path = cert_dir) -> bool:
                return await mount_secret(client, stack, cert_dir)

            await wait(proc, mounted, f"{name}'s certificate in its Secret")

        await wait(proc, http_ok(health_port, "/readyz"), f"{name} controller")

        async def trusted(bodies: list[dict[str, Any]] = configurations) -> bool:
            """Every webhook names a CA (the stack's rotator injects its own after it starts)."""
            for body in bodies:
                current = await client.get(f"{WEBHOOKS[body['kind']]}/{body['metadata']['name']}")
                if not all(h["clientConfig"].get("caBundle") for h in current.get("webhooks") or []):
                    return False
            return True

        await wait(proc, trusted, f"{name} webhooks' CA")
    return started


async def mount_secret(client: KubeClient, stack: Stack, cert_dir: Path) -> bool:
    """What the kubelet does for the stack's pod: its webhook Secret's certificate and key as
    files in its certificate directory, once its rotator has written them (its rotator waits for
    the files to appear, as from a Secret volume). Rotation, a year on, is not followed."""
    secret = await client.get(f"/api/v1/namespaces/{stack.namespace}/secrets/{stack.secret}")
    data = secret.get("data") or {}
    if not (data.get("tls.crt") and data.get("tls.key")):
        return False
    for key in ("tls.crt", "tls.key"):
        tmp = cert_dir / f".{key}.tmp"
        tmp.write_bytes(base64.b64decode(data[key]))
        tmp.chmod(0o600)
        tmp.rename(cert_dir / key)
    return True


async def established(client: KubeClient, name: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            crd = await client.get(f"{CRDS}/{name}")
        except NotFound:
            crd = {}
        conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
        if conditions.get("Established") == "True":
            return
        if time.monotonic() > deadline:
            raise StackError(f"CRD {name} not established after {timeout:.0f}s")
        await asyncio.sleep(0.1)
