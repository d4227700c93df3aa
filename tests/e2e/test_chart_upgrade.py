"""`helm upgrade` from the previous chart version (issue 36, item 4), with the chart's pods run
from the image as in test_chart_pods (e2e.hostkubelet: this test is their kubelet, the lab's
kube-controller-manager their Deployment and Job controllers).

The previous version is the chart as released at 0.1.0 (`git archive` of PREVIOUS), installed
on a front end whose MemberCluster CRD is the one chart 0.1.0 first installed, without
`spec.tenancy`: Helm installs a chart's crds/ once and never upgrades them, so that is what every
cluster first installed at 0.1.0 still has. Both releases run the current image (only the chart
differs between them).

What the upgrade must keep, and how it is judged:
- `spec.tenancy`: written before the upgrade, the old schema prunes it; after the upgrade (whose
  pre-upgrade hook ran `vkprovider crds apply` from the image), it is kept.
- every running pod: the gang and the plain pod stay Running, their member pods the same (UIDs);
  a pod created after the upgrade runs.
- one writer at a time: the front end's audit log (the lab audits ServiceAccounts' writes, with
  the user agent, which names the provider's replica) has no write of one replica between the
  first and last write of another. The Deployment's Recreate strategy stops the old pod before
  the new one starts; then a second copy of the new pod, started beside it (a surge, or a pod
  its kubelet lost track of), waits for the leader Lease and writes nothing until the first
  copy is gone.

Runs alone: it changes the lab's MemberCluster CRD for its duration (and puts it back).
"""

from __future__ import annotations

import contextlib
import copy
import io
import subprocess
import tarfile
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import audit, podrun
from e2e.fixtures import Lab
from e2e.hostkubelet import HostKubelet
from e2e.image.unpack import Unpacked
from federation import labels
from federation.members import crds
from tests.e2e.helpers import delete_namespace, eventually, make_namespace, pods
from tests.e2e.test_chart import CHART
from tests.e2e.test_chart_pods import gang_and_plain, helm, image, new_release
from tests.e2e.test_dispatch import cleanup, gang_pod
from tests.e2e.vk import free_port
from vkprovider.kube import KubeClient, NotFound, TooManyRequests

pytestmark = [pytest.mark.e2e]

__all__ = ["image"]  # the module fixture, shared with test_chart_pods

#: The last commit of chart 0.1.0 (version 0.2.0 followed it).
PREVIOUS = "81e035ac6fe4d4f2ce39ef72319eb42227d11945"
REPOSITORY = Path(__file__).resolve().parents[2]
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
MEMBERS = "/apis/vkprovider.io/v1alpha1/memberclusters"
TENANCY = {"tenant": "ml", "clusterRole": "vkprovider-tenant-ml", "serviceAccount": {"namespace": "a", "name": "b"}}


