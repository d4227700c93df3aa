"""Small helpers shared by end-to-end tests: polling, object builders, process scans."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import yaml

from e2e import ports, procs
from vkprovider.kube import KubeClient, NotFound, TooManyRequests, create_or_replace, ensure_namespace

T = TypeVar("T")

CRD = Path(__file__).parents[2] / "federation" / "crds" / "memberclusters.yaml"
MEMBERS = "/apis/vkprovider.io/v1alpha1/memberclusters"


#: kill -9 trials per test (`VKPROVIDER_KILL_TRIALS`): 5 keeps the warm suite under 20 minutes on
#: 2 cores beside the outage and streaming tests; 10 or more for a longer, stronger run.
KILL_TRIALS = int(os.environ.get("VKPROVIDER_KILL_TRIALS", "5"))


async def eventually(
    probe: Callable[[], Awaitable[T | None]], *, timeout: float = 60.0, interval: float = 0.25, what: str = "condition"
) -> T:
    """Poll `probe` until it returns something truthy; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: T | None = None
    while time.monotonic() < deadline:
        last = await probe()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")


async def make_namespace(client: KubeClient, name: str) -> str:
    assert await ensure_namespace(client, name, timeout=30), f"no default service account in {name}"
    return name


async def delete_namespace(client: KubeClient, name: str) -> None:
    with contextlib.suppress(NotFound):
        await client.delete(f"/api/v1/namespaces/{name}")


def pod(
    name: str,
    *,
    requests: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    spec: dict[str, Any] | None = None,
) -> dict[str, Any]:
    resources = {"requests": requests, "limits": {k: v for k, v in requests.items() if "/" in k}} if requests else {}
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "registry.example/test/app:1", "resources": resources}],
        },
    }
    body["spec"].update(spec or {})
    return body


async def changes_during(
    client: KubeClient, path: str, *, since: str, window: float, params: dict[str, str] | None = None
) -> list[dict[str, Any]]:
    """Every change (ADDED, MODIFIED, DELETED) to the objects under `path` after resourceVersion
    `since` until `window` seconds from now: a watch from that version, so nothing that happened
    in between is missed, where a sleep and one look would miss a change undone before the look.
    The lab's watch cache keeps far more than a test's window; a 410 fails the test."""
    found: list[dict[str, Any]] = []
    version = since
    deadline = time.monotonic() + window
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(window):
            while True:  # the server may end a watch early: go on from the last version seen
                left = max(1, int(deadline - time.monotonic()) + 1)
                async for event in client.watch(path, resource_version=version, params=params, timeout_seconds=left):
                    version = event["object"]["metadata"]["resourceVersion"]
                    if event["type"] != "BOOKMARK":
                        found.append(dict(event))
    return found


async def listed_version(client: KubeClient, path: str) -> str:
    """The resourceVersion of a list of `path` now: where `changes_during` starts from."""
    return str((await client.list(path, params={"limit": "1"}))["metadata"]["resourceVersion"])


async def pods(client: KubeClient, namespace: str, selector: str | None = None) -> list[dict[str, Any]]:
    params = {"labelSelector": selector} if selector else None
    result = await client.list(f"/api/v1/namespaces/{namespace}/pods", params=params)
    return list(result["items"])


def lab_processes(marker: str) -> list[int]:
    """PIDs of live processes whose command line contains `marker`."""
    return procs.find(marker)


async def install_member_cluster_crd(offline: KubeClient) -> None:
    """Install the MemberCluster CRD, or bring an older one up to date (its schema prunes
    fields it does not know)."""
    crd = yaml.safe_load(CRD.read_text())
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    await create_or_replace(offline, path, crd)

    async def served() -> bool:
        try:
            await offline.list(MEMBERS)
        except (NotFound, TooManyRequests):  # the new resource is still being set up
            return False
        return True

    await eventually(served, timeout=30, interval=0.1, what="the MemberCluster CRD served")


async def service_account_kubeconfig(
    lab: Any, client: KubeClient, cluster: str, namespace: str, account: str, path: Path
) -> None:
    """A kubeconfig at `path` for `cluster` that authenticates as the ServiceAccount (an hour's
    token), as a workload or a tenant would hold it."""
    token = await client.create(
        f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 3600}},
    )
    admin = yaml.safe_load(lab.kubeconfig(cluster).read_text())
    server = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "lab", "cluster": server}],
                "users": [{"name": account, "user": {"token": token["status"]["token"]}}],
                "contexts": [{"name": "sa", "context": {"cluster": "lab", "user": account}}],
                "current-context": "sa",
            }
        )
    )


@contextlib.contextmanager
def capacity_agents(lab: Any, members: list[str], workdir: Path) -> Iterator[dict[str, str]]:
    """The members' capacity agents (`federation agent`, run with each member's admin
    kubeconfig as its owner would), as processes beside the test: member -> address."""
    children: list[subprocess.Popen[bytes]] = []
    addresses = {}
    try:
        for member in members:
            addresses[member] = f"127.0.0.1:{ports.listen_port()}"
            with open(workdir / f"agent-{member}.log", "wb") as log:
                children.append(
                    subprocess.Popen(
                        [
                            sys.executable, "-m", "federation.cli", "agent",
                            "--kubeconfig", str(lab.kubeconfig(member)), "--listen", addresses[member],
                            "--member", member, "--heartbeat", "1", "--log-format", "json",
                        ],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    )
                )  # fmt: skip
        yield addresses
    finally:
        for child in children:
            child.terminate()
        for child in children:
            child.wait(10)


async def can_i(client: KubeClient, namespace: str) -> dict[str, set[str]]:
    """What `kubectl auth can-i --list -n namespace` shows for the client's account (the same
    SelfSubjectRulesReview), as resource[.group][/subresource] -> verbs."""
    review = await client.create(
        "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
        {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": namespace}},
    )
    rules: dict[str, set[str]] = {}
    for rule in review["status"].get("resourceRules", []):
        for group in rule.get("apiGroups") or [""]:
            for resource in rule.get("resources") or []:
                name, _, sub = resource.partition("/")
                key = (name if group == "" else f"{name}.{group}") + (f"/{sub}" if sub else "")
                rules.setdefault(key, set()).update(rule.get("verbs") or [])
    return rules


async def settle(*tasks: asyncio.Task[T]) -> list[T]:
    """Wait until every task has ended, each to its end whatever the others do (a cleanup, an
    onboard or offboard cut off in flight would go on writing), then raise the failure, or all of
    them as a group; the results. Cancelled ourselves, we cancel them and wait for them."""
    try:
        results = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for task in tasks:  # only if we were cancelled: otherwise every task has ended
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    failed = [r for r in results if isinstance(r, BaseException)]
    if len(failed) == 1:
        raise failed[0]
    if failed:
        raise BaseExceptionGroup(f"{len(failed)} of {len(tasks)} tasks failed", failed)
    return results  # type: ignore[return-value]  # no BaseException among them


async def together(*named: tuple[str, Coroutine[Any, Any, Any]]) -> None:
    """Run each (name, coroutine) as a task of that name, side by side, as `settle` waits."""
    await settle(*(asyncio.create_task(work, name=name) for name, work in named))
