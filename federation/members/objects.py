"""MemberCluster objects in the front end: members added, changed, disabled and removed while the
provider runs, and each object's status written back (reachable, ready, what it lends).

The fleet owns the set of members (federation.members.fleet); this module reads the objects,
decides what each change means for a member (`change`, pure), and asks the fleet to do it
through `MemberSet`. A member that still runs our pods is disabled or removed by draining it
(reclaim notices first), not at once. Every object in use carries our finalizer (`FINALIZER`),
so a deletion waits for that drain, and a restarted provider finds it and drains again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml

from federation import labels, podsecurity
from federation.config import CapacityConfig, MemberConfig, ReclaimConfig, TenancyConfig
from federation.members import outages
from federation.members.member import Member
from federation.members.tokens import TokenStore
from vkprovider import logs
from vkprovider.kube import ApiError, ClusterAccess, Conflict, KubeClient, NotFound
from vkprovider.kube.access import KubeconfigError, parse_kubeconfig
from vkprovider.podstatus import now_rfc3339
from vkprovider.provider import ProviderError

#: What an object's new state means for the member of its name: "ignore" (a member of that name
#: comes from the settings), "unchanged", "drain" (disabled while our pods run there: the
#: provider drains it unless none does), "in_place" (reached the same way: settings applied,
#: watches and notices kept), or "add" (new, or reached another way: started afresh).
Change = Literal["ignore", "unchanged", "drain", "in_place", "add"]

#: Ours, on every MemberCluster the provider uses. Why: draining a member (our pods there leave
#: through reclaim notices, then the member goes) is work of this process, and a deleted object
#: without a finalizer vanishes at once: a provider restarted in the middle of that drain (a
#: rollout, an OOM kill) would no longer know the member, and our pods left there would run on
#: for good while their front-end pods never end. With it, a deleted object stays (with its
#: deletionTimestamp) until no pod of ours is left there, so the next process drains it again,
#: keeping the notices' deadlines (they are annotations on the pods). Who takes it off: the
#: provider once the member is drained (at once when none of ours runs there, or when nothing can
#: reach the member any more: its kubeconfig Secret gone or unusable), and `vkprovider drain`
#: (the chart's pre-delete hook) for the objects it deletes. A provider uninstalled without that
#: hook leaves it behind, and deleting the object then waits forever; take it off by hand:
#: `kubectl patch membercluster NAME --type=json -p '[{"op":"remove","path":"/metadata/finalizers"}]'`.
#: One name for every instance: a MemberCluster is one instance's (docs/benchmarks.md, "several instances").
FINALIZER = "vkprovider.io/drain"

#: How long a finalizer that could not be taken off waits before the next try.
RELEASE_RETRY = 10.0


class MemberSet(Protocol):
    """What MemberCluster objects may do to the provider's members."""

    members: dict[str, Member]
    started: asyncio.Event

    def add_member(
        self,
        config: MemberConfig,
        access: ClusterAccess | None,
        *,
        from_object: bool = False,
        store: TokenStore | None = None,
        removed: bool = False,
        settled: bool = False,
    ) -> None: ...

    def notify_drained_away(self, callback: Callable[[str], None]) -> None: ...

    def remove_member(self, name: str, *, quiet: bool = False) -> None: ...

    def drain(self, member: Member, config: MemberConfig, *, removed: bool) -> bool: ...

    def reconfigure(self, member: Member, config: MemberConfig) -> None: ...


def change(existing: Member | None, config: MemberConfig) -> Change:
    if existing is None:
        return "add"
    if not existing.from_object:
        return "ignore"
    if existing.config == config:
        return "unchanged"
    if not config.enabled and existing.config.enabled:
        return "drain"
    if same_connection(existing.config, config) and config.enabled and (existing.draining or existing.config.enabled):
        return "in_place"
    return "add"


