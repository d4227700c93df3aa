"""Prometheus scrapes the virtual kubelet through the apiserver's node proxy with the chart's
ServiceMonitor (issue 37, item 4): a real Prometheus (tests/e2e/prometheus.py), configured as
the Prometheus Operator configures it from the chart's rendered `serviceMonitor.nodeProxy`
ServiceMonitor, discovers the front end's apiserver through the `default/kubernetes` Service,
authenticates with its own account's token, bound by the chart's ClusterRole alone, and reads
the provider's /metrics and /metrics/resource through `/api/v1/nodes/NODE/proxy/...`.

The lab's apiservers listen on loopback with no endpoint reconciler, and Endpoints refuse
loopback addresses, so the test gives `default/kubernetes` an endpoint at the lab's own node
address, forwarded to the apiserver by tests.e2e.cutproxy (what a cluster's endpoint reconciler would publish)."""

from __future__ import annotations

import base64
import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import audit
from e2e.fixtures import Lab
from tests.e2e.cutproxy import CutProxy
from tests.e2e.helpers import delete_namespace, eventually, make_namespace
from tests.e2e.prometheus import Prometheus, scrape_configs
from tests.e2e.test_chart import one, render
from tests.e2e.test_node_proxy import _proxied
from tests.e2e.test_runtime import running, vk_pod
from vkprovider.kube import KubeClient
from vkprovider.kube.errors import NotFound

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.lab_turn(shares=["offline"]),
]

TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
CA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
APISERVER_ENDPOINTS = "/api/v1/namespaces/default/endpoints/kubernetes"


def _files(lab: Lab, workdir: Path) -> tuple[str, dict[str, str]]:
    """The front end's apiserver URL, and TLS files for service discovery (the lab's
    admin certificate, standing in for the operator's Prometheus's in-cluster account)."""
    config = yaml.safe_load(lab.kubeconfig("offline").read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    paths = {
        "ca_file": ("ca.crt", cluster["certificate-authority-data"]),
        "cert_file": ("admin.crt", user["client-certificate-data"]),
        "key_file": ("admin.key", user["client-key-data"]),
    }
    tls = {}
    for key, (name, data) in paths.items():
        (workdir / name).write_bytes(base64.b64decode(data))
        tls[key] = str(workdir / name)
    server = cluster["server"]
    return server, tls


async def test_prometheus_scrapes_the_virtual_kubelet_through_the_node_proxy_with_the_charts_monitor(
    lab: Lab, offline: KubeClient, vk: Any, tmp_path: Path
) -> None:
    proc = _proxied(lab, vk)
    proc.start()
    await proc.wait_ready()
    suffix = uuid.uuid4().hex[:6]
    ns = await make_namespace(offline, f"scrape-{suffix}")
    await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod("busy", proc.node))
    await eventually(lambda: running(offline, ns, 1), what="the pod running")
    docs = render(
        f"nodeName={proc.node}",
        "serviceMonitor.interval=2s",
        "serviceMonitor.nodeProxy.enabled=true",
        f"serviceMonitor.nodeProxy.serviceAccount.namespace={ns}",
        "serviceMonitor.nodeProxy.serviceAccount.name=prometheus",
    )
    monitor = one(docs, "ServiceMonitor")
    role = one(docs, "ClusterRole", "rel-vk-system-scraper")
    binding = one(docs, "ClusterRoleBinding", "rel-vk-system-scraper")
    # Cluster-wide names of this test's own: the shared lab may hold a release of the same name.
    for obj in (role, binding):
        obj["metadata"]["name"] = f"scraper-{suffix}"
    binding["roleRef"]["name"] = role["metadata"]["name"]
    server, sd_tls = _files(lab, tmp_path)
    rbac = "/apis/rbac.authorization.k8s.io/v1"
    try:
        await offline.create(f"{rbac}/clusterroles", role)
        await offline.create(f"{rbac}/clusterrolebindings", binding)
        await offline.create(f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "prometheus"}})
        token = await offline.create(
            f"/api/v1/namespaces/{ns}/serviceaccounts/prometheus/token",
            {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
        )
        (tmp_path / "token").write_text(token["status"]["token"])
        files = {TOKEN: tmp_path / "token", CA: Path(sd_tls["ca_file"])}
        prometheus = Prometheus(tmp_path, scrape_configs(monitor, api_server=server, sd_tls=sd_tls, files=files))
        address = lab.state.node_address
        assert address, "the lab has no node address of its own"
        forward = CutProxy(lab.kubeconfig("offline"), listen=address)
        await forward.start()
        try:
            await offline.create(
                APISERVER_ENDPOINTS.rsplit("/", 1)[0],
                {
                    "metadata": {"name": "kubernetes"},
                    "subsets": [{"addresses": [{"ip": address}], "ports": [{"name": "https", "port": forward.port}]}],
                },
            )
            with prometheus.running():
                await eventually(prometheus.ready, timeout=60, what="Prometheus ready")

                seen: list[list[dict[str, Any]]] = []

                async def all_up() -> list[dict[str, Any]] | None:
                    seen.append(await prometheus.targets())
                    up = [t for t in seen[-1] if t["health"] == "up"]
                    return seen[-1] if seen[-1] and len(up) == len(seen[-1]) else None

                try:
                    targets = await eventually(all_up, timeout=60, interval=1, what="every target of the monitor up")
                except AssertionError as failed:
                    last = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in (seen or [[]])[-1]]
                    raise AssertionError(f"{failed}; the targets: {last}") from failed
                paths = {t["labels"]["metrics_path"] for t in targets}
                assert paths == {"/metrics", "/metrics/resource"}, targets
                for target in targets:
                    assert target["labels"]["node"] == proc.node and target["labels"]["job"] == "vkprovider-kubelet"
                    assert f"/api/v1/nodes/{proc.node}/proxy/metrics" in target["scrapeUrl"], target

                async def sampled(promql: str) -> list[dict[str, Any]] | None:
                    return await prometheus.query(promql) or None

                # The provider's own metrics, and the kubelet's resource metrics of the pod (its
                # own namespace and pod labels kept over the target's).
                await eventually(
                    lambda: sampled(
                        f'vkprovider_node_status_patches_total{{node="{proc.node}",metrics_path="/metrics"}}'
                    ),
                    timeout=30,
                    what="a provider metric scraped",
                )
                series = await eventually(
                    lambda: sampled(f'container_memory_working_set_bytes{{node="{proc.node}",namespace="{ns}"}}'),
                    timeout=30,
                    what="the pod's resource metrics scraped",
                )
                assert {s["metric"]["pod"] for s in series} == {"busy"}, series
        finally:
            await forward.stop()
        # Every scrape went through the node proxy as Prometheus's own account.
        user = f"system:serviceaccount:{ns}:prometheus"
        proxied = [r for r in audit.records(lab.state, "offline", users={user}) if r.resource == "nodes"]
        assert proxied and all(r.succeeded and r.name == proc.node for r in proxied), proxied[:3]
        assert {r.subresource for r in proxied} == {"proxy"}, proxied[:3]
    finally:
        # Each is missing only when the test failed before creating it.
        for path in (
            APISERVER_ENDPOINTS,
            f"{rbac}/clusterrolebindings/scraper-{suffix}",
            f"{rbac}/clusterroles/scraper-{suffix}",
        ):
            with contextlib.suppress(NotFound):
                await offline.delete(path)
        await delete_namespace(offline, ns)
