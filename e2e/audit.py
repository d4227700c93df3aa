"""Identities a test can judge by the apiserver's own record: kubeconfigs for named users of a
lab cluster, and the audit log of what those users did.

A user issued with `audited=True` carries the lab's audited group, whose requests every lab
apiserver writes to `clusters/<name>/audit.log` (who, verb, URI, answer code, timestamps).
That record is independent of the process under test: a write its own counters miss still
shows here.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from e2e import components, kubeconfig, pki
from e2e.state import LabState

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def user_kubeconfig(
    lab: LabState, cluster: str, user: str, *, groups: tuple[str, ...] = (), audited: bool = True
) -> Path:
    """A kubeconfig for `user` (with `groups`) on `cluster`, signed by the cluster's CA."""
    files = lab.root / "clusters" / cluster / "pki"
    ca = pki.KeyPair(
        serialization.load_pem_private_key((files / "ca.key").read_bytes(), password=None),  # type: ignore[arg-type]
        x509.load_pem_x509_certificate((files / "ca.crt").read_bytes()),
    )
    organizations = (*groups, components.AUDITED_GROUP) if audited else groups
    pair = pki.issue(ca, user, organizations=organizations, client=True)
    text = kubeconfig.render(
        cluster=cluster,
        server=lab.clusters[cluster].server,
        ca_pem=ca.cert_pem,
        cert_pem=pair.cert_pem,
        key_pem=pair.key_pem,
        user=user,
    )
    return kubeconfig.write(lab.root / "kubeconfig" / "users" / f"{cluster}-{user}.yaml", text)


@dataclass(frozen=True)
class AuditRecord:
    user: str
    verb: str
    uri: str
    code: int
    received: float  # seconds since the epoch
    completed: float
    resource: str
    subresource: str
    namespace: str
    name: str
    agent: str = ""  # the client's User-Agent

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS

    @property
    def succeeded(self) -> bool:
        return 200 <= self.code < 300


def _seconds(stamp: str) -> float:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def records(
    lab: LabState, cluster: str, *, users: set[str] | None = None, log: Path | None = None
) -> list[AuditRecord]:
    """The cluster's audit records (of `users`, if given), in the order the apiserver wrote them;
    from `log` instead of the cluster's own, for another apiserver of that cluster."""
    path = log or lab.root / "clusters" / cluster / "audit.log"
    out: list[AuditRecord] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        user = (event.get("user") or {}).get("username", "")
        if users is not None and user not in users:
            continue
        ref = event.get("objectRef") or {}
        out.append(
            AuditRecord(
                user=user,
                verb=event.get("verb", ""),
                uri=event.get("requestURI", ""),
                code=int((event.get("responseStatus") or {}).get("code") or 0),
                received=_seconds(event["requestReceivedTimestamp"]),
                completed=_seconds(event["stageTimestamp"]),
                resource=ref.get("resource", ""),
                subresource=ref.get("subresource", ""),
                namespace=ref.get("namespace", ""),
                name=ref.get("name", ""),
                agent=event.get("userAgent", ""),
            )
        )
    return out
