"""Reaching a provider's kubelet port directly, as a client other than the kube-apiserver: a
client certificate signed by the offline cluster's CA for any user name, a TLS context that
presents it, and the RBAC grant (create and get on nodes/proxy) that authorizes a user there."""

from __future__ import annotations

import contextlib
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from e2e import pki
from e2e.fixtures import Lab
from vkprovider.kube import AlreadyExists, KubeClient


def client_cert(lab: Lab, user: str, directory: Path) -> tuple[Path, Path]:
    pki_dir = lab.state_dir / "clusters" / "offline" / "pki"
    ca_cert = x509.load_pem_x509_certificate((pki_dir / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((pki_dir / "ca.key").read_bytes(), password=None)
    pair = pki.issue(pki.KeyPair(ca_key, ca_cert), user, client=True)  # type: ignore[arg-type]
    return pair.write(directory, f"client-{user}")


def with_cert(pair: tuple[Path, Path]) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.load_cert_chain(str(pair[0]), str(pair[1]))
    return ctx


async def grant_nodes_proxy(client: KubeClient, user: str) -> None:
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"test-{user}"},
        "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get", "create"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"test-{user}"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"test-{user}"},
        "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}],
    }
    for path, body in (
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
        ("/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding),
    ):
        with contextlib.suppress(AlreadyExists):  # made by an earlier run against this lab
            await client.create(path, body)
