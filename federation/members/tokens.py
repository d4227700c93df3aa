"""A tenant member's credential: a short-lived token of the tenant's account, renewed before it
expires, and watched for revocation.

Onboarding writes the first token into the kubeconfig Secret of the member (federation.tenancy);
the provider renews it through TokenRequest, with the token itself (a TokenRequest for one's own
account needs no other right than `create serviceaccounts/token` on it), once `renew_after` of
its lifetime has passed, and writes the new one back to the Secret, so a restarted provider
starts from a token with life left. Each token is bound to the same Secret in the member as the
first (its binding is read off the token's claims): deleting that Secret (offboarding does)
revokes every token at once. A member that caps token lifetimes is followed: the renewal time
comes from the token the member issued, not from what was asked.

Between renewals the keeper asks the member who it is (a SelfSubjectReview) every
`probe_every` seconds, so a revoked token is noticed within that time even while the provider is
idle there. A refused token is looked for again in the Secret (a re-run of onboarding may have
replaced it); otherwise the member says why on its MemberCluster and lends nothing.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from typing import Any, Protocol

from vkprovider import logs
from vkprovider.kube import ApiError, ClusterAccess, KubeClient, Unauthorized
from vkprovider.kube.credentials import HeldToken, token_claims


class TokenStore(Protocol):
    """Where the member's token is kept for the next start (its kubeconfig Secret)."""

    async def load(self) -> str | None: ...

    async def save(self, token: str) -> None: ...


def _rfc3339(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def renewal_due(claims: dict[str, Any], renew_after: float) -> float | None:
    """When a token with these claims is to be renewed (wall time); None for a token that does
    not say when it was issued and expires."""
    issued, expires = claims.get("iat"), claims.get("exp")
    if not isinstance(issued, int | float) or not isinstance(expires, int | float) or expires <= issued:
        return None
    return float(issued) + renew_after * (float(expires) - float(issued))


def token_request(claims: dict[str, Any], seconds: int) -> tuple[str, dict[str, Any]] | None:
    """The TokenRequest (path, body) that renews a bound service-account token with the same
    account and binding; None when the claims do not name them."""
    k8s = claims.get("kubernetes.io") or {}
    namespace = k8s.get("namespace")
    account = (k8s.get("serviceaccount") or {}).get("name")
    secret = k8s.get("secret") or {}
    if not (namespace and account and secret.get("name") and secret.get("uid")):
        return None
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "expirationSeconds": seconds,
            "boundObjectRef": {"kind": "Secret", "apiVersion": "v1", "name": secret["name"], "uid": secret["uid"]},
        },
    }
    return f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token", body


class TokenKeeper:
    def __init__(
        self,
        name: str,
        access: ClusterAccess,
        held: HeldToken,
        *,
        seconds: int,
        renew_after: float,
        probe_every: float,
        store: TokenStore | None,
    ) -> None:
        self.name = name
        self._access = access  # its credential is `held`
        self._held = held
        self._seconds = seconds
        self._renew_after = renew_after
        self._probe_every = probe_every
        self._store = store
        #: Why the member refuses the token now (None: it accepts it, or nothing was asked yet).
        self.rejected: str | None = None
        self.renewals = 0
        self._log = logs.get("member-token", cluster=name)

    @property
    def expires(self) -> float | None:
        exp = token_claims(self._held.token() or "").get("exp")
        return float(exp) if isinstance(exp, int | float) else None

    def describe(self) -> str:
        """For the MemberCluster's condition."""
        if self.rejected:
            return self.rejected
        expires = self.expires
        return "the member accepts the provider's token" + (f" (expires {_rfc3339(expires)})" if expires else "")

    async def run(self) -> None:
        async with KubeClient(self._access, user_agent=f"vkprovider-token/{self.name}") as client:
            while True:
                claims = token_claims(self._held.token() or "")
                due = renewal_due(claims, self._renew_after)
                try:
                    if due is not None and time.time() >= due:
                        await self._renew(client, claims)
                    else:
                        await client.create(
                            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"},
                        )
                    self.rejected = None
                except Unauthorized as exc:
                    await self._refused(exc)
                except ApiError as exc:
                    # Not the token's fault (the member is away, or busy): its reachability says so.
                    self._log.debug("token check not answered", error=str(exc))
                wait = self._probe_every if due is None else min(self._probe_every, due - time.time())
                await asyncio.sleep(max(1.0, wait))

    async def _renew(self, client: KubeClient, claims: dict[str, Any]) -> None:
        request = token_request(claims, self._seconds)
        if request is None:
            self._log.warning("the member token names no account and binding: it is not renewed")
            self._renew_after = float("inf")
            return
        path, body = request
        answer = await client.create(path, body)
        token = str(answer["status"]["token"])
        self._held.replace(token)
        self.renewals += 1
        expires = self.expires
        self._log.info("member token renewed", expires=_rfc3339(expires) if expires else None)
        if self._store is not None:
            try:
                await self._store.save(token)
            except ApiError as exc:
                self._log.warning("renewed member token not written back", error=str(exc))

    async def _refused(self, exc: ApiError) -> None:
        """The member refuses the token: a newer one in the store (onboarding ran again) is taken
        up; otherwise the member says why."""
        stored = None
        if self._store is not None:
            try:
                stored = await self._store.load()
            except ApiError as error:
                self._log.debug("member token not reread", error=str(error))
        if stored and stored != self._held.token():
            self._log.info("member token taken up again from its Secret")
            self._held.replace(stored)
            return
        if self.rejected is None:
            self._log.warning("the member refuses the provider's token", error=str(exc))
        self.rejected = (
            f"the member refuses the provider's token ({exc}): it expired, or was revoked (its binding Secret "
            "deleted: the tenant offboarded); run `vkprovider onboard` again to give the provider a new one"
        )