def previous_chart(into: Path) -> Path:
    """charts/vkprovider as it was at PREVIOUS, from the repository's history."""
    known = subprocess.run(["git", "-C", str(REPOSITORY), "cat-file", "-e", f"{PREVIOUS}^{{commit}}"], check=False)
    if known.returncode != 0:
        pytest.fail(f"commit {PREVIOUS} (chart 0.1.0) is not in this clone: fetch its history (git fetch --unshallow)")
    archive = subprocess.run(
        ["git", "-C", str(REPOSITORY), "archive", PREVIOUS, "charts/vkprovider"], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    chart = into / "charts" / "vkprovider"
    assert yaml.safe_load((chart / "Chart.yaml").read_text())["version"] == "0.1.0"
    return chart


def first_crd() -> dict[str, Any]:
    """The MemberCluster CRD as chart 0.1.0 first installed it: no spec.tenancy."""
    crd: dict[str, Any] = copy.deepcopy(yaml.safe_load((crds.OWN / "memberclusters.yaml").read_text()))
    del crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["tenancy"]
    return crd


async def set_crd(offline: KubeClient, crd: dict[str, Any]) -> None:
    name = crd["metadata"]["name"]
    current = await offline.get(f"{CRD_PATH}/{name}")
    body = {k: v for k, v in crd.items() if k != "status"}
    body["metadata"] = {**crd["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}
    await offline.replace(f"{CRD_PATH}/{name}", body)
    await served(offline)


async def served(offline: KubeClient) -> None:
    """MemberClusters answer again (after a schema change their storage takes a moment: 429)."""

    async def answers() -> bool:
        try:
            await offline.list(MEMBERS, params={"limit": 1})
        except TooManyRequests:
            return False
        return True

    await eventually(answers, timeout=30, what="MemberClusters served")


def tenancy_probe(name: str) -> dict[str, Any]:
    """A MemberCluster no provider takes (disabled, and labelled as a test's scene)."""
    return {
        "apiVersion": "vkprovider.io/v1alpha1",
        "kind": "MemberCluster",
        "metadata": {"name": name, "labels": {"vkprovider.io/test-scene": name}},
        "spec": {"kubeconfigSecretRef": {"namespace": "a", "name": "b"}, "enabled": False, "tenancy": TENANCY},
    }


def one_writer_at_a_time(writes: list[audit.AuditRecord]) -> dict[str, tuple[float, float]]:
    """Each replica's (first, last) write; fails when one wrote inside another's span."""
    spans: dict[str, tuple[float, float]] = {}
    for record in writes:
        first, last = spans.get(record.agent, (record.received, record.received))
        spans[record.agent] = (min(first, record.received), max(last, record.received))
    for agent, (first, last) in spans.items():
        inside = [r for r in writes if r.agent != agent and first < r.received < last]
        assert not inside, f"{agent} wrote from {first} to {last}, and meanwhile {inside[:3]}"
    return spans


@pytest.mark.asyncio(loop_scope="session")
async def test_an_upgrade_from_the_previous_chart_keeps_tenancy_and_every_pod_with_one_writer(
    lab: Lab, offline: KubeClient, image: Unpacked, tmp_path: Path
) -> None:
    previous = previous_chart(tmp_path / "previous")
    current_crd = yaml.safe_load((crds.OWN / "memberclusters.yaml").read_text())
    release, node, namespace, values = await new_release(lab, offline, tmp_path, "upgrade", scene=False)
    kubeconfig = ("--kubeconfig", str(lab.kubeconfig("offline")))
    account = f"system:serviceaccount:{namespace}:{release}"
    probe = f"{release}-tenancy"
    workload = ""
    images = {}
    for chart in (previous, CHART):
        rendered = yaml.safe_load((chart / "values.yaml").read_text())["image"]
        app = yaml.safe_load((chart / "Chart.yaml").read_text())["appVersion"]
        images[f"{rendered['repository']}:{rendered['tag'] or app}"] = image
    kubelet = HostKubelet(
        client=offline, namespace=namespace, images=images,
        host=podrun.Host.for_server(offline.server), workdir=tmp_path / "kubelet",
    )  # fmt: skip
    try:
        # A front end first installed at 0.1.0: its CRD has no spec.tenancy.
        await set_crd(offline, first_crd())
        code, said = await helm("install", release, str(previous), "-n", namespace, "-f", str(values), *kubeconfig)
        assert code == 0, said
        async with kubelet:

            async def provider_ready() -> str | None:
                assert not kubelet.errors, kubelet.errors
                for pod in await pods(
                    offline, namespace, f"app.kubernetes.io/name=vkprovider,app.kubernetes.io/instance={release}"
                ):
                    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
                    if conditions.get("Ready") == "True" and not pod["metadata"].get("deletionTimestamp"):
                        return str(pod["metadata"]["name"])
                return None

            old = await eventually(provider_ready, timeout=90, what="the 0.1.0 provider's pod Ready")
            workload = await make_namespace(offline, f"upgrade-{uuid.uuid4().hex[:6]}")
            await gang_and_plain(offline, workload, node)

            async def running(count: int) -> bool:
                items = await pods(offline, workload)
                return len(items) == count and all(p["status"].get("phase") == "Running" for p in items)

            before = await member_pods(lab, node)
            assert len(before) == 4, before

            # What every upgraded cluster does until the CRD is applied: spec.tenancy pruned.
            stored = await offline.create(MEMBERS, tenancy_probe(probe))
            assert "tenancy" not in stored["spec"]

            code, said = await helm("upgrade", release, str(CHART), "-n", namespace, "-f", str(values), *kubeconfig)
            crd_jobs = kubelet.started(f"{release}-crds-")
            crd_log = kubelet.log(crd_jobs[0]) if crd_jobs else "(no CRD hook pod ran)"
            assert code == 0, f"{said}\n{crd_log}"
            assert crd_jobs and kubelet.exits.get(f"{namespace}/{crd_jobs[0]}") == 0, crd_log
            assert "memberclusters.vkprovider.io: updated, established" in crd_log, crd_log
            await served(offline)

            async def new_provider() -> str | None:
                name = await provider_ready()
                return name if name and name != old else None

            new = await eventually(new_provider, timeout=120, what="the 0.2.0 provider's pod Ready")
            # Stopped by SIGTERM, cleanly.
            assert kubelet.exits[f"{namespace}/{old}"] == 0, kubelet.log(old)[-3000:]
            deployment = await offline.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/{release}")
            assert deployment["spec"]["strategy"]["type"] == "Recreate"

            # spec.tenancy is kept now.
            current = await offline.get(f"{MEMBERS}/{probe}")
            kept = await offline.replace(
                f"{MEMBERS}/{probe}", {**tenancy_probe(probe), "metadata": current["metadata"]}
            )
            assert kept["spec"]["tenancy"] == TENANCY

            # Every pod kept: the same member pods, still running; and a new pod runs.
            assert await member_pods(lab, node) == before
            assert await running(4)
            late = gang_pod("late", node, "none", 0)
            del late["spec"]["schedulingGroup"]
            await offline.create(f"/api/v1/namespaces/{workload}/pods", late)
            await eventually(lambda: running(5), timeout=90, what="a pod created after the upgrade running")

            # A second copy of the new pod beside it waits for the Lease, writing nothing...
            template = deployment["spec"]["template"]
            # (Its own ports: pods here share the host's network, where a cluster gives each its own.)
            spec = copy.deepcopy(template["spec"])
            spec["containers"][0]["env"] += [
                {"name": "VKPROVIDER_HTTP__PORT", "value": str(free_port())},
                {"name": "VKPROVIDER_HTTP__HEALTH_PORT", "value": str(free_port())},
            ]
            twin = {"apiVersion": "v1", "kind": "Pod", "metadata": {**template["metadata"], "name": f"{new}-twin"},
                    "spec": spec}  # fmt: skip
            await offline.create(f"/api/v1/namespaces/{namespace}/pods", twin)
            await eventually(lambda: twin_started(kubelet, f"{new}-twin"), timeout=60, what="the second copy started")
            lease = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/vkprovider-{node}"
            assert (await offline.get(lease))["spec"]["holderIdentity"] == new
            # ...until the first is gone (its Deployment scaled to zero, so no other replaces it):
            # then it takes over.
            await offline.patch(
                f"/apis/apps/v1/namespaces/{namespace}/deployments/{release}", {"spec": {"replicas": 0}}
            )

            async def twin_leads() -> bool:
                return bool((await offline.get(lease))["spec"].get("holderIdentity") == f"{new}-twin")

            await eventually(twin_leads, timeout=60, what="the second copy holding the Lease")
            await eventually(lambda: running(5), timeout=60, what="the pods running under the second copy")

            writes = [
                r for r in audit.records(lab.state, "offline", users={account})
                if r.is_write and r.agent.startswith("vkprovider/")
            ]  # fmt: skip
            spans = one_writer_at_a_time(writes)
            agents = {agent.partition("(")[2].rstrip(")") for agent in spans}
            assert {old, new, f"{new}-twin"} <= agents, spans
            # The new provider's first write came after the old one's last.
            assert spans[f"vkprovider/{node} ({old})"][1] < spans[f"vkprovider/{node} ({new})"][0]
            await cleanup(lab, offline, workload)  # while a provider runs to delete its member pods
            workload = ""
    finally:
        with contextlib.suppress(NotFound):
            await offline.delete(f"{MEMBERS}/{probe}")
        await set_crd(offline, current_crd)
        # --ignore-not-found: a release the test never installed is no failure; anything else is.
        await helm("uninstall", release, "-n", namespace, *kubeconfig, "--no-hooks", "--ignore-not-found")
        if workload:  # the test failed: no provider may be left to delete the member pods
            for pod in await pods(offline, workload):
                with contextlib.suppress(NotFound):
                    await offline.delete(
                        f"/api/v1/namespaces/{workload}/pods/{pod['metadata']['name']}",
                        params={"gracePeriodSeconds": 0},
                    )
            await cleanup(lab, offline, workload)
        await delete_namespace(offline, namespace)


async def member_pods(lab: Lab, node: str) -> dict[str, str]:
    """Our member pods (of virtual node `node`): member/namespace/name -> UID."""
    found: dict[str, str] = {}
    for member in lab.members:
        async with lab.client(member) as client:
            listed = await client.list("/api/v1/pods", params={"labelSelector": f"{labels.INSTANCE}={node}"})
            for pod in listed["items"]:
                meta = pod["metadata"]
                found[f"{member}/{meta['namespace']}/{meta['name']}"] = meta["uid"]
    return found


async def twin_started(kubelet: HostKubelet, name: str) -> bool:
    return name in kubelet.started(name)