class MemberObjects:
    """Follows the MemberCluster objects `selector` picks, for the lifetime of `run`."""

    def __init__(
        self,
        members: MemberSet,
        client: KubeClient,
        *,
        selector: str,
        node: str,
        allow: SecretAllowance | None = None,
    ) -> None:
        self._members = members
        self._client = client
        self._allow = allow or SecretAllowance()
        self._selector = {"labelSelector": selector} if selector else None
        self._log = logs.get("federation", node=node)
        #: Objects whose finalizer is to come off (their member drained away), with when to try.
        self._releasing: dict[str, float] = {}
        members.notify_drained_away(self._release_soon)

    async def apply(self, obj: dict[str, Any]) -> None:
        """One object's current state."""
        name = obj["metadata"]["name"]
        existing = self._members.members.get(name)
        if existing is not None and not existing.from_object:
            self._log.warning("MemberCluster ignored: a member of that name is in the settings", cluster=name)
            return
        if obj["metadata"].get("deletionTimestamp"):
            await self._deleting(obj, existing)
            return
        try:
            config = member_from_object(obj)
            # An agent-fed member without a kubeconfig only lends; with one, our pods go there.
            has_secret = bool((obj.get("spec") or {}).get("kubeconfigSecretRef"))
            access = (
                await access_from_secret(self._client, obj, self._allow)
                if config.source == "direct" or has_secret
                else None
            )
        except (ApiError, ProviderError, ValueError) as exc:
            self._log.warning("MemberCluster cannot be used", cluster=name, error=str(exc))
            await self._patch_status(
                name, {"conditions": [_condition("Ready", False, "InvalidSpec", str(exc)[:500], now_rfc3339())]}
            )
            return
        await self._hold(obj)
        what = change(existing, config)
        if existing is not None and what == "drain" and self._members.drain(existing, config, removed=False):
            return
        if existing is not None and what == "in_place":
            self._members.reconfigure(existing, config)
        elif what in ("add", "drain"):  # a drain with none of our pods there: at once
            store = KubeconfigSecret(self._client, obj) if config.tenancy is not None and access else None
            self._members.add_member(config, access, from_object=True, store=store, settled=what == "drain")

    async def _deleting(self, obj: dict[str, Any], existing: Member | None) -> None:
        """An object being deleted (kept by finalizers): its member is drained, then goes, and
        our finalizer comes off. One this process does not know (a restart in the middle of
        its drain, or deleted while no provider ran) is added disabled and removed, so it is
        drained again from what the member holds."""
        name = obj["metadata"]["name"]
        if existing is not None:
            self._gone(name)
            await self._release_due()
            return
        if FINALIZER not in (obj["metadata"].get("finalizers") or []):
            return  # never ours (or already let go): nothing of ours to finish
        if name in self._releasing:  # drained away already, being let go
            await self._release_due()
            return
        try:
            config = member_from_object(obj).model_copy(update={"enabled": False})
            has_secret = bool((obj.get("spec") or {}).get("kubeconfigSecretRef"))
            access = (
                await access_from_secret(self._client, obj, self._allow)
                if config.source == "direct" or has_secret
                else None
            )
        except (NotFound, ValueError) as exc:
            # Nothing can reach the member any more: holding the object would only block it.
            self._log.warning(
                "deleted MemberCluster let go undrained: its kubeconfig cannot be used", cluster=name, error=str(exc)
            )
            self._release_soon(name)
            await self._release_due()
            return
        except ApiError as exc:
            self._log.warning("deleted MemberCluster not drained yet", cluster=name, error=str(exc))
            return
        if access is None:  # it only lends: none of our pods goes there
            self._release_soon(name)
            await self._release_due()
            return
        store = KubeconfigSecret(self._client, obj) if config.tenancy is not None else None
        self._members.add_member(config, access, from_object=True, store=store, removed=True)

    def _gone(self, name: str) -> bool:
        """The member of an object deleted (or no longer selected) drained, or removed at once
        (True; its object is then let go of)."""
        member = self._members.members.get(name)
        if member is None or not member.from_object:
            return False
        if self._members.drain(member, member.config.model_copy(update={"enabled": False}), removed=True):
            return False
        self._members.remove_member(name)
        self._release_soon(name)
        return True

    async def _hold(self, obj: dict[str, Any]) -> None:
        """Our finalizer on an object in use (see FINALIZER)."""
        body = finalizers_patch(obj, held=True)
        if body is None:
            return
        name = obj["metadata"]["name"]
        try:
            await self._client.patch(f"{labels.MEMBERS_PATH}/{name}", body)
        except Conflict:
            pass  # changed meanwhile: its next event comes here again
        except ApiError as exc:
            self._log.warning(
                "MemberCluster finalizer not added: deleting it while it drains would leave pods behind after a "
                "restart",
                cluster=name,
                error=str(exc),
            )

    def _release_soon(self, name: str) -> None:
        self._releasing[name] = 0.0

    async def _release_due(self) -> None:
        """Our finalizer off the objects whose member drained away (retried while refused).
        Called from the watch and from the status writer alike: an entry is taken (due never)
        before the request, so two callers do not release one object at once."""
        now = time.monotonic()
        for name, due in sorted(self._releasing.items()):
            if due > now:
                continue
            if name in self._members.members:  # in use again (selected again): it keeps its finalizer
                self._releasing.pop(name, None)
                continue
            self._releasing[name] = math.inf
            try:
                if await release(self._client, name):
                    self._releasing.pop(name, None)
                    self._log.info("MemberCluster let go", cluster=name)
                    continue
            except ApiError as exc:
                self._log.warning("MemberCluster finalizer not removed", cluster=name, error=str(exc))
            self._releasing[name] = now + RELEASE_RETRY

    async def run(self) -> None:
        """List, then watch; the provider's `started` is set after the first list (or the first
        failure: configured members are used rather than waiting on the front end)."""
        while True:
            try:
                listed = await self._client.list(labels.MEMBERS_PATH, params=self._selector)
                seen = set()
                for obj in listed["items"]:
                    seen.add(obj["metadata"]["name"])
                    await self.apply(obj)
                for name in [n for n, m in self._members.members.items() if m.from_object and n not in seen]:
                    self._gone(name)
                self._members.started.set()
                rv = listed["metadata"]["resourceVersion"]
                while True:
                    async for event in self._client.watch(
                        labels.MEMBERS_PATH, resource_version=rv, params=self._selector
                    ):
                        obj = event["object"]
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if event["type"] == "BOOKMARK":
                            continue
                        if event["type"] == "DELETED":
                            self._gone(obj["metadata"]["name"])
                            await self._release_due()
                        else:
                            await self.apply(obj)
            except NotFound:
                self._log.warning("the MemberCluster CRD is not installed; only configured members are used")
                self._members.started.set()
                await asyncio.sleep(30)
            except ApiError as exc:
                self._log.warning("MemberCluster watch failed", error=str(exc))
                self._members.started.set()
                await asyncio.sleep(2)

    async def _patch_status(self, name: str, status: dict[str, Any]) -> None:
        try:
            await self._client.patch(f"{labels.MEMBERS_PATH}/{name}/status", {"status": status}, patch_type="merge")
        except ApiError as exc:
            self._log.debug("MemberCluster status not written", cluster=name, error=str(exc))

    async def write_statuses(self) -> None:
        """Each object's status, when it changed (or every 30 s, as a heartbeat); and our
        finalizer off the objects whose member drained away since."""
        await self._release_due()
        for member in list(self._members.members.values()):
            if not member.from_object:
                continue
            source = member.source
            reachable = member.reachable and member.config.enabled
            reason = "Reachable" if reachable else ("Disabled" if not member.config.enabled else "Unreachable")
            message = "member answers" if reachable else (source.last_error or "no answer from the member")
            conditions = [_condition("Reachable", reachable, reason, message, "")]
            ready = (reachable and source.synced.is_set(), reason, message)
            keeper = member.keeper
            if keeper is not None:
                accepted = not keeper.rejected
                reason = "Accepted" if accepted else "Rejected"
                conditions.append(_condition("Credential", accepted, reason, keeper.describe(), ""))
                if not accepted:
                    ready = (False, "CredentialRejected", keeper.describe())
            status: dict[str, Any] = {
                "conditions": [*conditions, _condition("Ready", *ready, "")],
                "capacity": member.summary.to_json() if member.summary and reachable else {},
            }
            comparable = json.dumps(status, sort_keys=True)
            if (
                member.status_written.get("json") == comparable
                and time.monotonic() - member.status_written.get("at", 0) < 30
            ):
                continue
            now = now_rfc3339()
            for cond in status["conditions"]:
                cond["lastTransitionTime"] = now
            if source.last_contact_wall:
                status["lastContact"] = outages.rfc3339(source.last_contact_wall)
            await self._patch_status(member.name, status)
            member.status_written = {"json": comparable, "at": time.monotonic()}


