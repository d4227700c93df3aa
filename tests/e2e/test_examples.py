"""The documentation's examples (docs/examples/) applied on the lab with kubectl, as a reader would,
each reaching the state its page says (issue 42). The hybrid example is applied by
test_hybrid's routed test (it needs the routing webhook, which that test registers alone), the
tenant onboarding script by test_onboard; the gang and the elastic job here.

Only what a reader would change is changed: the virtual node's name (`vk-pool` in the files)
becomes this test's provider's node, and the objects go into this test's namespace. One thing
stands in for the lab's lack of containers: the elastic Job's pods carry the lab's
`vkprovider.io/sim-complete-after`, so that their member pods (not owned by a Job there) finish."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import binaries
from e2e.fixtures import Lab
from federation import labels
from tests.e2e.helpers import eventually, make_namespace, pods
from tests.e2e.test_dispatch import cleanup
from tests.e2e.test_federation_capacity import federation_vk
from vkprovider.kube import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
#: The node name the examples use (the chart's nodeName in the docs).
EXAMPLE_NODE = "vk-pool"


def example(name: str, *, node: str, namespace: str | None = None) -> list[dict[str, Any]]:
    """The objects of docs/examples/NAME as a reader applies them on this lab: the node name
    replaced, and (with `namespace`) every namespaced object put in that namespace."""
    docs = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]
    text = yaml.safe_dump_all(docs).replace(
        f"kubernetes.io/hostname: {EXAMPLE_NODE}", f"kubernetes.io/hostname: {node}"
    )
    out = [d for d in yaml.safe_load_all(text) if d]
    for obj in out:
        if namespace is None:
            continue
        if obj["kind"] == "Namespace":
            obj["metadata"]["name"] = namespace
        else:
            obj["metadata"]["namespace"] = namespace
    return out


def kubectl_apply(lab: Lab, objects: list[dict[str, Any]]) -> str:
    """`kubectl apply -f -` on the front end, as the docs say; its output."""
    kubectl = str(binaries.ensure_all()["kubectl"])
    done = subprocess.run(
        [kubectl, "--kubeconfig", str(lab.kubeconfig("offline")), "apply", "-f", "-"],
        input=yaml.safe_dump_all(objects),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def members_of(items: list[dict[str, Any]]) -> set[str | None]:
    return {(p["metadata"].get("annotations") or {}).get(labels.MEMBER) for p in items}


@pytest.mark.shares_lab
async def test_the_gang_and_elastic_examples_run_whole_in_one_member_each(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    proc = federation_vk(lab, tmp_path, lab.members)
    proc.start()
    ns = await make_namespace(offline, f"examples-{uuid.uuid4().hex[:6]}")
    try:
        await proc.wait_ready()
        out = kubectl_apply(lab, example("gang.yaml", node=proc.node, namespace=ns))
        assert "podgroup.scheduling.k8s.io/trainer created" in out, out
        elastic = example("elastic.yaml", node=proc.node, namespace=ns)
        (job_body,) = [o for o in elastic if o["kind"] == "Job"]
        job_body["spec"]["template"]["metadata"]["annotations"]["vkprovider.io/sim-complete-after"] = "5s"
        out = kubectl_apply(lab, elastic)
        assert "job.batch/ring created" in out, out

        # gang.yaml: all 4 Running, in one member, where one gang object holds them.
        async def gang_running() -> list[dict[str, Any]] | None:
            items = [p for p in await pods(offline, ns) if p["metadata"]["name"].startswith("trainer-")]
            ok = len(items) == 4 and all(p["status"].get("phase") == "Running" for p in items)
            return items if ok else None

        trainers = await eventually(gang_running, timeout=90, what="the gang example's 4 pods running")
        (member,) = members_of(trainers)
        assert member in lab.members, member
        async with lab.client(member) as client:
            there = [p for p in await pods(client, ns) if p["metadata"]["name"].startswith("trainer-")]
            assert len(there) == 4, [p["metadata"]["name"] for p in there]

        # elastic.yaml: the Job completes, every one of its pods having run in one member.
        async def completed() -> dict[str, Any] | None:
            job = await offline.get(f"/apis/batch/v1/namespaces/{ns}/jobs/ring")
            done = [c for c in job["status"].get("conditions", []) if c["type"] == "Complete"]
            return job if done and done[0]["status"] == "True" else None

        job = await eventually(completed, timeout=120, what="the elastic example's Job complete")
        assert job["status"].get("succeeded") == 6, job["status"]
        ring = await pods(offline, ns, "job-name=ring")
        assert len(ring) >= 6 and all(p["status"].get("phase") == "Succeeded" for p in ring), [
            (p["metadata"]["name"], p["status"].get("phase")) for p in ring
        ]
        ring_members = members_of(ring)
        assert len(ring_members) == 1 and None not in ring_members, ring_members
    finally:
        await cleanup(lab, offline, ns)
        proc.ensure_stopped()
