"""`vkprovider drain` when it cannot look into a member (issue 36): a MemberCluster whose
kubeconfig Secret is missing made the drain skip that member and report "no member holds a pod
of ours" without having looked. Now it names the member and why, exits 1, and changes nothing
(no member disabled, no MemberCluster deleted), as it does for members of the settings file."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from e2e.fixtures import Lab
from federation.labels import MEMBERS_PATH
from tests.e2e.helpers import install_member_cluster_crd
from tests.e2e.test_federation_capacity import SCENE_LABEL
from vkprovider.kube import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]


@pytest.mark.shares_lab
async def test_drain_changes_nothing_when_a_members_credentials_cannot_be_read(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    await install_member_cluster_crd(offline)
    tag = f"drain-{uuid.uuid4().hex[:6]}"
    # The scene label keeps every other test's provider off these objects (their member_selector).
    readable, unreadable = f"{tag}-ok", f"{tag}-no-secret"
    kubeconfig = base64.b64encode(lab.kubeconfig("member-1").read_bytes()).decode()
    secret = {"metadata": {"name": readable, "namespace": "default"}, "data": {"kubeconfig": kubeconfig}}
    await offline.create("/api/v1/namespaces/default/secrets", secret)
    for name, secret_name in ((readable, readable), (unreadable, f"{tag}-missing")):
        await offline.create(
            MEMBERS_PATH,
            {
                "apiVersion": "vkprovider.io/v1alpha1",
                "kind": "MemberCluster",
                "metadata": {"name": name, "labels": {SCENE_LABEL: tag}},
                "spec": {"kubeconfigSecretRef": {"namespace": "default", "name": secret_name}},
            },
        )
    try:
        federation = {"member_selector": f"{SCENE_LABEL}={tag}"}
        argv = [
            "drain",
            "--set", f"kube.kubeconfig={lab.kubeconfig('offline')}",
            "--set", "provider.type=federation",
            "--set", f"node.name=vk-{tag}",
            "--set", f"provider.federation={json.dumps(federation)}",
            "--timeout", "30",
        ]  # fmt: skip
        code = "import sys; from vkprovider.cli import main; sys.exit(main(sys.argv[1:]))"
        done = subprocess.run(
            [sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert f"cannot read the credentials of member(s) {unreadable} (" in done.stdout, done.stdout
        assert "no member was changed" in done.stdout
        assert "no member holds a pod of ours" not in done.stdout
        for name in (readable, unreadable):
            obj = await offline.get(f"{MEMBERS_PATH}/{name}")
            assert (obj.get("spec") or {}).get("enabled") is not False, name
            assert not obj["metadata"].get("deletionTimestamp"), name
    finally:
        for name in (readable, unreadable):
            await offline.delete(f"{MEMBERS_PATH}/{name}")
        await offline.delete(f"/api/v1/namespaces/default/secrets/{readable}")
