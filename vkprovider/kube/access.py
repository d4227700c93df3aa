"""How to reach one apiserver: its URL and credentials, read from a kubeconfig or the pod's
service account, and turned into an SSL context.

A kubeconfig is resolved by kubernetes-asyncio's loader (context, cluster and user, files
relative to the kubeconfig, the `exec` stanza); credentials that change while the process runs
(`tokenFile`, `exec` plugins) are `vkprovider.kube.credentials`, which the client asks before
each request. Parsing does no I/O beyond reading files: an exec plugin first runs when the
first request needs its credential.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from vkprovider.kube.credentials import (
    EXEC_API_VERSIONS,
    Credentials,
    ExecPlugin,
    KubeconfigError,
    TokenFile,
    load_cert_chain,
)
from vkprovider.kube.loader import ConfigException, ConfigNode, ExecProvider, FileOrData, KubeConfigLoader

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
#: The cluster extension an exec plugin receives as `spec.cluster.config` (provideClusterInfo).
EXEC_EXTENSION = "client.authentication.k8s.io/exec"

__all__ = ["ClusterAccess", "KubeconfigError", "in_cluster", "load_kubeconfig", "parse_kubeconfig"]


@dataclass(frozen=True, kw_only=True)
class ClusterAccess:
    """Everything needed to open connections to one apiserver.

    `token` and the client certificate are fixed; `token_file` and exec plugins are
    `credentials` that change, shared by every client built from this object.
    """

    server: str
    ca_data: bytes | None = None
    cert_data: bytes | None = None
    key_data: bytes | None = None
    token: str | None = None
    token_file: str | None = None
    insecure_skip_verify: bool = False
    #: Who uses this apiserver, for messages ("member member-1"); the context name by default.
    name: str = ""
    credentials: Credentials | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.credentials is None and self.token_file:
            source = TokenFile(self.token_file, name=self.name or self.server, fallback=self.token)
            object.__setattr__(self, "credentials", source)

    def bearer_token(self) -> str | None:
        """The current token: cheap, from the credential's cache (a token file is re-read at most
        once a minute). Raises KubeconfigError when there is none to be had."""
        if self.credentials is not None:
            return self.credentials.token()
        return self.token

    def stale(self) -> bool:
        """Whether `refresh()` must be awaited before the next request (an exec credential that
        is missing or about to expire)."""
        return self.credentials is not None and self.credentials.stale()

    async def refresh(self, *, rejected: int | None = None) -> bool:
        """Obtain changing credentials again when due, or because the apiserver refused the
        credential `version` given as `rejected` (then True when it has changed since)."""
        if self.credentials is None:
            return False
        return await self.credentials.refresh(rejected=rejected)

    @property
    def version(self) -> int:
        """Changes whenever the token or client certificate does."""
        return self.credentials.version if self.credentials is not None else 0

    @property
    def tls_version(self) -> int:
        """Changes whenever the client certificate does (the SSL context is rebuilt)."""
        return self.credentials.tls_version if self.credentials is not None else 0

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        if self.insecure_skip_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        elif self.ca_data:
            ctx.load_verify_locations(cadata=self.ca_data.decode())
        pair = self.credentials.client_cert() if self.credentials is not None else None
        if pair is None and self.cert_data and self.key_data:
            pair = (self.cert_data, self.key_data)
        if pair is not None:
            load_cert_chain(ctx, *pair)
        return ctx


def _data_or_file(node: ConfigNode, key: str, base: Path) -> bytes | None:
    """`key-data` (base64) or the file `key` names, through the loader's FileOrData."""
    source = FileOrData(node, key, file_base_path=str(base))
    try:
        encoded = source.as_data()
    except OSError as exc:
        raise KubeconfigError(f"cannot read {key} {exc.filename}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise KubeconfigError(f"{key} file is not PEM text") from None
    if not encoded:
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except binascii.Error:
        raise KubeconfigError(f"{key}-data is not valid base64") from None


_NOT_FOUND = re.compile(r"Expected object with name (.*) in .*\b(context|cluster|user)s list")


def _reason(exc: ConfigException) -> str:
    """The loader's message, in our words where we know them."""
    text = str(exc)
    found = _NOT_FOUND.search(text)
    if found:
        return f"kubeconfig has no {found.group(2)} named {found.group(1)!r}"
    if text.startswith("exec: "):
        return "exec plugin in the kubeconfig: " + text.removeprefix("exec: ")
    return "kubeconfig is not usable: " + text.removeprefix("Invalid kube-config file. ")


def parse_kubeconfig(
    doc: dict[str, Any], *, base: Path, context: str | None = None, name: str | None = None
) -> ClusterAccess:
    """Resolve one context of a decoded kubeconfig into a ClusterAccess.

    `name` says who uses it ("member member-1"); every KubeconfigError starts with it.
    """
    prefix = f"{name}: " if name else ""
    try:
        return _parse(doc, base=base, context=context, name=name)
    except ConfigException as exc:
        raise KubeconfigError(prefix + _reason(exc)) from None
    except KubeconfigError as exc:
        raise KubeconfigError(prefix + str(exc)) from None
    except (TypeError, AttributeError, KeyError, IndexError) as exc:
        # A list where a mapping belongs, and the like: the loader assumes a well-formed file.
        raise KubeconfigError(f"{prefix}kubeconfig is malformed ({exc!r})") from None


def _parse(doc: dict[str, Any], *, base: Path, context: str | None, name: str | None) -> ClusterAccess:
    context_name = context or doc.get("current-context")
    if not context_name:
        raise KubeconfigError("kubeconfig has no current-context and no context was given")
    loader = KubeConfigLoader(config_dict=doc, active_context=context_name, config_base_path=str(base))
    # The loader skips a user it cannot find (and then sends no credentials); client-go refuses.
    user_name = ((loader.current_context or {}).get("context") or {}).get("user")
    user = loader._user
    if user_name and user is None:
        raise KubeconfigError(f"kubeconfig has no user named {user_name!r}")
    cluster = cast(ConfigNode, loader._cluster)
    server = cluster.safe_get("server")
    if not server:
        raise KubeconfigError(f"cluster of context {context_name!r} has no server")
    server = str(server).rstrip("/")
    who = name or str(context_name)
    ca_data = _data_or_file(cluster, "certificate-authority", base)
    insecure = bool(cluster.safe_get("insecure-skip-tls-verify"))
    access: dict[str, Any] = {}
    if user is not None:
        if "auth-provider" in user:
            raise KubeconfigError(
                "auth-provider credentials are not supported (client-go dropped them); "
                "use the exec plugin that replaces yours (gke-gcloud-auth-plugin, kubelogin)"
            )
        access["cert_data"] = _data_or_file(user, "client-certificate", base)
        access["key_data"] = _data_or_file(user, "client-key", base)
        access["token"] = user.safe_get("token") or None
        if user.safe_get("tokenFile"):
            access["token_file"] = os.path.normpath(os.path.join(base, str(user["tokenFile"])))
        if user.safe_get("exec"):
            access["credentials"] = _exec_plugin(user["exec"], cluster, who=who, base=base, server=server, ca=ca_data)
    return ClusterAccess(server=server, ca_data=ca_data, insecure_skip_verify=insecure, name=who, **access)


def _exec_plugin(
    node: ConfigNode, cluster: ConfigNode, *, who: str, base: Path, server: str, ca: bytes | None
) -> ExecPlugin:
    provider = ExecProvider(node)  # command, args, env and apiVersion, validated by the loader's code
    if provider.api_version not in EXEC_API_VERSIONS:
        raise KubeconfigError(
            f"exec plugin apiVersion {provider.api_version!r} is not one of {', '.join(EXEC_API_VERSIONS)}"
        )
    if node.safe_get("interactiveMode") == "Always":
        raise KubeconfigError(
            f"exec plugin {provider.args[0]!r} needs a terminal (interactiveMode: Always); vkprovider runs unattended"
        )
    cluster_info: dict[str, Any] | None = None
    if node.safe_get("provideClusterInfo"):
        # What the plugin may ask for in KUBERNETES_EXEC_INFO (ExecProvider does not send it).
        cluster_info = {
            "server": server,
            "insecure-skip-tls-verify": bool(cluster.safe_get("insecure-skip-tls-verify")),
        }
        if ca:
            cluster_info["certificate-authority-data"] = base64.b64encode(ca).decode()
        for key in ("tls-server-name", "proxy-url", "disable-compression"):
            if cluster.safe_get(key) is not None:
                cluster_info[key] = cluster.safe_get(key)
        for ext in cluster.safe_get("extensions") or []:
            if isinstance(ext, dict) and ext.get("name") == EXEC_EXTENSION:
                cluster_info["config"] = ext.get("extension")
    return ExecPlugin(
        provider,
        name=who,
        base=base,
        install_hint=str(node.safe_get("installHint") or ""),
        cluster_info=cluster_info,
    )


def load_kubeconfig(path: str | Path, *, context: str | None = None, name: str | None = None) -> ClusterAccess:
    """Read a kubeconfig file; raise KubeconfigError with a clear message when it is unusable
    (starting with `name`, who uses it, when given)."""
    path = Path(path)
    prefix = f"{name}: " if name else ""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise KubeconfigError(f"{prefix}cannot read kubeconfig {path}: {exc.strerror}") from exc
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise KubeconfigError(f"{prefix}kubeconfig {path} is not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise KubeconfigError(f"{prefix}kubeconfig {path} is not a mapping")
    return parse_kubeconfig(doc, base=path.parent, context=context, name=name)


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
