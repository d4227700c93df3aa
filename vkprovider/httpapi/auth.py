"""Who is calling the kubelet API and may they: the apiserver's client certificate or a bearer
token (TokenReview) for authentication, SubjectAccessReview on `nodes/<name>` for authorization,
each with a short cache as the kubelet keeps them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cachetools import TTLCache

from vkprovider.kube import ApiError, KubeClient

VERBS = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


@dataclass(frozen=True)
class User:
    name: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: tuple[tuple[str, tuple[str, ...]], ...] = field(default=())


#: Paths that run something in a container or open a tunnel into it. They are authorized as
#: `create`, whatever the request's method: a WebSocket upgrade is a GET, and a monitoring
#: account's `get nodes/proxy` (granted to scrape /stats and /metrics) must not open a shell.
#: The kubelet itself takes the verb from the method; this is stricter on purpose.
ACTIONS = ("/exec/", "/attach/", "/portForward/", "/run/", "/cri/")


def verb_for(method: str, path: str) -> str:
    """The verb a kubelet request is authorized as: by what it does, not its HTTP method."""
    if path.startswith(ACTIONS):
        return "create"
    return VERBS.get(method, "get")


def subresources_for(path: str) -> tuple[str, ...]:
    """The nodes subresources a kubelet path may be authorized as, finest first (the kubelet's
    fine-grained authorization: `nodes/pods`, `nodes/healthz`, `nodes/configz`, falling back to
    `nodes/proxy` for apiservers and roles that predate them)."""
    if path.startswith("/stats"):
        return ("stats",)
    if path.startswith("/metrics"):
        return ("metrics",)
    if path.startswith("/logs"):
        return ("log",)
    if path.startswith(("/pods", "/runningpods")):
        return ("pods", "proxy")
    if path.startswith("/healthz"):
        return ("healthz", "proxy")
    if path.startswith("/configz"):
        return ("configz", "proxy")
    return ("proxy",)


def subresource_for(path: str) -> str:
    """The coarsest subresource a kubelet path is authorized as (what a denial names)."""
    return subresources_for(path)[-1]


def user_from_certificate(peercert: dict[str, Any] | None) -> User | None:
    """CN is the user, O the groups (as the apiserver's x509 authenticator maps them)."""
    if not peercert:
        return None
    name = ""
    groups: list[str] = []
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                name = value
            elif key == "organizationName":
                groups.append(value)
    return User(name=name, groups=tuple(groups)) if name else None


class Authenticator:
    def __init__(self, client: KubeClient, *, ttl: float) -> None:
        self._client = client
        self._tokens: TTLCache[str, User | None] = TTLCache(maxsize=4096, ttl=ttl)

    async def token(self, token: str) -> User | None:
        if token in self._tokens:
            return self._tokens[token]
        review = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
        result = await self._client.create("/apis/authentication.k8s.io/v1/tokenreviews", review)
        status = result.get("status", {})
        user = None
        if status.get("authenticated"):
            info = status.get("user", {})
            user = User(
                name=info.get("username", ""),
                groups=tuple(info.get("groups", [])),
                uid=info.get("uid", ""),
                extra=tuple(sorted((k, tuple(v)) for k, v in (info.get("extra") or {}).items())),
            )
        self._tokens[token] = user
        return user


class Authorizer:
    def __init__(self, client: KubeClient, *, node: str, allow_ttl: float, deny_ttl: float) -> None:
        self._client = client
        self._node = node
        self._allowed: TTLCache[tuple[User, str, str, str], bool] = TTLCache(maxsize=4096, ttl=allow_ttl)
        self._denied: TTLCache[tuple[User, str, str, str], str] = TTLCache(maxsize=4096, ttl=deny_ttl)

    async def check(self, user: User, *, method: str, path: str, node: str | None = None) -> tuple[bool, str]:
        """(allowed, reason) for `user` calling `method path` on `node` (default: this one):
        allowed when any of the path's subresources is, the finest asked first."""
        node = node or self._node
        verb = verb_for(method, path)
        reason = ""
        for subresource in subresources_for(path):
            allowed, reason = await self._review(user, verb, subresource, node)
            if allowed:
                return True, ""
        return False, reason

    async def _review(self, user: User, verb: str, subresource: str, node: str) -> tuple[bool, str]:
        key = (user, verb, subresource, node)
        if key in self._allowed:
            return True, ""
        if key in self._denied:
            return False, self._denied[key]
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": user.name,
                "groups": list(user.groups),
                "uid": user.uid or None,
                "extra": {k: list(v) for k, v in user.extra} or None,
                "resourceAttributes": {
                    "verb": verb,
                    "resource": "nodes",
                    "subresource": subresource,
                    "name": node,
                },
            },
        }
        try:
            result = await self._client.create("/apis/authorization.k8s.io/v1/subjectaccessreviews", review)
        except ApiError as exc:
            return False, f"authorization check failed: {exc.reason}"
        status = result.get("status", {})
        if status.get("allowed"):
            self._allowed[key] = True
            return True, ""
        reason = f'User "{user.name}" cannot {verb} resource "nodes/{subresource}" on node "{node}"' + (
            f": {status['reason']}" if status.get("reason") else ""
        )
        self._denied[key] = reason
        return False, reason
