"""`vkprovider crds apply` (federation.members.crds), the step the chart's pre-upgrade hook runs
because Helm never upgrades a chart's crds/.

Against the lab's front end, on a copy of the MemberCluster CRD under a group of its own (the
lab's MemberCluster CRD is shared by every test running beside this one, and its schema must not
change under them): the first chart's schema (no `spec.tenancy`) prunes the field from an object
written through it, as an upgraded cluster would; the command applies the current schema over
it, and the field is kept from then on. Bad input is refused before anything changes.
"""

from __future__ import annotations

import copy
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e.fixtures import Lab
from federation.members import crds
from tests.e2e.helpers import eventually
from vkprovider.kube import KubeClient, NotFound, TooManyRequests

pytestmark = [pytest.mark.e2e]

CRD_FILE = crds.OWN / "memberclusters.yaml"


def crd_under(group: str, *, tenancy: bool) -> dict[str, Any]:
    """The MemberCluster CRD under another group; without `spec.tenancy` as chart 0.1.0 first had it."""
    crd: dict[str, Any] = copy.deepcopy(yaml.safe_load(CRD_FILE.read_text()))
    crd["metadata"]["name"] = f"{crd['spec']['names']['plural']}.{group}"
    crd["spec"]["group"] = group
    if not tenancy:
        del crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["tenancy"]
    return crd


TENANCY = {"tenant": "ml", "clusterRole": "vkprovider-tenant-ml", "serviceAccount": {"namespace": "a", "name": "b"}}


def apply(lab: Lab, *files: Path) -> subprocess.CompletedProcess[str]:
    args = [arg for f in files for arg in ("--file", str(f))] + ["--kubeconfig", str(lab.kubeconfig("offline"))]
    return subprocess.run(
        [sys.executable, "-m", "vkprovider.cli", "crds", "apply", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.shares_lab
@pytest.mark.asyncio(loop_scope="session")
async def test_apply_upgrades_a_crd_helm_would_leave_old(lab: Lab, offline: KubeClient, tmp_path: Path) -> None:
    group = f"crds-{uuid.uuid4().hex[:6]}.test.vkprovider.io"
    old, new = crd_under(group, tenancy=False), crd_under(group, tenancy=True)
    name = old["metadata"]["name"]
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "memberclusters.yaml").write_text(yaml.safe_dump(old))
    (tmp_path / "new" / "memberclusters.yaml").write_text(yaml.safe_dump(new))
    objects = f"/apis/{group}/v1alpha1/memberclusters"
    member: dict[str, Any] = {
        "apiVersion": f"{group}/v1alpha1",
        "kind": "MemberCluster",
        "metadata": {"name": "m1"},
        "spec": {"kubeconfigSecretRef": {"namespace": "a", "name": "b"}, "tenancy": TENANCY},
    }
    try:
        first = apply(lab, tmp_path / "old")
        assert first.returncode == 0, first.stderr
        assert first.stdout.splitlines() == [f"{name}: created, established"]

        async def served() -> bool:
            """The resource answers (after a schema change its storage takes a moment: 429)."""
            try:
                await offline.list(objects)
            except (NotFound, TooManyRequests):
                return False
            return True

        await eventually(served, timeout=30, what="the old CRD served")
        stored = await offline.create(objects, member)
        assert "tenancy" not in stored["spec"]  # what an upgraded cluster does, silently

        second = apply(lab, tmp_path / "new")
        assert second.returncode == 0, second.stderr
        assert second.stdout.splitlines() == [f"{name}: updated, established"]
        await eventually(served, timeout=30, what="the new CRD served")
        member["metadata"] = {**member["metadata"], "resourceVersion": stored["metadata"]["resourceVersion"]}
        kept = await offline.replace(f"{objects}/m1", member)
        assert kept["spec"]["tenancy"] == TENANCY
        again = apply(lab, tmp_path / "new")
        assert again.stdout.splitlines() == [f"{name}: unchanged, established"], again.stderr

        # Not a CRD, or nothing there: refused with the file's name, status 2, nothing applied.
        pod = tmp_path / "pod.yaml"
        pod.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}))
        refused = apply(lab, tmp_path / "new", pod)
        assert refused.returncode == 2 and f"{pod}: holds a v1/Pod" in refused.stderr, refused.stderr
        missing = apply(lab, tmp_path / "nothing")
        assert missing.returncode == 2 and "no such file or directory" in missing.stderr, missing.stderr
    finally:
        try:
            await offline.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        except NotFound:
            pass


@pytest.mark.shares_lab  # no lab: it reads files
def test_the_default_is_the_providers_own_crd() -> None:
    (crd,) = crds.manifests([])
    assert crd["metadata"]["name"] == "memberclusters.vkprovider.io"
    assert crd == yaml.safe_load(CRD_FILE.read_text())
