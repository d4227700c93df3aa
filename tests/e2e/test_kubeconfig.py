"""Real-world member kubeconfigs against a real apiserver (issue 11, item 5): an `exec` credential
plugin that hands out a service account's token with an expiry of a few seconds. A client built
from that kubeconfig keeps working across several expiries (the plugin runs again before each
one), and a token the apiserver refuses is replaced by running the plugin once more. In a
federation provider, such a member works as any other, and a member whose plugin fails is that
member's error while the process and the other members go on.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml

from e2e.fixtures import Lab
from tests.e2e.helpers import delete_namespace, eventually, make_namespace
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient, NotFound, load_kubeconfig
from vkprovider.kube.credentials import ExecPlugin

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

MEMBER = "member-1"
LIFETIME = 3.0  # seconds: what the plugin claims for each credential it prints

PLUGIN = f"#!{sys.executable}\n" + textwrap.dedent(
    """
    import datetime, json, pathlib, sys, time

    state, lifetime = pathlib.Path(sys.argv[1]), float(sys.argv[2])
    runs = state / "runs"
    n = int(runs.read_text()) + 1 if runs.exists() else 1
    runs.write_text(str(n))
    with open(state / "times", "a") as times:
        times.write(f"{time.time()}\\n")
    if (state / "broken").exists():
        print("error: the token service is unavailable", file=sys.stderr)
        sys.exit(3)
    token = (state / "token").read_text().strip()
    if n == 1 and (state / "revoked-first").exists():
        token, lifetime = "a-token-the-apiserver-does-not-know", 3600.0
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=lifetime)
    print(json.dumps({
        "apiVersion": "client.authentication.k8s.io/v1",
        "kind": "ExecCredential",
        "status": {"token": token, "expirationTimestamp": expiry.strftime("%Y-%m-%dT%H:%M:%S.%fZ")},
    }))
    """
)


@dataclass
class Account:
    """A service account of member-1 and a token for it (TokenRequest API)."""

    namespace: str
    name: str
    token: str

    @property
    def username(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


async def _accounts(lab: Lab, roles: dict[str, str]) -> AsyncIterator[dict[str, Account]]:
    """One service account per name in `roles`, bound cluster-wide to its ClusterRole."""
    async with lab.client(MEMBER) as admin:
        namespace = await make_namespace(admin, f"exec-{uuid.uuid4().hex[:6]}")
        bindings: list[str] = []
        try:
            accounts = {}
            for account, role in roles.items():
                await admin.create(f"/api/v1/namespaces/{namespace}/serviceaccounts", {"metadata": {"name": account}})
                bindings.append(f"vkprovider-test-{namespace}-{account}")
                await admin.create(
                    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
                    {
                        "metadata": {"name": bindings[-1]},
                        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
                    },
                )
                request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}}
                answer = await admin.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", request)
                accounts[account] = Account(namespace, account, answer["status"]["token"])
            yield accounts
        finally:
            for binding in bindings:
                with contextlib.suppress(NotFound):
                    await admin.delete(f"/apis/rbac.authorization.k8s.io/v1/clusterrolebindings/{binding}")
            await delete_namespace(admin, namespace)


@pytest_asyncio.fixture(loop_scope="session")
async def viewer(lab: Lab) -> AsyncIterator[Account]:
    """Bound to `view`: reads everything but Secrets."""
    async for accounts in _accounts(lab, {"exec-viewer": "view"}):
        yield accounts["exec-viewer"]


@pytest_asyncio.fixture(loop_scope="session")
async def operator(lab: Lab) -> AsyncIterator[Account]:
    """What a federation provider needs in a member (nodes, topologies, our pods, namespaces)."""
    async for accounts in _accounts(lab, {"exec-operator": "cluster-admin"}):
        yield accounts["exec-operator"]


def _exec_kubeconfig(lab: Lab, tmp_path: Path, account: Account, *, name: str = "viewer") -> tuple[Path, Path]:
    """member-1's cluster entry (server, CA) with a user whose credential comes from the plugin."""
    admin = yaml.safe_load(lab.kubeconfig(MEMBER).read_text())
    state = tmp_path / f"{name}-plugin"
    state.mkdir()
    (state / "token").write_text(account.token)
    script = tmp_path / "get-token"
    script.write_text(PLUGIN)
    script.chmod(0o755)
    doc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [
            {
                "name": "viewer",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": str(script),
                        "args": [str(state), str(LIFETIME)],
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": MEMBER, "context": {"cluster": admin["clusters"][0]["name"], "user": "viewer"}}],
        "current-context": MEMBER,
    }
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path, state


def _runs(state: Path) -> int:
    return int((state / "runs").read_text())


async def _whoami(client: KubeClient) -> str:
    review = await client.create(
        "/apis/authentication.k8s.io/v1/selfsubjectreviews",
        {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
    )
    return str(review["status"]["userInfo"]["username"])


@pytest.mark.shares_lab
async def test_an_exec_plugin_credential_keeps_working_across_expiries(
    lab: Lab, viewer: Account, tmp_path: Path
) -> None:
    path, state = _exec_kubeconfig(lab, tmp_path, viewer)
    access = load_kubeconfig(path, name=f"member {MEMBER}")
    plugin = access.credentials
    assert isinstance(plugin, ExecPlugin)
    async with KubeClient(access, user_agent="vkprovider-tests-exec") as client:
        assert await _whoami(client) == viewer.username  # the plugin's token, not a certificate
        started = time.monotonic()
        requests = 0
        while time.monotonic() - started < 3 * LIFETIME + 0.5:
            pods = await client.get("/api/v1/pods", params={"limit": 5})  # `view`, in every namespace
            assert pods["kind"] == "PodList"
            await client.get(f"/api/v1/namespaces/{viewer.namespace}/serviceaccounts/{viewer.name}")
            requests += 2
            await asyncio.sleep(0.2)
        assert await _whoami(client) == viewer.username
    # Requests went on for at least three lifetimes, each with a credential still valid (none
    # was refused): obtained at least four times. Renewed a fifth of a lifetime before expiry,
    # never sooner (the client's lead), whatever the machine's speed: gaps of 0.8 lifetimes or
    # more between runs, so not per request either.
    times = [float(t) for t in (state / "times").read_text().split()]
    assert len(times) >= 4, times
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert min(gaps) >= 0.8 * LIFETIME - 0.1, gaps
    assert plugin.runs == _runs(state)
    remaining = plugin.expires_in()
    assert remaining is not None and remaining > 0
    assert client.calls["GET"] == requests  # no request was refused and sent again


@pytest.mark.shares_lab
async def test_a_token_the_apiserver_refuses_is_obtained_again(lab: Lab, viewer: Account, tmp_path: Path) -> None:
    path, state = _exec_kubeconfig(lab, tmp_path, viewer)
    (state / "revoked-first").touch()  # the first token is one the apiserver has never issued
    async with KubeClient(load_kubeconfig(path, name=f"member {MEMBER}")) as client:
        assert await _whoami(client) == viewer.username  # 401, plugin again, sent again
        assert await _whoami(client) == viewer.username
    assert _runs(state) == 2
    assert client.calls["POST"] == 3


@pytest.mark.shares_lab
async def test_a_federation_member_behind_an_exec_plugin_and_one_whose_plugin_fails(
    lab: Lab, operator: Account, tmp_path: Path
) -> None:
    good, good_state = _exec_kubeconfig(lab, tmp_path, operator, name="good")
    broken, broken_state = _exec_kubeconfig(lab, tmp_path, operator, name="broken")
    (broken_state / "broken").touch()
    members = [{"name": MEMBER, "kubeconfig": str(good)}, {"name": "member-x", "kubeconfig": str(broken)}]
    settings = {
        "provider.type": "federation",
        "node.provider_id": "federation",
        "provider.federation": {"members": members, "member_objects": False, "publish_interval": 0.5},
    }
    proc = VkProcess(lab=lab, node=f"vk-exec-{uuid.uuid4().hex[:6]}", workdir=tmp_path, overrides=settings)
    proc.start()
    try:
        await proc.wait_ready()

        async def reported() -> dict[str, Any] | None:
            view = await proc.view()
            ours, other = view["members"].get(MEMBER), view["members"].get("member-x")
            return (
                view
                if ours
                and ours.get("nodes", {}).get("total", 0) > 0  # its nodes listed through the plugin's token
                and ours["reachable"]
                and other
                and other["lastError"]
                else None
            )

        await eventually(reported, timeout=30, what=f"{MEMBER} summarised and member-x failing")
        runs = _runs(good_state)
        await asyncio.sleep(3 * LIFETIME)  # three expiries: the member is still read
        view = await eventually(reported, timeout=10, what=f"{MEMBER} still reachable")
        assert _runs(good_state) >= runs + 2, (runs, _runs(good_state))
        error = view["members"]["member-x"]["lastError"]
        assert "member member-x: exec plugin" in error, error
        assert "failed (exit status 3): error: the token service is unavailable" in error, error
        assert view["members"][MEMBER]["lastError"] is None
        assert proc.proc is not None and proc.proc.poll() is None, proc.tail()
    finally:
        proc.ensure_stopped()