def finalizers_patch(obj: dict[str, Any], *, held: bool) -> dict[str, Any] | None:
    """The merge patch that puts our finalizer on an object (`held`) or takes it off, others
    kept; guarded by the object's resourceVersion (a Conflict: read it again). None: nothing
    to change."""
    meta = obj["metadata"]
    current = list(meta.get("finalizers") or [])
    if (FINALIZER in current) == held:
        return None
    wanted = [*current, FINALIZER] if held else [f for f in current if f != FINALIZER]
    return {"metadata": {"finalizers": wanted, "resourceVersion": meta.get("resourceVersion")}}


async def release(front: KubeClient, name: str) -> bool:
    """Our finalizer off MemberCluster `name` (a deleted one then goes). False when it kept
    changing under us; other refusals raise ApiError."""
    path = f"{labels.MEMBERS_PATH}/{name}"
    for _ in range(5):
        try:
            body = finalizers_patch(await front.get(path), held=False)
            if body is not None:
                await front.patch(path, body)
            return True
        except NotFound:
            return True
        except Conflict:
            continue
    return False


def member_from_object(obj: dict[str, Any]) -> MemberConfig:
    """The member a MemberCluster object declares (its kubeconfig is read separately)."""
    spec = obj.get("spec") or {}
    return MemberConfig(
        name=obj["metadata"]["name"],
        enabled=spec.get("enabled", True),
        weight=spec.get("weight", 1),
        capacity=CapacityConfig.model_validate(spec.get("capacity") or {}),
        network_pod_label=spec.get("networkPodLabel") or MemberConfig.model_fields["network_pod_label"].default,
        source=spec.get("source", "direct"),
        agent_address=spec.get("agentAddress"),
        namespace_prefix=(spec.get("namespaceMapping") or {}).get("prefix", ""),
        gang_api=spec.get("gangApi", "native"),
        scheduler_name=spec.get("schedulerName", "default-scheduler"),
        reclaim=ReclaimConfig.model_validate(spec.get("reclaim") or {}),
        pod_security=spec.get("podSecurity", podsecurity.DEFAULT),
        tenancy=TenancyConfig.model_validate(spec["tenancy"]) if spec.get("tenancy") else None,
    )


