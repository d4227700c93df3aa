"""Credentials that change: kubeconfig `exec` plugins and `tokenFile`s (vkprovider.kube.credentials).

The plugin is a small Python script written into tmp_path that prints an ExecCredential and
counts its runs in a file; the apiserver is a local aiohttp server that accepts a token only
until the expiry the token carries (so a request with an expired token shows as a 401) and can
be told to refuse tokens outright. The same plugin runs against a real apiserver in
tests/e2e/test_kubeconfig.py.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import yaml
from aiohttp import web

from e2e import pki
from vkprovider.kube import KubeClient, Unauthorized
from vkprovider.kube.access import ClusterAccess, KubeconfigError, load_kubeconfig, parse_kubeconfig
from vkprovider.kube.credentials import ExecPlugin, TokenFile
from vkprovider.kube.errors import NoCredentials

WHO = "member member-1"

PLUGIN = textwrap.dedent(
    '''
    """A fake exec credential plugin; what it prints is steered by files in its state directory."""
    import datetime, json, os, pathlib, sys

    state = pathlib.Path(sys.argv[1])
    runs = state / "runs"
    n = int(runs.read_text()) + 1 if runs.exists() else 1
    runs.write_text(str(n))
    (state / f"info-{n}.json").write_text(os.environ.get("KUBERNETES_EXEC_INFO", ""))
    mode = (state / "mode").read_text().strip() if (state / "mode").exists() else "token"
    lifetime = float((state / "lifetime").read_text()) if (state / "lifetime").exists() else 3600.0
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=lifetime)
    stamp = expiry.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    if mode == "slow-fail":
        import time
        time.sleep(1.5)
    if mode in ("fail", "slow-fail"):
        print("error: no credentials for you", file=sys.stderr)
        sys.exit(3)
    if mode == "garbage":
        print("Please log in at https://login.example/device")
        sys.exit(0)
    status = {"token": f"tok-{n}-{expiry.timestamp():.3f}", "expirationTimestamp": stamp}
    if mode == "cert":
        pair = (state / "pair").read_text().strip()
        status = {
            "clientCertificateData": (state / f"{pair}.crt").read_text(),
            "clientKeyData": (state / f"{pair}.key").read_text(),
            "expirationTimestamp": stamp,
        }
    if mode == "nothing":
        status = {}
    if mode == "same":
        status = {"token": "tok-same-9999999999"}
    kind = "Credential" if mode == "wrong-kind" else "ExecCredential"
    version = "client.authentication.k8s.io/v1beta1" if mode == "wrong-version" else "client.authentication.k8s.io/v1"
    print(json.dumps({"apiVersion": version, "kind": kind, "status": status}))
    '''
)


@dataclass
class FakeApiserver:
    """Answers GET /api with 200 for a token that has not expired and is not refused, else 401."""

    url: str = ""
    seen: list[str] = field(default_factory=list)
    refused: set[str] = field(default_factory=set)  # token prefixes ("tok-1-") answered with 401
    refuse_all: bool = False
    unauthorized: int = 0
    expired: int = 0
    client_names: list[str] = field(default_factory=list)  # common names of client certificates

    async def handle(self, request: web.Request) -> web.Response:
        peer = request.transport.get_extra_info("peercert") if request.transport else None
        if peer:
            self.client_names.append(dict(x[0] for x in peer["subject"])["commonName"])
            return web.json_response({"kind": "APIVersions"})
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.seen.append(token)
        expiry = float(token.rsplit("-", 1)[-1]) if token.startswith("tok-") else float("inf")
        if time.time() > expiry:
            self.expired += 1
        if self.refuse_all or time.time() > expiry or any(token.startswith(p) for p in self.refused):
            self.unauthorized += 1
            return web.json_response({"kind": "Status", "reason": "Unauthorized", "message": "no"}, status=401)
        return web.json_response({"kind": "APIVersions"})


async def _serve(api: FakeApiserver, ssl_context: ssl.SSLContext | None = None) -> web.AppRunner:
    app = web.Application()
    app.router.add_get("/api", api.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl_context)
    await site.start()
    port = runner.addresses[0][1]
    api.url = f"{'https' if ssl_context else 'http'}://127.0.0.1:{port}"
    return runner


@pytest_asyncio.fixture(loop_scope="session")
async def api() -> AsyncIterator[FakeApiserver]:
    server = FakeApiserver()
    runner = await _serve(server)
    yield server
    await runner.cleanup()


def _plugin(tmp_path: Path, *, mode: str = "token", lifetime: float = 3600.0) -> Path:
    state = tmp_path / "plugin"
    state.mkdir(exist_ok=True)
    (tmp_path / "plugin.py").write_text(PLUGIN)
    (state / "mode").write_text(mode)
    (state / "lifetime").write_text(str(lifetime))
    return state


def _runs(state: Path) -> int:
    runs = state / "runs"
    return int(runs.read_text()) if runs.exists() else 0


def _kubeconfig(server: str, user: dict[str, Any], *, cluster: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "m1", "cluster": {"server": server, **(cluster or {})}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "m1", "context": {"cluster": "m1", "user": "u"}}],
        "current-context": "m1",
    }


def _exec(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "exec": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": sys.executable,
            "args": [str(tmp_path / "plugin.py"), str(tmp_path / "plugin")],
            "interactiveMode": "Never",
            **extra,
        }
    }


def _exec_access(tmp_path: Path, server: str, **extra: Any) -> ClusterAccess:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(_kubeconfig(server, _exec(tmp_path, **extra))))
    return load_kubeconfig(path, name=WHO)


async def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.05)


def _plugin_of(access: ClusterAccess) -> ExecPlugin:
    assert isinstance(access.credentials, ExecPlugin)
    return access.credentials


async def test_the_plugins_token_is_sent_and_kept_until_it_nears_its_expiry(tmp_path: Path, api: FakeApiserver) -> None:
    state = _plugin(tmp_path)
    access = _exec_access(tmp_path, api.url, provideClusterInfo=True)
    assert _runs(state) == 0  # parsing runs nothing; the first request does
    async with KubeClient(access) as client:
        for _ in range(3):
            await client.get("/api")
    assert _runs(state) == 1 and _plugin_of(access).runs == 1
    assert len(api.seen) == 3 and len(set(api.seen)) == 1 and api.seen[0].startswith("tok-1-")
    info = json.loads((state / "info-1.json").read_text())
    assert info["kind"] == "ExecCredential" and info["apiVersion"] == "client.authentication.k8s.io/v1"
    assert info["spec"]["interactive"] is False and info["spec"]["cluster"]["server"] == api.url


async def test_a_short_lived_token_is_renewed_before_it_expires(tmp_path: Path, api: FakeApiserver) -> None:
    state = _plugin(tmp_path, lifetime=3.0)
    access = _exec_access(tmp_path, api.url)
    async with KubeClient(access) as client:
        deadline = time.monotonic() + 6.5  # two lifetimes and then some
        while time.monotonic() < deadline:
            await client.get("/api")
            await asyncio.sleep(0.05)
    assert api.unauthorized == 0 and api.expired == 0  # never sent an expired token
    assert _runs(state) >= 3 and len(set(api.seen)) == _runs(state)
    plugin = _plugin_of(access)
    remaining = plugin.expires_in()
    assert remaining is not None and remaining > 0


async def test_concurrent_requests_share_one_run_of_the_plugin(tmp_path: Path, api: FakeApiserver) -> None:
    state = _plugin(tmp_path)
    access = _exec_access(tmp_path, api.url)
    async with KubeClient(access) as a, KubeClient(access) as b:
        await asyncio.gather(*(c.get("/api") for c in (a, b) for _ in range(10)))
    assert _runs(state) == 1 and len(api.seen) == 20


async def test_a_refused_token_is_obtained_again_once(tmp_path: Path, api: FakeApiserver) -> None:
    state = _plugin(tmp_path)
    api.refused = {"tok-1-"}  # revoked before its expiry
    access = _exec_access(tmp_path, api.url)
    async with KubeClient(access) as client:
        await client.get("/api")
        await client.get("/api")
    assert _runs(state) == 2
    assert [t.split("-")[1] for t in api.seen] == ["1", "2", "2"]
    assert client.calls["GET"] == 3


async def test_the_401_stands_when_the_new_token_is_refused_too(tmp_path: Path, api: FakeApiserver) -> None:
    state = _plugin(tmp_path)
    api.refuse_all = True
    access = _exec_access(tmp_path, api.url)
    async with KubeClient(access) as client:
        with pytest.raises(Unauthorized):
            await client.get("/api")
    assert _runs(state) == 2 and len(api.seen) == 2  # one more run, one more request, no loop


async def test_the_401_stands_when_the_plugin_gives_the_same_token(tmp_path: Path, api: FakeApiserver) -> None:
    state = _plugin(tmp_path, mode="same")
    api.refuse_all = True
    access = _exec_access(tmp_path, api.url)
    async with KubeClient(access) as client:
        with pytest.raises(Unauthorized):
            await client.get("/api")
    assert _runs(state) == 2 and api.seen == ["tok-same-9999999999"]  # not sent again unchanged


async def test_the_pause_after_a_failure_counts_from_its_end(tmp_path: Path, api: FakeApiserver) -> None:
    """A plugin that fails after 1.5 s (longer than the 1 s pause) is not started again by the
    next request: the pause began when the failure was known."""
    _plugin(tmp_path, mode="slow-fail")
    access = _exec_access(tmp_path, api.url)
    async with KubeClient(access) as client:
        for _ in range(2):
            with pytest.raises(NoCredentials, match="exit status 3"):
                await client.get("/api")
    assert _plugin_of(access).runs == 1


async def test_a_failed_early_renewal_keeps_the_current_token_until_it_expires(
    tmp_path: Path, api: FakeApiserver
) -> None:
    # The renewal starts a fifth of the lifetime before the expiry: 2 s for the failing plugin
    # to run in (a Python start took more than 0.8 s on a loaded CI machine).
    state = _plugin(tmp_path, lifetime=10.0)
    access = _exec_access(tmp_path, api.url)
    plugin = _plugin_of(access)
    async with KubeClient(access) as client:
        await client.get("/api")
        (state / "mode").write_text("fail")
        await _until(plugin.stale)
        await client.get("/api")  # renewal due and failing: the token still holds
        assert _runs(state) == 2 and len(set(api.seen)) == 1
        await _until(lambda: (plugin.expires_in() or 0) <= 0)
        await asyncio.sleep(1.0)  # past the pause after a failure
        with pytest.raises(NoCredentials, match="exit status 3"):
            await client.get("/api")
        (state / "mode").write_text("token")
        await asyncio.sleep(1.0)
        await client.get("/api")
    assert api.unauthorized == 0


@pytest.mark.parametrize(
    ("mode", "extra", "reason"),
    [
        ("fail", {}, r"failed \(exit status 3\): error: no credentials for you"),
        ("garbage", {}, r"did not print an ExecCredential \(not JSON"),
        ("wrong-kind", {}, r"printed 'Credential', not an ExecCredential"),
        ("wrong-version", {}, r"answered in 'client.authentication.k8s.io/v1beta1'"),
        ("nothing", {}, r"neither a token nor a client certificate"),
        (
            "token",
            {"command": "/nonexistent/aws-iam-authenticator", "installHint": "Install it:\n  brew install x"},
            r"'/nonexistent/aws-iam-authenticator' not found \(Install it: brew install x\)",
        ),
        ("token", {"command": "no-such-plugin-anywhere"}, r"'no-such-plugin-anywhere' not found"),
    ],
)
async def test_a_plugin_that_cannot_give_a_credential_fails_the_request_clearly(
    tmp_path: Path, api: FakeApiserver, mode: str, extra: dict[str, Any], reason: str
) -> None:
    _plugin(tmp_path, mode=mode)
    access = _exec_access(tmp_path, api.url, **extra)
    async with KubeClient(access) as client:
        with pytest.raises(NoCredentials, match=f"^0 NoCredentials: member member-1: exec plugin .*{reason}") as caught:
            await client.get("/api")
        assert caught.value.reason == "NoCredentials" and caught.value.status == 0
        # A broken plugin is not started again by every request.
        with pytest.raises(NoCredentials):
            await client.get("/api")
    assert api.seen == []
    assert _plugin_of(access).runs == 1


async def test_a_hanging_plugin_is_killed(tmp_path: Path, api: FakeApiserver) -> None:
    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(60)\n")
    access = _exec_access(tmp_path, api.url, args=[str(script)])
    plugin = _plugin_of(access)
    plugin._timeout = 0.5
    async with KubeClient(access) as client:
        with pytest.raises(NoCredentials, match="did not finish within"):
            await client.get("/api")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update({"current-context": "nope"}), "kubeconfig has no context named 'nope'"),
        (lambda d: d["contexts"][0]["context"].update(user="ghost"), "kubeconfig has no user named 'ghost'"),
        (lambda d: d["contexts"][0]["context"].update(cluster="gone"), "kubeconfig has no cluster named 'gone'"),
        (lambda d: d.pop("current-context"), "no current-context"),
        (lambda d: d["users"][0]["user"]["exec"].pop("command"), "exec plugin in the kubeconfig: .*'command'"),
        (lambda d: d["users"][0]["user"]["exec"].update(interactiveMode="Always"), "needs a terminal"),
        (
            lambda d: d["users"][0]["user"]["exec"].update(apiVersion="client.authentication.k8s.io/v1alpha1"),
            "apiVersion 'client.authentication.k8s.io/v1alpha1' is not one of",
        ),
        (lambda d: d["users"][0].update(user={"auth-provider": {"name": "gcp"}}), "auth-provider"),
        (lambda d: d["clusters"][0]["cluster"].update({"certificate-authority": "ca.pem"}), "cannot read certificate"),
        (lambda d: d.pop("clusters"), "kubeconfig is not usable: Expected key clusters"),
        (lambda d: d.update(contexts="x"), "kubeconfig is malformed"),
        (lambda d: d["users"][0].update(user="oops"), "kubeconfig is malformed"),
    ],
)
def test_an_unusable_kubeconfig_names_its_user_and_the_reason(tmp_path: Path, change: Any, message: str) -> None:
    doc = _kubeconfig("https://h:6443", _exec(tmp_path))
    change(doc)
    with pytest.raises(KubeconfigError, match=f"^member member-1: .*{message}"):
        parse_kubeconfig(doc, base=tmp_path, name=WHO)


def test_an_unreadable_kubeconfig_file_names_its_user(tmp_path: Path) -> None:
    with pytest.raises(KubeconfigError, match=r"^member member-1: cannot read kubeconfig"):
        load_kubeconfig(tmp_path / "missing", name=WHO)
    (tmp_path / "bad").write_text("a: [")
    with pytest.raises(KubeconfigError, match=r"^member member-1: kubeconfig .* is not valid YAML"):
        load_kubeconfig(tmp_path / "bad", name=WHO)


def test_a_relative_plugin_command_is_found_next_to_the_kubeconfig(tmp_path: Path) -> None:
    doc = _kubeconfig("https://h:6443", _exec(tmp_path, command="./bin/get-token"))
    access = parse_kubeconfig(doc, base=tmp_path / "conf", name=WHO)
    assert _plugin_of(access).args[0] == str(tmp_path / "conf" / "bin" / "get-token")
    doc = _kubeconfig("https://h:6443", _exec(tmp_path, command="aws"))
    assert _plugin_of(parse_kubeconfig(doc, base=tmp_path)).args[0] == "aws"


def test_a_token_file_is_read_again_at_most_once_a_period(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("one\n")
    now = [100.0]
    source = TokenFile(str(path), name=WHO, clock=lambda: now[0])
    assert source.token() == "one"
    path.write_text("two\n")
    now[0] += 59.0
    assert source.token() == "one" and source.reads == 1
    now[0] += 1.0
    assert source.token() == "two" and source.reads == 2 and source.version == 2
    path.unlink()  # rotated away for a moment: the last token is kept
    now[0] += 60.0
    assert source.token() == "two"
    missing = TokenFile(str(tmp_path / "nothing"), name=WHO)
    with pytest.raises(KubeconfigError, match=r"^member member-1: cannot read token file"):
        missing.token()


async def test_a_token_file_is_read_again_at_once_on_401(tmp_path: Path, api: FakeApiserver) -> None:
    path = tmp_path / "token"
    path.write_text("old\n")
    access = parse_kubeconfig(_kubeconfig(api.url, {"tokenFile": "token"}), base=tmp_path, name=WHO)
    api.refused = {"old"}
    async with KubeClient(access) as client:
        with pytest.raises(Unauthorized):
            await client.get("/api")  # read again, unchanged: the 401 stands
        path.write_text("new\n")
        await client.get("/api")  # refused, read again, sent again
    assert api.seen == ["old", "old", "new"]


async def test_a_token_file_that_cannot_be_read_fails_the_request_clearly(tmp_path: Path, api: FakeApiserver) -> None:
    access = ClusterAccess(server=api.url, token_file=str(tmp_path / "absent"), name=WHO)
    async with KubeClient(access) as client:
        with pytest.raises(NoCredentials, match=r"NoCredentials: member member-1: cannot read token file"):
            await client.get("/api")


def _pairs(state: Path) -> tuple[pki.KeyPair, pki.KeyPair]:
    ca = pki.make_ca("fake-ca")
    (state / "ca.crt").write_bytes(ca.cert_pem)
    for who in ("first", "second"):
        pair = pki.issue(ca, who, client=True)
        (state / f"{who}.crt").write_bytes(pair.cert_pem)
        (state / f"{who}.key").write_bytes(pair.key_pem)
    server = pki.issue(ca, "apiserver", ip_addresses=("127.0.0.1",), server=True)
    return ca, server


async def test_a_client_certificate_from_the_plugin_is_used_and_follows_its_changes(tmp_path: Path) -> None:
    state = _plugin(tmp_path, mode="cert", lifetime=3600)
    (state / "pair").write_text("first")
    ca, server_pair = _pairs(state)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    server_ctx.load_verify_locations(cadata=ca.cert_pem.decode())
    server_pair.write(tmp_path, "server")
    server_ctx.load_cert_chain(tmp_path / "server.crt", tmp_path / "server.key")
    api = FakeApiserver()
    runner = await _serve(api, server_ctx)
    try:
        path = tmp_path / "kubeconfig"
        cluster = {"certificate-authority": str(state / "ca.crt")}
        path.write_text(yaml.safe_dump(_kubeconfig(api.url, _exec(tmp_path), cluster=cluster)))
        access = load_kubeconfig(path, name=WHO)
        async with KubeClient(access) as client:
            await client.get("/api")
            assert access.tls_version == 1
            await client.get("/api")  # same certificate: same SSL context, same connection
            (state / "pair").write_text("second")
            assert await access.refresh(rejected=access.version)  # as after a 401
            assert access.tls_version == 2
            await client.get("/api")
        assert api.client_names == ["first", "first", "second"]
        assert _runs(state) == 2
    finally:
        await runner.cleanup()


async def test_a_certificate_that_does_not_load_is_a_clear_error(tmp_path: Path, api: FakeApiserver) -> None:
    state = _plugin(tmp_path, mode="cert")
    (state / "pair").write_text("broken")
    (state / "broken.crt").write_text("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    (state / "broken.key").write_text("nope")
    access = _exec_access(tmp_path, api.url)
    async with KubeClient(access) as client:
        with pytest.raises(NoCredentials, match="client certificate and key that cannot be used"):
            await client.get("/api")


def test_static_credentials_are_unchanged(tmp_path: Path) -> None:
    access = parse_kubeconfig(_kubeconfig("https://h/", {"token": "t"}), base=tmp_path)
    assert access.bearer_token() == "t" and not access.stale() and access.version == 0
    assert access.credentials is None and access.name == "m1"


# -- members: an unusable kubeconfig is the member's error, not the process's -------------------


async def test_a_configured_member_whose_kubeconfig_cannot_be_used_reports_it_and_recovers(tmp_path: Path) -> None:
    from federation.config import FederationConfig, MemberConfig
    from federation.members.member import DirectSource, UnusableSource
    from federation.provider import FederationProvider

    path = tmp_path / "member-1.yaml"
    doc = _kubeconfig("http://127.0.0.1:9", {"token": "t"})
    doc["current-context"] = "gone"
    path.write_text(yaml.safe_dump(doc))
    config = FederationConfig(members=[MemberConfig(name="member-1", kubeconfig=path)], member_objects=False)
    provider = FederationProvider(config, node_name="vk")
    provider.fleet.kubeconfig_retry = 0.05
    provider.fleet.add_configured_member(config.members[0])
    try:
        member = provider.fleet.members["member-1"]
        assert isinstance(member.source, UnusableSource) and member.pods is None
        view = provider.view()["members"]["member-1"]
        assert view["lastError"] == "member member-1: kubeconfig has no context named 'gone'"
        doc["current-context"] = "m1"
        path.write_text(yaml.safe_dump(doc))  # fixed: the member starts
        await _until(lambda: isinstance(provider.fleet.members["member-1"].source, DirectSource))
        assert provider.fleet.members["member-1"].pods is not None
    finally:
        tasks = [t for m in provider.fleet.members.values() for t in (m.task, m.pods_task) if t is not None]
        for name in list(provider.fleet.members):
            provider.fleet.remove_member(name, quiet=True)
        await asyncio.gather(*tasks, return_exceptions=True)


class _FrontEnd:
    """The front-end calls a MemberCluster object makes: its Secret, and its status."""

    def __init__(self, kubeconfig: bytes) -> None:
        self.secret = {"data": {"kubeconfig": base64.b64encode(kubeconfig).decode()}}
        self.statuses: list[dict[str, Any]] = []

    async def get(self, path: str, *, params: Any = None) -> dict[str, Any]:
        return self.secret

    async def patch(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.statuses.append(body["status"])
        return body


@pytest.mark.parametrize(
    ("kubeconfig", "reason"),
    [
        (b"clusters: [", "member member-1: key kubeconfig of secret m1 is not a kubeconfig"),
        (b"- just\n- a list\n", "member member-1: key kubeconfig of secret m1 is not a kubeconfig"),
        (
            yaml.safe_dump(_kubeconfig("https://h", {"exec": {"command": "aws"}})).encode(),
            "member member-1: exec plugin in the kubeconfig: malformed request. missing key 'apiVersion'",
        ),
        # Well-formed, but a Secret's writer may not run programs or read files in the provider
        # unless its settings allow them (none by default).
        (
            yaml.safe_dump(
                _kubeconfig("https://h", {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws"}})
            ).encode(),
            "member member-1: the kubeconfig in secret m1 is refused: its exec plugin command 'aws' is not on the "
            "provider's allow list",
        ),
        (
            yaml.safe_dump(_kubeconfig("https://h", {"tokenFile": "/etc/shadow"})).encode(),
            "member member-1: the kubeconfig in secret m1 is refused: its tokenFile '/etc/shadow' is outside",
        ),
    ],
)
async def test_a_member_object_whose_kubeconfig_cannot_be_used_says_why(kubeconfig: bytes, reason: str) -> None:
    from federation.config import FederationConfig
    from federation.members.objects import MemberObjects
    from federation.provider import FederationProvider

    provider = FederationProvider(FederationConfig(), node_name="vk")
    front = _FrontEnd(kubeconfig)
    obj = {
        "metadata": {"name": "member-1"},
        "spec": {"kubeconfigSecretRef": {"namespace": "vk", "name": "m1", "key": "kubeconfig"}},
    }
    await MemberObjects(provider.fleet, front, selector="", node="vk").apply(obj)  # type: ignore[arg-type]
    assert "member-1" not in provider.fleet.members
    [condition] = front.statuses[-1]["conditions"]
    assert (condition["type"], condition["status"], condition["reason"]) == ("Ready", "False", "InvalidSpec")
    assert condition["message"].startswith(reason)


def test_a_secrets_kubeconfig_may_name_only_allowed_commands_and_paths() -> None:
    from federation.members.objects import SecretAllowance, secret_refusal

    allow = SecretAllowance(commands=("kubelogin",), paths=("/var/run/secrets/members",))
    assert secret_refusal(_kubeconfig("https://h", {"exec": {"command": "kubelogin"}}), allow) is None
    assert secret_refusal(_kubeconfig("https://h", {"tokenFile": "/var/run/secrets/members/m1/token"}), allow) is None
    refused = secret_refusal(_kubeconfig("https://h", {"exec": {"command": "/usr/bin/kubelogin"}}), allow)
    assert refused is not None and "'/usr/bin/kubelogin'" in refused  # exactly as written
    escaped = {"tokenFile": "/var/run/secrets/members/../../../etc/shadow"}
    assert secret_refusal(_kubeconfig("https://h", escaped), allow) is not None  # normalised first
    ca = _kubeconfig("https://h", {}, cluster={"certificate-authority": "/tmp/ca.crt"})
    assert "certificate-authority" in (secret_refusal(ca, allow) or "")
    assert secret_refusal(_kubeconfig("https://h", {"token": "t"}), SecretAllowance()) is None
