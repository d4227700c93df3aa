"""Reaching a provider's kubelet port directly, as a client other than the kube-apiserver: the
lab's side of e2e.hostile's credentials (a client certificate for any user name, a TLS context
that presents it, the RBAC grant that authorizes a user there)."""

from __future__ import annotations

from pathlib import Path

from e2e import hostile
from e2e.fixtures import Lab
from e2e.hostile import grant_nodes_proxy, with_cert

__all__ = ["client_cert", "grant_nodes_proxy", "with_cert"]


def client_cert(lab: Lab, user: str, directory: Path) -> tuple[Path, Path]:
    return hostile.client_cert(lab.state_dir, user, directory)