async def front_end_uid(front: KubeClient) -> str:
    """The front end's identity: the UID of its kube-system namespace (federation.labels.Owner)."""
    try:
        namespace = await front.get("/api/v1/namespaces/kube-system")
    except ApiError as exc:
        raise ProviderError(f"cannot read the front end's identity (namespace kube-system): {exc}") from exc
    return str(namespace["metadata"]["uid"])


@dataclass(frozen=True)
class SecretAllowance:
    """What a kubeconfig from a MemberCluster's Secret may make the provider run or read: exec
    plugin commands (exactly as written) and file path prefixes. Whoever may write such a Secret
    is not thereby allowed to run programs or read files inside the provider."""

    commands: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()


#: Where a kubeconfig names files: (section, its inner key, the keys that are paths).
_FILE_KEYS = (
    ("users", "user", ("tokenFile", "client-certificate", "client-key")),
    ("clusters", "cluster", ("certificate-authority",)),
)


def secret_refusal(doc: dict[str, Any], allow: SecretAllowance) -> str | None:
    """Why a kubeconfig from a Secret is refused (an exec command or a file outside the allow
    list), or None."""
    for section, inner, keys in _FILE_KEYS:
        for entry in doc.get(section) or []:
            body = (entry or {}).get(inner) or {}
            if not isinstance(body, dict):
                continue
            plugin = body.get("exec")
            command = str(plugin.get("command") or "") if isinstance(plugin, dict) else ""
            if command and command not in allow.commands:
                return (
                    f"its exec plugin command {command!r} is not on the provider's allow list "
                    "(provider.federation.secret_exec_commands)"
                )
            for key in keys:
                path = body.get(key)
                if path and not any(os.path.normpath(str(path)).startswith(os.path.join(p, "")) for p in allow.paths):
                    return (
                        f"its {key} {str(path)!r} is outside the provider's allowed paths "
                        "(provider.federation.secret_file_paths)"
                    )
    return None


