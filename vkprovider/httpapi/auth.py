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


def subresource_for(path: str) -> str:
    """The nodes subresource a kubelet path is authorized as (kubelet server auth rules)."""
    if path.startswith("/stats"):
        return "stats"
    if path.startswith("/metrics"):
        return "metrics"
    if path.startswith("/logs"):
        return "log"
    return "proxy"


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
        """(allowed, reason) for `user` calling `method path` on `node` (default: this one)."""
        node = node or self._node
        verb = VERBS.get(method, "get")
        subresource = subresource_for(path)
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
