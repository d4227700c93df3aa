"""Admin kubeconfigs of the lab's clusters (certificates embedded, so a file is self-contained)."""

from __future__ import annotations

import base64
from pathlib import Path

import yaml


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def render(*, cluster: str, server: str, ca_pem: bytes, cert_pem: bytes, key_pem: bytes, user: str) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)}}],
        "users": [
            {"name": user, "user": {"client-certificate-data": _b64(cert_pem), "client-key-data": _b64(key_pem)}}
        ],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    }
    return yaml.safe_dump(doc, sort_keys=False)


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o600)
    return path
