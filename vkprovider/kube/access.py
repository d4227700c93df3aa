"""How to reach one apiserver: its URL and credentials, read from a kubeconfig or the pod's
service account, and turned into an SSL context.

Kept apart from the client so credentials can be parsed and validated without any I/O beyond
reading files.
"""

from __future__ import annotations

import base64
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubeconfigError(ValueError):
    """A kubeconfig that cannot be used, with a message that says why."""


@dataclass(frozen=True, kw_only=True)
class ClusterAccess:
    """Everything needed to open connections to one apiserver."""

    server: str
    ca_data: bytes | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    insecure_skip_verify: bool = False
    name: str = ""

    def bearer_token(self) -> str | None:
        """The current token; a token file is re-read so rotated tokens are picked up."""
        if self.token_file:
            return Path(self.token_file).read_text().strip()
        return self.token

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_data:
            ctx.load_verify_locations(cadata=self.ca_data.decode())
        if self.cert_data and self.key_data:
            # The ssl module loads client certificates from files only; keep them on disk for the
            # duration of the call, readable by this user alone.
            with tempfile.TemporaryDirectory(prefix="vkprovider-cert-") as tmp:
                cert_path = Path(tmp, "tls.crt")
                key_path = Path(tmp, "tls.key")
                for path, data in ((cert_path, self.cert_data), (key_path, self.key_data)):
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                    with os.fdopen(fd, "wb") as f:
                        f.write(data)
                ctx.load_cert_chain(cert_path, key_path)
        return ctx


def _data_or_file(entry: dict[str, Any], key: str, base: Path) -> bytes | None:
    if entry.get(f"{key}-data"):
        return base64.b64decode(entry[f"{key}-data"])
    if entry.get(key):
        path = Path(entry[key])
        if not path.is_absolute():
            path = base / path
        try:
            return path.read_bytes()
        except OSError as exc:
            raise KubeconfigError(f"cannot read {key} {path}: {exc.strerror}") from exc
    return None


def _named(items: list[dict[str, Any]] | None, name: str, kind: str) -> dict[str, Any]:
    for item in items or []:
        if item.get("name") == name:
            return dict(item.get(kind) or {})
    raise KubeconfigError(f"kubeconfig has no {kind} named {name!r}")


def parse_kubeconfig(doc: dict[str, Any], *, base: Path, context: str | None = None) -> ClusterAccess:
    """Resolve one context of a decoded kubeconfig into a ClusterAccess."""
    context_name = context or doc.get("current-context")
    if not context_name:
        raise KubeconfigError("kubeconfig has no current-context and no context was given")
    ctx = _named(doc.get("contexts"), context_name, "context")
    cluster = _named(doc.get("clusters"), ctx.get("cluster", ""), "cluster")
    user = _named(doc.get("users"), ctx.get("user", ""), "user") if ctx.get("user") else {}
    server = cluster.get("server")
    if not server:
        raise KubeconfigError(f"cluster of context {context_name!r} has no server")
    if "exec" in user or "auth-provider" in user:
        raise KubeconfigError(
            "exec and auth-provider credentials are not supported; use a token or a client certificate"
        )
    token_file = user.get("tokenFile")
    return ClusterAccess(
        server=str(server).rstrip("/"),
        ca_data=_data_or_file(cluster, "certificate-authority", base),
        cert_data=_data_or_file(user, "client-certificate", base),
        key_data=_data_or_file(user, "client-key", base),
        token=user.get("token"),
        token_file=str(base / token_file) if token_file else None,
        insecure_skip_verify=bool(cluster.get("insecure-skip-tls-verify", False)),
        name=context_name,
    )


def load_kubeconfig(path: str | Path, *, context: str | None = None) -> ClusterAccess:
    """Read a kubeconfig file; raise KubeconfigError with a clear message when it is unusable."""
    path = Path(path)
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KubeconfigError(f"cannot read kubeconfig {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise KubeconfigError(f"kubeconfig {path} is not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise KubeconfigError(f"kubeconfig {path} is not a mapping")
    return parse_kubeconfig(doc, base=path.parent, context=context)


def in_cluster() -> ClusterAccess:
    """The pod's own service account, as a kubelet-like process inside a cluster uses it."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host:
        raise KubeconfigError("not running in a cluster: KUBERNETES_SERVICE_HOST is unset")
    if ":" in host:
        host = f"[{host}]"
    return ClusterAccess(
        server=f"https://{host}:{port}",
        ca_data=(SERVICE_ACCOUNT_DIR / "ca.crt").read_bytes(),
        token_file=str(SERVICE_ACCOUNT_DIR / "token"),
        name="in-cluster",
    )
