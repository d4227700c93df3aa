"""The apiserver's node proxy reaches the virtual kubelet (issue 37, item 2): the lab gives its
providers an address of their own that is not loopback (e2e.nodeaddress), which
kube-apiserver agrees to proxy to, so `kubectl get --raw /api/v1/nodes/NODE/proxy/...` works as
on a kubelet: `/pods` and `/runningpods/` list exactly the pods bound to that node (two nodes,
each with its own pods), and `/metrics/resource` answers as a Prometheus scrape through the
proxy would read it (kube-prometheus scrapes kubelets this way)."""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from e2e import binaries
from e2e.fixtures import Lab
from tests.e2e.helpers import delete_namespace, eventually, make_namespace
from tests.e2e.test_runtime import running, vk_pod
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.asyncio(loop_scope="session"),
    pytest.mark.lab_turn(shares=["offline"]),
]


@pytest_asyncio.fixture(loop_scope="session")
async def offline(lab: Lab) -> AsyncIterator[KubeClient]:
    async with lab.client("offline") as client:
        yield client


def _raw(lab: Lab, path: str) -> Any:
    """`kubectl get --raw PATH` on the front end, as a user would ask."""
    kubectl = str(binaries.ensure_all()["kubectl"])
    done = subprocess.run(
        [kubectl, "--kubeconfig", str(lab.kubeconfig("offline")), "get", "--raw", path],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"kubectl get --raw {path}: {done.stderr}"
    return json.loads(done.stdout)


def _proxied(lab: Lab, vk: Any) -> VkProcess:
    """A memory provider advertising the lab's own address and listening on it."""
    address = lab.state.node_address
    if not address:
        pytest.fail("the lab has no node address of its own (e2e.nodeaddress needs root): no node proxy to test")
    proc: VkProcess = vk(**{"node.address": address, "http.bind": address})
    return proc


async def test_the_node_proxy_lists_exactly_the_pods_bound_to_each_node(lab: Lab, offline: KubeClient, vk: Any) -> None:
    one, two = _proxied(lab, vk), _proxied(lab, vk)
    for proc in (one, two):
        proc.start()
    for proc in (one, two):
        await proc.wait_ready()
    ns = await make_namespace(offline, f"proxy-{uuid.uuid4().hex[:6]}")
    try:
        names: dict[str, set[str]] = {one.node: {"a0", "a1"}, two.node: {"b0"}}
        for node, pods in names.items():
            for name in pods:
                await offline.create(f"/api/v1/namespaces/{ns}/pods", vk_pod(name, node))
        await eventually(lambda: running(offline, ns, 3), what="the three pods running")
        uids = {
            p["metadata"]["name"]: p["metadata"]["uid"]
            for p in (await offline.list(f"/api/v1/namespaces/{ns}/pods"))["items"]
        }

        for proc in (one, two):
            registered = await offline.get(f"/api/v1/nodes/{proc.node}")
            assert {"type": "InternalIP", "address": lab.state.node_address} in registered["status"]["addresses"]
            listed = _raw(lab, f"/api/v1/nodes/{proc.node}/proxy/pods")
            assert listed["kind"] == "PodList"
            assert {p["metadata"]["name"] for p in listed["items"]} == names[proc.node]
            assert all(p["spec"]["nodeName"] == proc.node for p in listed["items"])
            runs = _raw(lab, f"/api/v1/nodes/{proc.node}/proxy/runningpods/")
            assert runs["kind"] == "PodList"
            assert {
                (p["metadata"]["name"], p["metadata"]["namespace"], p["metadata"]["uid"]) for p in runs["items"]
            } == {(name, ns, uids[name]) for name in names[proc.node]}
            assert all(
                p["spec"]["containers"] == [{"name": "main", "image": "registry.example/test/app:1", "resources": {}}]
                for p in runs["items"]
            ), runs["items"]
            # A Prometheus scrape of the kubelet through the apiserver (kube-prometheus' way).
            scraped = b"".join([c async for c in offline.stream(f"/api/v1/nodes/{proc.node}/proxy/metrics/resource")])
            assert b"# TYPE" in scraped, scraped[:300]
    finally:
        await delete_namespace(offline, ns)
        for proc in (one, two):
            proc.ensure_stopped()
