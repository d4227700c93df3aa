"""`kubectl top` on the front end shows a virtual-node pod's usage in its member (issue 37,
item 1), through real parts only: KWOK simulates the member pod's usage (e2e/kwok/metrics.yaml)
and serves the kubelet's /metrics/resource; the member's own metrics-server scrapes it and
serves the member's Metrics API; the provider reads our pods' PodMetrics there, about once per
`usage_interval`, and serves them as a kubelet's /metrics/resource; the front end's
metrics-server scrapes that, and `kubectl top pod` / `kubectl top node` read the front end's
Metrics API. The expected figures are the pod's own annotations (independent of every part)
and the member's own `kubectl top pod`."""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from pathlib import Path

import aiohttp
import pytest

from e2e import audit, binaries
from e2e.components import SCRAPED_LABEL
from e2e.fixtures import Lab
from federation.usage.reader import FRESH
from tests.e2e.helpers import eventually, make_namespace
from tests.e2e.kubeletport import client_cert, with_cert
from tests.e2e.test_dispatch import cleanup_and_stop
from tests.e2e.test_federation_capacity import federation_vk
from tests.e2e.test_outages import member_pods, plain_pod, running, start_provider
from vkprovider.kube import AlreadyExists, KubeClient

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.lab_turn(shares=["offline", "member-2"]),
]

MEMBER = "member-2"
RBAC = "rbac.authorization.k8s.io"
SCRAPER = "top-scraper"  # a second scraper of the provider's kubelet port, beside metrics-server
USAGE_INTERVAL = 10.0


def top(lab: Lab, cluster: str, *args: str) -> str | None:
    """The figures `kubectl top ARGS` prints for one object (None while it has none)."""
    kubectl = str(binaries.ensure_all()["kubectl"])
    done = subprocess.run(
        [kubectl, "--kubeconfig", str(lab.kubeconfig(cluster)), "top", *args, "--no-headers"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        assert "not available" in done.stderr or "not found" in done.stderr, done.stderr
        return None
    fields = done.stdout.split()
    return " ".join(fields[1:]) if fields and "<unknown>" not in fields else None


def millicores(figures: str) -> int:
    cpu = figures.split(maxsplit=1)[0]
    return int(cpu.removesuffix("m")) if cpu.endswith("m") else int(cpu) * 1000


@pytest.mark.long
async def test_kubectl_top_shows_the_member_pods_usage(lab: Lab, offline: KubeClient, tmp_path: Path) -> None:
    user = f"top-{uuid.uuid4().hex[:6]}"
    proc = federation_vk(
        lab,
        tmp_path,
        [MEMBER],
        audited_as=user,
        **{"node.labels": {SCRAPED_LABEL: "true"}, "provider.federation.usage_interval": USAGE_INTERVAL},
    )
    await start_provider(proc, 1)
    started = time.time()
    ns = await make_namespace(offline, f"top-{uuid.uuid4().hex[:6]}")
    usage = {"kwok.x-k8s.io/usage-cpu": "350m", "kwok.x-k8s.io/usage-memory": "96Mi"}
    try:
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"test-{SCRAPER}-kubelet-api"},
            # The apiserver's own role for kubelet clients (nodes/metrics among its rights).
            "roleRef": {"apiGroup": RBAC, "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
            "subjects": [{"kind": "User", "name": SCRAPER, "apiGroup": RBAC}],
        }
        # Early: RBAC reaches the apiserver's authorizer a moment after the binding is made.
        with contextlib.suppress(AlreadyExists):  # made by an earlier run against this lab
            await offline.create(f"/apis/{RBAC}/v1/clusterrolebindings", binding)
        await offline.create(f"/api/v1/namespaces/{ns}/pods", plain_pod("busy", proc.node, usage))
        await eventually(lambda: running(offline, ns, 1), timeout=60, what="the pod running in the member")
        member = (await member_pods(lab, MEMBER, ns))["busy"]["metadata"]

        # The member's figures as its own `kubectl top pod` showed them, by time. KWOK's
        # simulated counter jitters by a few millicores on a loaded machine, and the front end's
        # metrics-server takes its rate across our samples, so ours must lie within what the
        # member showed over the last scrapes (the member's two and ours), not equal one look.
        theirs_seen: list[tuple[float, str]] = []
        looks: list[tuple[str | None, str | None]] = []

        async def within_theirs() -> str | None:
            theirs = top(lab, MEMBER, "pod", member["name"], "-n", member["namespace"])
            if theirs is not None:
                theirs_seen.append((time.monotonic(), theirs))
            ours = top(lab, "offline", "pod", "busy", "-n", ns)
            looks.append((ours, theirs))
            recent = [f for at, f in theirs_seen if at >= time.monotonic() - 3 * USAGE_INTERVAL]
            if ours is None or not recent:
                return None
            cpu = [millicores(f) for f in recent]
            same_memory = all(f.split()[1] == ours.split()[1] for f in recent)
            return ours if same_memory and min(cpu) <= millicores(ours) <= max(cpu) else None

        try:
            ours = await eventually(within_theirs, timeout=120, interval=2, what="kubectl top pod as the member's")
        except AssertionError as failed:
            raise AssertionError(f"{failed}; the last looks (ours, theirs): {looks[-6:]}") from failed
        assert ours.split()[1] == "96Mi"
        assert abs(millicores(ours) - 350) <= 350 * 0.02, ours

        node = await eventually(
            lambda: _top_node(lab, proc.node), timeout=60, interval=2, what="kubectl top node of the virtual node"
        )
        assert abs(millicores(node) - 350) <= 350 * 0.02 and node.split()[2] == "96Mi", node

        # However often it was scraped, the provider asked the member's Metrics API about once per
        # interval (a read is fresh for FRESH of it): five scrapes back to back take one read at most.
        def reads() -> list[audit.AuditRecord]:
            return [r for r in audit.records(lab.state, MEMBER, users={user}) if "/apis/metrics.k8s.io/" in r.uri]

        scraper = with_cert(client_cert(lab, SCRAPER, tmp_path))
        before = len(reads())
        async with aiohttp.ClientSession() as session:
            for _ in range(5):
                url = f"https://127.0.0.1:{proc.port}/metrics/resource"
                async with session.get(url, ssl=scraper) as resp:
                    scraped = await resp.text()
                assert resp.status == 200 and "pod_cpu_usage_seconds_total" in scraped, scraped[:300]
        read = reads()
        assert len(read) - before <= 1, [r.received for r in read]
        assert read and all(r.succeeded for r in read), read
        assert len(read) <= (time.time() - started) / (USAGE_INTERVAL * FRESH) + 1, [r.received for r in read]
    finally:
        await cleanup_and_stop(lab, offline, ns, proc)


async def _top_node(lab: Lab, node: str) -> str | None:
    return top(lab, "offline", "node", node)