async def access_from_secret(
    front: KubeClient, obj: dict[str, Any], allow: SecretAllowance | None = None
) -> ClusterAccess:
    """How to reach the member a MemberCluster object declares: the kubeconfig in the Secret it
    names. KubeconfigError (a ValueError) names the member and says why it cannot be used,
    including an exec command or file path outside `allow` (None: not checked)."""
    ref = (obj.get("spec") or {}).get("kubeconfigSecretRef") or {}
    secret = await front.get(f"/api/v1/namespaces/{ref.get('namespace')}/secrets/{ref.get('name')}")
    key = ref.get("key") or "kubeconfig"
    raw = (secret.get("data") or {}).get(key)
    who = f"member {obj['metadata']['name']}"
    if not raw:
        raise KubeconfigError(f"{who}: secret {ref.get('namespace')}/{ref.get('name')} has no key {key}")
    try:
        doc = yaml.safe_load(base64.b64decode(raw))
    except (ValueError, yaml.YAMLError) as exc:
        raise KubeconfigError(f"{who}: key {key} of secret {ref.get('name')} is not a kubeconfig: {exc}") from None
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{who}: key {key} of secret {ref.get('name')} is not a kubeconfig")
    # Files and exec commands named by a kubeconfig from a Secret are this process's.
    access = parse_kubeconfig(doc, base=Path("/"), name=who)
    refusal = secret_refusal(doc, allow) if allow is not None else None
    if refusal is not None:
        raise KubeconfigError(f"{who}: the kubeconfig in secret {ref.get('name')} is refused: {refusal}")
    return access


class KubeconfigSecret:
    """A member's kubeconfig Secret in the front end, as the store of its renewed token
    (federation.members.tokens): a restarted provider starts from the newest token."""

    def __init__(self, front: KubeClient, obj: dict[str, Any]) -> None:
        ref = (obj.get("spec") or {}).get("kubeconfigSecretRef") or {}
        self._front = front
        self._path = f"/api/v1/namespaces/{ref.get('namespace')}/secrets/{ref.get('name')}"
        self._key = ref.get("key") or "kubeconfig"

    async def _read(self) -> tuple[dict[str, Any], dict[str, Any]] | None:
        secret = await self._front.get(self._path)
        try:
            doc = yaml.safe_load(base64.b64decode((secret.get("data") or {}).get(self._key, "")))
        except (ValueError, yaml.YAMLError):
            return None
        return (secret, doc) if isinstance(doc, dict) else None

    @staticmethod
    def _user(doc: dict[str, Any]) -> dict[str, Any] | None:
        """The kubeconfig's user of its current context."""
        contexts = {c.get("name"): c.get("context") or {} for c in doc.get("contexts") or []}
        wanted = contexts.get(doc.get("current-context"), {}).get("user")
        for user in doc.get("users") or []:
            if user.get("name") == wanted and isinstance(user.get("user"), dict):
                return dict(user["user"])
        return None

    async def load(self) -> str | None:
        found = await self._read()
        user = self._user(found[1]) if found else None
        return str(user["token"]) if user and user.get("token") else None

    async def save(self, token: str) -> None:
        found = await self._read()
        if found is None:
            return
        secret, doc = found
        wanted = self._user(doc)
        for user in doc.get("users") or []:
            if wanted is not None and user.get("user") == wanted:
                user["user"]["token"] = token
        encoded = base64.b64encode(yaml.safe_dump(doc).encode()).decode()
        body = {"metadata": {"resourceVersion": secret["metadata"]["resourceVersion"]}, "data": {self._key: encoded}}
        with contextlib.suppress(Conflict):  # written meanwhile (onboarding rotated it): that one stands
            await self._front.patch(self._path, body)


def same_connection(a: MemberConfig, b: MemberConfig) -> bool:
    """Whether two settings of a member reach it the same way (no new watches needed)."""
    return (a.kubeconfig, a.source, a.agent_address, a.agent_tls_ca, a.namespace_prefix) == (
        b.kubeconfig,
        b.source,
        b.agent_address,
        b.agent_tls_ca,
        b.namespace_prefix,
    )


def _condition(ctype: str, ok: bool, reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }
