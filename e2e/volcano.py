"""Volcano in the lab's front end (`python -m e2e up --with volcano`, e2e.stacks): its webhook
manager, scheduler and controller manager, unmodified, built from volcano.sh/volcano v1.10.0
(its tools module repeats Volcano's own replace directives, which Go applies only in the main
module), with the CRDs of that version from the Go module cache.

As Volcano's chart runs it, but as processes: its admission webhooks are reached through an
ExternalName Service on loopback with a certificate of the lab's CA; the webhook manager does not
register itself, it waits for configurations of fixed names (`volcano-admission-service-<path>`)
and fills in their CA, so the lab writes those. Only the webhooks of Volcano's own kinds (Jobs,
PodGroups, Queues) are enabled: its pod webhooks would put every pod of the front end behind it.
The scheduler (name `volcano`) creates the queue `default`, whose creation goes through the
queue webhooks; the controller manager opens it.
"""

from __future__ import annotations

import base64
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from e2e import pki, stacks
from e2e.state import LabState, ProcessState
from vkprovider.kube import KubeClient, NotFound
from vkprovider.kube.upsert import create_or_replace

MODULE = "volcano.sh/volcano"
NAMESPACE = "volcano-system"
SERVICE = "volcano-admission-service"
SCHEDULER = "volcano"
CRD_DIRS = ("config/crd/volcano/bases", "config/crd/jobflow/bases")
QUEUES = "/apis/scheduling.volcano.sh/v1beta1/queues"

#: (path, kind, webhook name, group, version, resource, operations): Volcano's chart's webhooks
#: for its own kinds (installer/helm/chart/volcano/templates/webhooks.yaml).
WEBHOOKS = (
    ("/jobs/mutate", "Mutating", "mutatejob.volcano.sh", "batch.volcano.sh", "v1alpha1", "jobs", ["CREATE"]),
    (
        "/jobs/validate",
        "Validating",
        "validatejob.volcano.sh",
        "batch.volcano.sh",
        "v1alpha1",
        "jobs",
        ["CREATE", "UPDATE"],
    ),
    (
        "/podgroups/mutate",
        "Mutating",
        "mutatepodgroup.volcano.sh",
        "scheduling.volcano.sh",
        "v1beta1",
        "podgroups",
        ["CREATE"],
    ),
    ("/queues/mutate", "Mutating", "mutatequeue.volcano.sh", "scheduling.volcano.sh", "v1beta1", "queues", ["CREATE"]),
    (
        "/queues/validate",
        "Validating",
        "validatequeue.volcano.sh",
        "scheduling.volcano.sh",
        "v1beta1",
        "queues",
        ["CREATE", "UPDATE", "DELETE"],
    ),
)

#: Volcano's default scheduler configuration, written out: gang among its plugins, and the
#: enqueue action, without which the job controller never creates a Job's pods.
SCHEDULER_CONF = {
    "actions": "enqueue, allocate, backfill",
    "tiers": [
        {"plugins": [{"name": "priority"}, {"name": "gang"}, {"name": "conformance"}]},
        {
            "plugins": [
                {"name": "overcommit"},
                {"name": "drf"},
                {"name": "predicates"},
                {"name": "proportion"},
                {"name": "nodeorder"},
            ]
        },
    ],
}


def webhook_configurations(port: int, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The configurations the webhook manager waits for, one per path, through the Service."""
    out = []
    for path, kind, name, group, version, resource, operations in WEBHOOKS:
        hook = {
            "name": name,
            "admissionReviewVersions": ["v1"],
            "sideEffects": "NoneOnDryRun",
            "failurePolicy": "Fail",
            "timeoutSeconds": 10,
            "clientConfig": {
                "service": {"namespace": NAMESPACE, "name": SERVICE, "path": path, "port": port},
                "caBundle": base64.b64encode(ca_bundle).decode(),
            },
            "rules": [
                {"apiGroups": [group], "apiVersions": [version], "operations": operations, "resources": [resource]}
            ],
        }
        out.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": f"{kind}WebhookConfiguration",
                "metadata": {"name": f"{SERVICE}{path.replace('/', '-')}"},
                "webhooks": [hook],
            }
        )
    return out


def argvs(
    bins: dict[str, Path], *, kubeconfig: Path, work: Path, webhook_port: int, health: dict[str, int]
) -> dict[str, list[str]]:
    """Each process's command line: webhook manager, scheduler, controller manager."""
    common = [f"--kubeconfig={kubeconfig}", "--enable-healthz=true"]
    return {
        "volcano-webhook-manager": [
            str(bins["volcano-webhook-manager"]),
            *common,
            f"--healthz-address=127.0.0.1:{health['volcano-webhook-manager']}",
            f"--tls-cert-file={work / 'tls.crt'}",
            f"--tls-private-key-file={work / 'tls.key'}",
            f"--ca-cert-file={work / 'ca.crt'}",
            "--listen-address=127.0.0.1",
            f"--port={webhook_port}",
            f"--webhook-service-name={SERVICE}",
            f"--webhook-namespace={NAMESPACE}",
            f"--enabled-admission={','.join(path for path, *_ in WEBHOOKS)}",
            f"--scheduler-name={SCHEDULER}",
        ],
        "volcano-scheduler": [
            str(bins["volcano-scheduler"]),
            *common,
            f"--healthz-address=127.0.0.1:{health['volcano-scheduler']}",
            f"--scheduler-name={SCHEDULER}",
            f"--scheduler-conf={work / 'scheduler.conf'}",
            "--leader-elect=false",
        ],
        "volcano-controller-manager": [
            str(bins["volcano-controller-manager"]),
            *common,
            f"--healthz-address=127.0.0.1:{health['volcano-controller-manager']}",
            f"--scheduler-name={SCHEDULER}",
            "--leader-elect=false",
        ],
    }


async def bring_up(
    lab: LabState,
    *,
    client: KubeClient,
    bins: dict[str, Path],
    spawn: stacks.Spawn,
    wait: stacks.Await,
) -> dict[str, ProcessState]:
    """Volcano in the front end, ready: its default queue open."""
    source = stacks.source_of("volcano", MODULE)
    work = lab.root / "stacks" / "volcano"
    work.mkdir(parents=True, exist_ok=True)
    ca = pki.load(lab.root / "clusters" / "offline" / "pki", "ca")
    dns = (f"{SERVICE}.{NAMESPACE}.svc", f"{SERVICE}.{NAMESPACE}.svc.cluster.local")
    pki.issue(ca, SERVICE, dns_names=dns, server=True).write(work, "tls")
    (work / "ca.crt").write_bytes(ca.cert_pem)
    (work / "scheduler.conf").write_text(yaml.safe_dump(SCHEDULER_CONF))
    webhook_port = stacks.free_port()
    health = {
        name: stacks.free_port()
        for name in ("volcano-webhook-manager", "volcano-scheduler", "volcano-controller-manager")
    }

    await create_or_replace(
        client, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
    )
    await create_or_replace(
        client, f"/api/v1/namespaces/{NAMESPACE}/services", stacks.service(SERVICE, NAMESPACE, webhook_port)
    )
    for directory in CRD_DIRS:
        for path in sorted((source / directory).glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            await create_or_replace(client, stacks.CRDS, crd)
            await stacks.established(client, crd["metadata"]["name"])
    for body in webhook_configurations(webhook_port, ca.cert_pem):
        await create_or_replace(client, stacks.WEBHOOKS[body["kind"]], body)

    started = {}
    for name, argv in argvs(
        bins, kubeconfig=lab.kubeconfig("offline"), work=work, webhook_port=webhook_port, health=health
    ).items():
        proc = spawn(f"offline-{name}", argv)
        started[name] = proc
        # The webhook manager's health endpoint is its webhook server's (TLS): serving is enough.
        ready = (
            _serving(webhook_port) if name == "volcano-webhook-manager" else stacks.http_ok(health[name], "/healthz")
        )
        await wait(proc, ready, name)
    await wait(started["volcano-controller-manager"], _queue_open(client), "Volcano's default queue open")
    return started


def _serving(port: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        async with aiohttp.ClientSession() as session, session.get(f"https://127.0.0.1:{port}/", ssl=False) as resp:
            return resp.status > 0

    return check


def _queue_open(client: KubeClient) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        try:
            queue = await client.get(f"{QUEUES}/default")
        except NotFound:
            return False
        return bool((queue.get("status") or {}).get("state") == "Open")

    return check
