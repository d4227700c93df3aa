"""Credentials that change while the process runs: a kubeconfig's `tokenFile` and `exec` plugins.

The kubeconfig itself is resolved by kubernetes-asyncio's loader (`vkprovider.kube.access`).
That loader fetches a credential once, for one `Configuration`; a client that runs for weeks
needs more, and it lives here:

- `TokenFile`: the token is cached and the file re-read at most once a minute (client-go's
  period), and at once when the apiserver answers 401.
- `ExecPlugin`: the plugin's ExecCredential (a bearer token, a client certificate and key, or
  both) is cached, obtained again shortly before its `expirationTimestamp`, and at once (once)
  when the apiserver refuses it. Concurrent callers share one run of the plugin; a failed run
  is not repeated for a second, so a broken plugin is not started by every request.

kubernetes-asyncio's `ExecProvider` reads the `exec` stanza (command, args, env, apiVersion),
but the plugin is started here rather than by `ExecProvider.run()`: that has no time limit (a
plugin waiting at a login prompt would hold every request forever, and cancelling it leaves
the process running), hands the plugin our stdin, reads stdout before stderr (a plugin that
writes much to stderr blocks), and reports a missing command as a bare `FileNotFoundError`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import ssl
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from vkprovider import logs
from vkprovider.kube.loader import ExecProvider, parse_rfc3339

#: The ExecCredential versions client-go accepts (v1alpha1 is gone since Kubernetes 1.24).
EXEC_API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
#: How long before its expiry a credential is obtained again: a fifth of its lifetime, at most
#: this long (an EKS token of 15 minutes is renewed one minute early, a 5 s test token after 4 s).
MAX_LEAD = 60.0
#: Never start the plugin again sooner than this for an expiring credential, nor after a failure.
MIN_INTERVAL = 1.0
#: How long a plugin may take before it is killed and the attempt counts as failed.
EXEC_TIMEOUT = 60.0
#: client-go re-reads a token file once a minute.
TOKEN_FILE_PERIOD = 60.0


class KubeconfigError(ValueError):
    """A kubeconfig that cannot be used, with a message that says why."""


class Credentials(Protocol):
    """What a client needs from a credential that can change.

    `version` changes whenever the token or certificate does (a request refused with an old
    version is worth repeating), `tls_version` when the client certificate does (the client
    builds a new SSL context).
    """

    @property
    def version(self) -> int: ...

    @property
    def tls_version(self) -> int: ...

    def stale(self) -> bool:
        """Cheap and synchronous: `refresh()` must be awaited before the next request."""
        ...

    def token(self) -> str | None: ...

    def client_cert(self) -> tuple[bytes, bytes] | None: ...

    async def refresh(self, *, rejected: int | None = None) -> bool:
        """Obtain the credential again if it is due, or, with `rejected`, because the apiserver
        refused that version. True when the credential is now different from `rejected`."""
        ...


def load_cert_chain(ctx: ssl.SSLContext, cert: bytes, key: bytes) -> None:
    """Load a PEM certificate and key into `ctx`. The ssl module reads them from files only; they
    stay on disk for the duration of the call, readable by this user alone."""
    with tempfile.TemporaryDirectory(prefix="vkprovider-cert-") as tmp:
        cert_path = Path(tmp, "tls.crt")
        key_path = Path(tmp, "tls.key")
        for path, data in ((cert_path, cert), (key_path, key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        ctx.load_cert_chain(cert_path, key_path)


class TokenFile:
    """A bearer token read from a file that something else rotates (a projected service-account
    token, a sidecar's output)."""

    tls_version = 0

    def __init__(
        self,
        path: str,
        *,
        name: str,
        fallback: str | None = None,
        period: float = TOKEN_FILE_PERIOD,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.name = name
        self.version = 0
        self.reads = 0
        self._fallback = fallback  # the kubeconfig's `token`, used until the file can be read
        self._token: str | None = None
        self._period = period
        self._clock = clock
        self._next_read = float("-inf")
        self._log = logs.get("kube-credentials", who=name)

    def stale(self) -> bool:
        return False  # re-read synchronously by token(): a small file, once a minute

    def token(self) -> str | None:
        if self._clock() >= self._next_read:
            self._read()
        return self._token if self._token is not None else self._fallback

    def client_cert(self) -> tuple[bytes, bytes] | None:
        return None

    def _read(self) -> None:
        self._next_read = self._clock() + self._period
        self.reads += 1
        try:
            text = Path(self.path).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) else "not text"
            text, problem = "", f"cannot read token file {self.path}: {reason}"
        else:
            problem = f"token file {self.path} is empty"
        if text:
            if text != self._token:
                self._token = text
                self.version += 1
            return
        if self._token is None and self._fallback is None:
            raise KubeconfigError(f"{self.name}: {problem}")
        # As client-go does: keep the last token read and try the file again later.
        self._log.warning("token file not read; the previous token is kept", reason=problem)

    async def refresh(self, *, rejected: int | None = None) -> bool:
        if rejected is None:
            return False
        if self.version == rejected:
            self._read()
        return self.version != rejected


class HeldToken:
    """A bearer token its owner replaces while the process runs (a service-account token renewed
    through TokenRequest, federation.members.tokens); every client built on it picks the new one
    up with its next request."""

    tls_version = 0

    def __init__(self, token: str) -> None:
        self._token = token
        self.version = 0

    def stale(self) -> bool:
        return False  # renewed by its owner, ahead of time

    def token(self) -> str | None:
        return self._token

    def client_cert(self) -> tuple[bytes, bytes] | None:
        return None

    def replace(self, token: str) -> None:
        if token != self._token:
            self._token = token
            self.version += 1

    async def refresh(self, *, rejected: int | None = None) -> bool:
        return rejected is not None and self.version != rejected


def token_claims(token: str) -> dict[str, Any]:
    """The payload of a service-account token (a JWT), unverified; {} when it is not one."""
    try:
        payload = token.split(".")[1]
        decoded = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
        claims = json.loads(decoded)
    except (IndexError, ValueError):
        return {}
    return claims if isinstance(claims, dict) else {}


class ExecPlugin:
    """An `exec` credential plugin (aws eks get-token, gke-gcloud-auth-plugin, kubelogin, ...)."""

    def __init__(
        self,
        provider: ExecProvider,
        *,
        name: str,
        base: Path,
        install_hint: str = "",
        cluster_info: dict[str, Any] | None = None,
        timeout: float = EXEC_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.args = [str(a) for a in provider.args]
        command = self.args[0]
        # client-go resolves a relative command with a directory part against the kubeconfig's
        # directory; a bare name is looked up in PATH.
        if os.sep in command and not os.path.isabs(command):
            self.args[0] = os.path.normpath(os.path.join(base, command))
        self.command = command
        self.api_version = str(provider.api_version)
        self._env = dict(provider.env)
        self._install_hint = " ".join(install_hint.split())
        self._cluster_info = cluster_info
        self._timeout = timeout
        self._clock = clock
        self.version = 0
        self.tls_version = 0
        #: Times the plugin was started (what tests and logs look at).
        self.runs = 0
        self._token: str | None = None
        self._cert: tuple[bytes, bytes] | None = None
        self._refresh_at = float("-inf")
        self._expires_at: float | None = None  # monotonic; None: valid until refused
        self._failed: tuple[float, KubeconfigError] | None = None  # until when a failure is repeated
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None
        self._log = logs.get("kube-credentials", who=name, plugin=command)

    # -- what the client reads on every request --------------------------------------------------

    def stale(self) -> bool:
        return self._clock() >= self._refresh_at

    def token(self) -> str | None:
        return self._token

    def client_cert(self) -> tuple[bytes, bytes] | None:
        return self._cert

    def expires_in(self) -> float | None:
        """Seconds until the current credential expires (None: no expiry was given)."""
        return None if self._expires_at is None else self._expires_at - self._clock()

    # -- obtaining it ------------------------------------------------------------------------------

    def _get_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    def _usable(self) -> bool:
        has_credential = self._token is not None or self._cert is not None
        return has_credential and (self._expires_at is None or self._clock() < self._expires_at)

    async def refresh(self, *, rejected: int | None = None) -> bool:
        async with self._get_lock():
            if rejected is None and not self.stale():
                return False  # another caller has just obtained it
            if rejected is not None and self.version != rejected:
                return True  # already replaced since that request was sent
            now = self._clock()
            if self._failed is not None and now < self._failed[0]:
                raise self._failed[1]
            before = self.version
            try:
                self._take(await self._run())
            except KubeconfigError as exc:
                # From the failure's end, not the start: a plugin that takes longer than the
                # pause (a loaded machine, a slow identity provider) would be started again at once.
                now = self._clock()
                self._failed = (now + MIN_INTERVAL, exc)
                if rejected is None and self._usable():
                    # An early renewal failed; the current credential holds a little longer.
                    remaining = self._expires_at - now if self._expires_at is not None else MIN_INTERVAL
                    self._refresh_at = now + max(MIN_INTERVAL, min(5.0, remaining / 2))
                    self._log.warning("credential not renewed; the current one is kept", error=str(exc))
                    return False
                raise
            self._failed = None
            return self.version != before

    def _error(self, reason: str) -> KubeconfigError:
        return KubeconfigError(f"{self.name}: exec plugin {self.command!r} {reason}")

    async def _run(self) -> dict[str, Any]:
        """Start the plugin once; the `status` of the ExecCredential it prints."""
        spec: dict[str, Any] = {"interactive": False}
        if self._cluster_info is not None:
            spec["cluster"] = self._cluster_info
        info = {"apiVersion": self.api_version, "kind": "ExecCredential", "spec": spec}
        env = {**self._env, "KUBERNETES_EXEC_INFO": json.dumps(info)}
        self.runs += 1
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.args,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except FileNotFoundError:
            hint = f" ({self._install_hint})" if self._install_hint else ""
            raise self._error(f"not found{hint}") from None
        except OSError as exc:
            raise self._error(f"cannot be started: {exc.strerror}") from None
        try:
            async with asyncio.timeout(self._timeout):
                stdout, stderr = await proc.communicate()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise self._error(f"did not finish within {self._timeout:.0f}s") from None
        finally:
            if proc.returncode is None:  # cancelled: the plugin must not outlive the request
                proc.kill()
        if proc.returncode != 0:
            said = stderr.decode(errors="replace").strip()
            raise self._error(f"failed (exit status {proc.returncode})" + (f": {said[-500:]}" if said else ""))
        try:
            doc = json.loads(stdout)
        except ValueError as exc:
            raise self._error(f"did not print an ExecCredential (not JSON: {exc})") from None
        if not isinstance(doc, dict) or doc.get("kind") != "ExecCredential":
            kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
            raise self._error(f"printed {kind!r}, not an ExecCredential")
        if doc.get("apiVersion") != self.api_version:
            raise self._error(f"answered in {doc.get('apiVersion')!r}; the kubeconfig asks for {self.api_version!r}")
        status = doc.get("status")
        if not isinstance(status, dict):
            raise self._error("printed an ExecCredential without a status")
        return status

    def _take(self, status: dict[str, Any]) -> None:
        token = status.get("token") or None
        cert, key = status.get("clientCertificateData"), status.get("clientKeyData")
        if token is not None and not isinstance(token, str):
            raise self._error("printed a token that is not a string")
        if bool(cert) != bool(key):
            raise self._error("printed a client certificate without its key, or a key without its certificate")
        if not token and not cert:
            raise self._error("printed neither a token nor a client certificate")
        pair = (str(cert).encode(), str(key).encode()) if cert else None
        if pair is not None and pair != self._cert:
            try:
                load_cert_chain(ssl.create_default_context(), *pair)
            except ssl.SSLError as exc:
                raise self._error(f"printed a client certificate and key that cannot be used: {exc}") from None
        now = self._clock()
        stamp = status.get("expirationTimestamp")
        if stamp:
            try:
                expiry = parse_rfc3339(str(stamp))
            except ValueError:
                raise self._error(f"printed an unreadable expirationTimestamp {stamp!r}") from None
            lifetime = (expiry - datetime.datetime.now(datetime.UTC)).total_seconds()
            self._expires_at = now + lifetime
            lead = min(MAX_LEAD, max(0.0, lifetime) / 5)
            self._refresh_at = max(now + MIN_INTERVAL, self._expires_at - lead)
        else:
            self._expires_at = None
            self._refresh_at = float("inf")  # until the apiserver refuses it
        if pair != self._cert:
            self.tls_version += 1
        if token != self._token or pair != self._cert:
            self.version += 1
        self._token, self._cert = token, pair
        self._log.debug("credential obtained", expires_in=self.expires_in(), runs=self.runs)
