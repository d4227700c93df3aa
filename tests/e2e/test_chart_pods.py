"""The chart run as a chart (issue 36): installed into the lab's front end, its own pods (the
provider's Deployment, the `helm test` pod, the drain hook's Job) run from the image `make image`
builds, with what a kubelet gives them, and each does its job: the provider registers its node
and runs a gang and a plain pod in the members, `helm test` passes, and `helm uninstall` drains
everything through the hook and leaves nothing behind.

Who runs the pods, and why the verdicts are this test's: the lab's nodes run no containers (KWOK
writes statuses only, and marks a Job's pod Succeeded by itself after 2 s), so the chart's pods
are kept off every node and this test is their kubelet (e2e.hostkubelet, e2e.podrun). The values'
nodeSelector names a label no node has (the chart puts it on the Deployment's pod, the hooks'
and the helm test's, as the provider's own placement). No pod of the release is ever
bound, so nothing but this test writes their status: the test pod's and the drain pod's phase
and exit code, which `helm test` and the Job controller (then `helm uninstall`) read, come from
the exit status of the processes run here; the provider's Ready from its own exec probe run in
its container.

Why namespaces and chroot, not a container runtime: podman and crun cannot start a container on
these machines (the cgroup setup they want is refused) and CI has no container daemon. A pod's
container here is `unshare` (mount, PID, UTS and IPC namespaces; the host's network, where the
lab's apiservers listen) and `chroot --userspec` into the unpacked image: read-only root, the
volumes at their paths, the token of the pod's ServiceAccount, the chart's user, command, args
and env (e2e.image.sandbox). Not applied: cgroups, seccomp.

Shares the front end, member-2 and member-3: the chart's MemberClusters (members 2 and 3) carry
the scene label that keeps other tests' providers off them. Time (2 cores, warm image cache):
about 10 s for the image (build, unpack), then about 30 s for the install, the pods, `helm
test` and the drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import binaries, podrun
from e2e.fixtures import Lab
from e2e.hostkubelet import HostKubelet
from e2e.image import build as image_build
from e2e.image.unpack import Unpacked, unpack
from federation import labels
from tests.e2e.helpers import delete_namespace, eventually, install_member_cluster_crd, make_namespace, pods
from tests.e2e.test_chart import CHART, DENIED
from tests.e2e.test_dispatch import cleanup, gang_pod, pod_group
from tests.e2e.test_federation_capacity import SCENE_LABEL
from tests.e2e.vk import free_port
from vkprovider.kube import KubeClient, NotFound, resource_path

pytestmark = [pytest.mark.e2e]

#: On the chart's pods (values.nodeSelector): no lab node has it, so they wait for this test.
HELD = "vkprovider.io/run-by-test"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Unpacked:
    if os.geteuid() != 0:
        pytest.fail("running the image needs root (chroot, mount namespaces)")
    return unpack(image_build.build().path, tmp_path_factory.mktemp("image") / "root")


async def helm(*args: str, timeout: float = 280) -> tuple[int, str]:
    """helm run without blocking the event loop (this test's kubelet runs on it meanwhile)."""
    proc = await asyncio.create_subprocess_exec(
        str(binaries.ensure_all()["helm"]), *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        out, _ = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode()


async def new_release(
    lab: Lab, offline: KubeClient, tmp_path: Path, kind: str, *, scene: bool = True
) -> tuple[str, str, str, Path]:
    """A release's name, virtual node, namespace (made) and values file (written), for a chart
    whose pods this test runs."""
    await install_member_cluster_crd(offline)
    release = f"vk{uuid.uuid4().hex[:5]}"
    node = f"vk-{kind}-{uuid.uuid4().hex[:5]}"
    namespace = await make_namespace(offline, f"{release}-system")
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(the_chart_values(lab, release, node, scene=scene)))
    return release, node, namespace, values


async def gang_and_plain(offline: KubeClient, namespace: str, node: str) -> None:
    """A gang (PodGroup of 3) and a plain pod for `node`, awaited Running."""
    await offline.create(f"/apis/scheduling.k8s.io/v1beta1/namespaces/{namespace}/podgroups", pod_group("g", 3, {}))
    for i in range(3):
        await offline.create(f"/api/v1/namespaces/{namespace}/pods", gang_pod(f"g{i}", node, "g", 0))
    plain = gang_pod("plain", node, "none", 0)
    del plain["spec"]["schedulingGroup"]
    await offline.create(f"/api/v1/namespaces/{namespace}/pods", plain)

    async def running() -> bool:
        items = await pods(offline, namespace)
        return len(items) == 4 and all(p["status"].get("phase") == "Running" for p in items)

    await eventually(running, timeout=90, what="a gang and a plain pod running through the chart's pod")


def plural(kind: str) -> str:
    return kind.lower()[:-1] + "ies" if kind.endswith("y") else kind.lower() + "s"


async def nothing_left(
    lab: Lab, offline: KubeClient, manifest: str, *, release: str, namespace: str, node: str
) -> None:
    """Every object of the release's manifest gone (the cluster-scoped ones too), and what its
    provider and hooks made: the virtual node, the test hook's cluster role, the instance's
    objects in the members, pods in the release namespace."""
    objects = [d for d in yaml.safe_load_all(manifest) if d]
    assert {d["kind"] for d in objects} >= {"Deployment", "ClusterRole", "MemberCluster", "Secret"}
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    paths = [
        f"/api/v1/nodes/{node}",
        *(f"{rbac}/{kind}/{release}-{namespace}-test" for kind in ("clusterroles", "clusterrolebindings")),
    ]
    for doc in objects:
        meta = doc["metadata"]
        kind = plural(doc["kind"])
        paths.append(resource_path(doc["apiVersion"], kind, namespace=meta.get("namespace"), name=meta["name"]))
    kept = []
    for path in paths:
        with contextlib.suppress(NotFound):
            await offline.get(path)
            kept.append(path)
    assert not kept, kept
    instance = {"labelSelector": f"{labels.INSTANCE}={node}"}
    for member in lab.members:
        async with lab.client(member) as client:
            for collection in ("pods", "configmaps", "secrets", "services"):
                left = (await client.list(f"/api/v1/{collection}", params=instance))["items"]
                assert not left, f"{member} keeps {collection}: {[i['metadata']['name'] for i in left]}"
    left = [p["metadata"]["name"] for p in await pods(offline, namespace)]
    assert not left, f"{namespace} keeps pods {left}"


#: The members the chart's release takes: away from member-1, where the reclaim tests run
#: (e2e.fixtures.CHAIN).
CHART_MEMBERS = ["member-2", "member-3"]


def the_chart_values(lab: Lab, release: str, node: str, *, scene: bool = True) -> dict[str, Any]:
    """With `scene`, the release's MemberClusters carry the scene label, which keeps every other
    test's provider off them (chart 0.1.0, which the upgrade test installs, has no member labels)."""
    notice = {"reclaim": {"noticeSeconds": 2}}
    members: list[dict[str, Any]] = [
        {"name": f"{release}-{m}", "kubeconfig": lab.kubeconfig(m).read_text(), "spec": notice} for m in CHART_MEMBERS
    ]
    if scene:
        for member in members:
            member["labels"] = {SCENE_LABEL: release}
    return {
        "nodeName": node,
        # A short checkpoint notice: the drain at the end goes through it.
        "members": members,
        # Only this release's MemberClusters (left-overs of other releases are not ours).
        "federation": {"memberSelector": f"app.kubernetes.io/instance={release}"},
        # The host's network: ports no other test on this machine holds.
        "ports": {"kubelet": free_port(), "metrics": free_port()},
        "nodeSelector": {HELD: release},
    }


@pytest.mark.lab_turn(shares=["offline", *CHART_MEMBERS])
@pytest.mark.asyncio(loop_scope="session")
async def test_the_charts_own_pods_serve_pass_helm_test_and_drain_on_uninstall(
    lab: Lab, offline: KubeClient, image: Unpacked, tmp_path: Path
) -> None:
    release, node, namespace, values = await new_release(lab, offline, tmp_path, "pods")
    kubeconfig = ("--kubeconfig", str(lab.kubeconfig("offline")))
    install = ("install", release, str(CHART), "-n", namespace, "-f", str(values), "--skip-crds")
    code, said = await helm(*install, *kubeconfig)
    assert code == 0, said
    code, manifest = await helm("get", "manifest", release, "-n", namespace, *kubeconfig)
    assert code == 0, manifest
    deployment = next(d for d in yaml.safe_load_all(manifest) if d and d["kind"] == "Deployment")
    template = deployment["spec"]["template"]
    image_ref = template["spec"]["containers"][0]["image"]
    workload = ""
    kubelet = HostKubelet(
        client=offline,
        namespace=namespace,
        images={image_ref: image},
        host=podrun.Host.for_server(offline.server),
        workdir=tmp_path / "kubelet",
    )
    try:
        async with kubelet:
            # The Deployment's pod, as its ReplicaSet made it: what the manifest renders.
            selector = ",".join(f"{k}={v}" for k, v in template["metadata"]["labels"].items())

            async def provider_ready() -> dict[str, Any] | None:
                assert not kubelet.errors, kubelet.errors
                for pod in await pods(offline, namespace, selector):
                    conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
                    if conditions.get("Ready") == "True":
                        return pod
                return None

            provider = await eventually(provider_ready, timeout=60, what="the provider's pod Ready (its exec probe)")
            ran, rendered = provider["spec"]["containers"][0], template["spec"]["containers"][0]
            for key in ("image", "command", "args", "securityContext"):
                assert ran.get(key) == rendered.get(key), key
            assert [e["name"] for e in ran["env"]] == [e["name"] for e in rendered["env"]]
            # ...and the ServiceAccount admission plugin's token volume after the chart's.
            assert ran["volumeMounts"][: len(rendered["volumeMounts"])] == rendered["volumeMounts"]

            async def node_ready() -> bool:
                try:
                    found = await offline.get(f"/api/v1/nodes/{node}")
                except NotFound:
                    return False
                return any(c["type"] == "Ready" and c["status"] == "True" for c in found["status"]["conditions"])

            await eventually(node_ready, timeout=60, what=f"virtual node {node} Ready")

            workload = await make_namespace(offline, f"chart-pods-{uuid.uuid4().hex[:6]}")
            await gang_and_plain(offline, workload, node)

            # `helm test`: its pod runs `vkprovider check` here, its phase is this run's.
            code, said = await helm("test", release, "-n", namespace, *kubeconfig, "--timeout", "3m")
            test_log = kubelet.log(f"{release}-test")
            assert code == 0, f"{said}\n{test_log}"
            assert kubelet.exits[f"{namespace}/{release}-test"] == 0
            assert "check: passed: 1 node(s) Ready" in test_log, test_log
            assert "Phase:          Succeeded" in said, said
            for path in (
                f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{release}-{namespace}-test",
                f"/api/v1/namespaces/{namespace}/serviceaccounts/{release}-test",
            ):
                with pytest.raises(NotFound):  # the test's hooks go once it passed
                    await offline.get(path)

            # `helm uninstall`: the pre-delete hook's Job runs `vkprovider drain` here; it drains
            # the members and scales the Deployment to zero, whose pod this kubelet then stops.
            # Two minutes, less than the Job's deadline: a stuck drain is seen while its pod is there.
            code, said = await helm("uninstall", release, "-n", namespace, *kubeconfig, "--timeout", "2m")
            drains = kubelet.started(f"{release}-drain-")
            drain_log = kubelet.log(drains[-1]) if drains else "(no drain pod ran)"
            if code != 0:  # the drain waits for the pods of the Deployment's selector to go
                matching = [p["metadata"]["name"] for p in await pods(offline, namespace, selector)]
                raise AssertionError(f"{said}\n{drain_log}\npods of the Deployment's selector: {matching}")
            assert len(drains) == 1 and kubelet.exits.get(f"{namespace}/{drains[0]}") == 0, drain_log
            assert "drain: done" in drain_log, drain_log
            assert kubelet.exits[f"{namespace}/{provider['metadata']['name']}"] == 0  # SIGTERM, a clean stop
            provider_log = kubelet.log(provider["metadata"]["name"])
            forbidden = [line for line in provider_log.splitlines() if DENIED.search(line)]
            assert not forbidden, forbidden[:5]

        for item in await pods(offline, workload):
            assert item["status"]["phase"] == "Failed" and item["status"]["reason"] == "Reclaimed", item["status"]
        await nothing_left(lab, offline, manifest, release=release, namespace=namespace, node=node)
    finally:
        # --ignore-not-found: a release the test never installed is no failure; anything else is.
        await helm("uninstall", release, "-n", namespace, *kubeconfig, "--no-hooks", "--ignore-not-found")
        if workload:
            await cleanup(lab, offline, workload)
        await delete_namespace(offline, namespace)
