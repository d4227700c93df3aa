"""Every setting of the runtime, built in one place from a YAML file, the environment and flags.

Precedence, highest first: flags (`--set section.key=value` and the named flags of
`vkprovider run`), environment (`VKPROVIDER_SECTION__KEY`), the YAML file, the defaults below.
Everything else receives these objects as arguments. Units are in the field names' descriptions.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class KubeSettings(_Section):
    kubeconfig: Path | None = Field(None, description="Kubeconfig of the front-end cluster; unset: in-cluster account.")
    context: str | None = Field(None, description="Context in the kubeconfig; unset: its current context.")
    request_timeout: float = Field(30.0, description="Seconds before an API request is abandoned.")
    watch_timeout: float = Field(
        300.0,
        description="Seconds a watch lasts before it is opened again from where it was, each drawn from "
        "[this, twice this) so watches of many processes do not end together (client-go: 5-10 minutes); "
        "every apiserver the process talks to, the members' too.",
        ge=1.0,
    )


class NodeSettings(_Section):
    name: str = Field("vkprovider", description="Name of the virtual node.")
    provider_id: str = Field("memory", description="Value of the node taint and of the provider label.")
    taint: bool = Field(True, description="Register the node with the NoSchedule taint below.")
    taint_key: str = Field("virtual-kubelet.io/provider", description="Key of the node taint.")
    taint_effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"
    labels: dict[str, str] = Field(default_factory=dict, description="Extra node labels.")
    address: str | None = Field(
        None, description="InternalIP the apiserver dials for logs; unset: $VKUBELET_POD_IP, else 127.0.0.1."
    )
    status_interval: float = Field(60.0, description="Seconds between full node status updates (also on change).")
    status_min_interval: float = Field(0.5, description="Seconds between two node status patches at most.")
    lease_duration: int = Field(40, description="Seconds the node Lease is valid.")
    lease_renew_interval: float = Field(10.0, description="Seconds between Lease renewals.")
    capacity: dict[str, str] = Field(
        default_factory=dict, description="Capacity when the provider reports none (cpu, memory, pods...)."
    )

    def internal_ip(self) -> str:
        return self.address or os.environ.get("VKUBELET_POD_IP") or "127.0.0.1"


class PodSettings(_Section):
    workers: int = Field(
        64,
        ge=1,
        description="Pods synced in parallel (one key at a time each). Each sync waits on one apiserver "
        "request, so this over the apiservers' latency bounds the pods per second: 64 at 300 ms is 100 "
        "syncs a second, two per pod (the member create, the front-end status).",
    )
    status_workers: int = Field(
        0,
        ge=0,
        description="Workers beside those that sync only pods whose provider reports them running or "
        "ended (both providers do), so their one status write never waits for a worker while creates and "
        "deletes hold all the others. Without them such pods still go ahead of creates and deletes.",
    )
    status_settle: float = Field(
        1.0,
        ge=0,
        description="Seconds a newly created pod's first status write may wait while the pod is "
        "Pending, so a pod that starts quickly is reported once, as Running. 0 writes at once.",
    )
    status_settle_burst: float = Field(
        30.0,
        ge=0,
        description="Seconds the first status write may wait while Pending in a burst (more new pods "
        "waiting for their first write than there are workers): those writes would compete with the "
        "creates behind them, and the creates can outrun the members' schedulers, so a burst's pods "
        "wait there for tens of seconds (1,000 pods over 3 lab members: up to 16 s). Running or a "
        "failure is still written at once.",
    )
    status_poll_interval: float = Field(5.0, description="Seconds between status polls of providers without push.")
    retry_cap: float = Field(60.0, description="Longest backoff, in seconds, between retries of one pod.")
    event_dedupe_seconds: float = Field(60.0, description="Identical Events within this many seconds are sent once.")


class HttpSettings(_Section):
    port: int = Field(10250, description="HTTPS port of the kubelet API.")
    bind: str = Field("0.0.0.0", description="Address the kubelet API listens on.")
    cert_file: Path | None = Field(None, description="Serving certificate; unset: CSR, else self-signed.")
    key_file: Path | None = Field(None, description="Key of the serving certificate.")
    client_ca_file: Path | None = Field(
        None, description="CA of client certificates; unset: read from kube-system/extension-apiserver-authentication."
    )
    csr: bool = Field(True, description="Request a serving certificate with a kubelet-serving CSR.")
    csr_timeout: float = Field(20.0, description="Seconds to wait for the CSR to be signed before self-signing.")
    authn_cache_seconds: float = Field(120.0, description="Seconds a TokenReview answer is cached.")
    authz_allow_cache_seconds: float = Field(300.0, description="Seconds an allowing SubjectAccessReview is cached.")
    authz_deny_cache_seconds: float = Field(30.0, description="Seconds a denying SubjectAccessReview is cached.")
    health_port: int = Field(10255, description="Plain HTTP port for /healthz, /readyz and /metrics; 0 disables.")
    health_bind: str = Field("0.0.0.0", description="Address of the plain HTTP port.")
    health_auth: bool = Field(
        False,
        description="Authenticate and authorize the plain port's requests as the kubelet port's (all "
        "but /healthz and /readyz, and those from the loopback): for a plain port bound beyond the pod.",
    )
    # What one client may hold of the kubelet port (vkprovider.httpapi.limits); each limit hit
    # is counted in vkprovider_kubelet_limits_hit_total{limit}.
    header_timeout: float = Field(10.0, description="Seconds a client has to finish its TLS handshake and headers.")
    keepalive_idle: float = Field(60.0, description="Seconds a kept-alive connection may wait for its next request.")
    stream_idle: float = Field(
        4 * 3600.0, description="Seconds a streaming session (exec, attach, port-forward) may pass without a byte."
    )
    max_connections: int = Field(1000, description="Open connections, all clients together.", ge=1)
    max_pending_per_address: int = Field(
        64, description="Connections of one client address that have not yet sent a whole request.", ge=1
    )
    max_streams: int = Field(256, description="Open SPDY streams per session.", ge=8)
    max_port_forward_pairs: int = Field(100, description="Port-forward connections per session.", ge=1)
    max_frame_bytes: int = Field(1 << 20, description="Largest SPDY frame accepted.", ge=64 * 1024)
    max_message_bytes: int = Field(1 << 20, description="Largest WebSocket message accepted.", ge=64 * 1024)
    resize_buffer_bytes: int = Field(4096, description="Largest terminal-size message.", ge=256)
    session_buffer_bytes: int = Field(
        1 << 20, description="Bytes a session may hold received and not yet passed on.", ge=64 * 1024
    )
    outbox_bytes: int = Field(256 * 1024, description="Bytes a session may hold for a client that does not read.")
    control_frames_per_second: float = Field(
        100.0,
        description="SPDY frames without data (PING, SYN_STREAM, RST_STREAM, ...) a session may send a second.",
        gt=0,
    )
    control_frame_burst: int = Field(1000, description="Frames without data a session may send at once.", ge=1)
    max_sessions_per_user: int = Field(
        0, description="Streaming sessions one identity may hold; 0: half of what the memory budget holds.", ge=0
    )
    memory_budget_bytes: int = Field(
        1 << 30,
        description="Memory the streaming sessions may hold together; it sets how many may be open at once.",
        ge=16 << 20,
    )


class LeaderElectionSettings(_Section):
    enabled: bool = Field(False, description="Run several replicas; only the holder of the Lease writes.")
    namespace: str = Field("default", description="Namespace of the election Lease.")
    name: str | None = Field(None, description="Name of the election Lease; unset: vkprovider-<node name>.")
    identity: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}", description="This replica's identity."
    )
    lease_duration: float = Field(15.0, description="Seconds a leader's claim is valid without renewal.")
    renew_deadline: float = Field(10.0, description="Seconds a leader keeps trying to renew before it steps down.")
    retry_period: float = Field(2.0, description="Seconds between acquire and renew attempts.")


class LogSettings(_Section):
    format: Literal["auto", "json", "console"] = Field("auto", description="auto: JSON unless stderr is a terminal.")
    level: Literal["debug", "info", "warning", "error"] = "info"


class MemoryProviderSettings(_Section):
    startup_delay: float = Field(0.5, description="Seconds from create to Running.")
    stop_seconds: float = Field(0.5, description="Seconds a graceful delete takes (at most the grace period).")
    log_interval: float = Field(1.0, description="Seconds between log lines of a running container.")
    latency: float = Field(0.0, description="Seconds added to every provider call (a slow backend).")
    state_file: Path | None = Field(None, description="SQLite file keeping the pods across restarts.")
    capacity: dict[str, str] = Field(
        default_factory=lambda: {"cpu": "1000", "memory": "4Ti", "pods": "10000", "ephemeral-storage": "100Ti"}
    )


class ProviderSettings(_Section):
    type: Literal["memory", "federation"] = "memory"
    memory: MemoryProviderSettings = Field(default_factory=MemoryProviderSettings)
    federation: dict[str, Any] = Field(default_factory=dict, description="Settings of the federation provider.")


class ShutdownSettings(_Section):
    grace: float = Field(10.0, description="Seconds in-flight work may take after SIGTERM before it is cancelled.")


class RuntimeSettings(_Section):
    event_loop: Literal["asyncio", "uvloop"] = Field(
        "asyncio",
        description=(
            "The event loop: the standard library's asyncio loop, or uvloop (libuv; about a tenth less"
            " CPU per dispatched pod, but uvloop 0.23 drops what a member sent last over TLS when the"
            " member closes while the provider is still reading slowly: `kubectl cp` out of a pod"
            " failed about one time in two)."
        ),
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VKPROVIDER_", env_nested_delimiter="__", extra="forbid")

    kube: KubeSettings = Field(default_factory=KubeSettings)
    node: NodeSettings = Field(default_factory=NodeSettings)
    pods: PodSettings = Field(default_factory=PodSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    leader_election: LeaderElectionSettings = Field(default_factory=LeaderElectionSettings)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    log: LogSettings = Field(default_factory=LogSettings)
    provider: ProviderSettings = Field(default_factory=ProviderSettings)
    shutdown: ShutdownSettings = Field(default_factory=ShutdownSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _FileSource(settings_cls))


_config_file: Path | None = None


class _FileSource(PydanticBaseSettingsSource):
    """The YAML config file named by `load(config=...)`."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        if _config_file is None:
            return {}
        data = yaml.safe_load(_config_file.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{_config_file}: the config file must be a mapping")
        return data


class SettingsError(ValueError):
    """Settings that cannot be used; the message names the file, variable or flag."""


def _nest(dotted: str, value: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    cursor = out
    parts = dotted.split(".")
    for part in parts[:-1]:
        cursor = cursor.setdefault(part, {})
    cursor[parts[-1]] = value
    return out


def _merge(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
    return into


def load(*, config: Path | None = None, overrides: list[str] | None = None, **flags: Any) -> Settings:
    """Build the settings. `overrides` are `section.key=value` strings (values parsed as YAML)."""
    global _config_file  # noqa: PLW0603 - pydantic-settings sources are built from the class
    if config is not None and not config.is_file():
        raise SettingsError(f"config file {config} does not exist")
    init: dict[str, Any] = {}
    for item in overrides or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SettingsError(f"--set expects section.key=value, got {item!r}")
        _merge(init, _nest(key.strip(), yaml.safe_load(raw)))
    for dotted, value in flags.items():
        if value is not None:
            _merge(init, _nest(dotted, value))
    _config_file = config
    try:
        return Settings(**init)
    except (ValueError, yaml.YAMLError) as exc:
        raise SettingsError(_describe(exc, config)) from exc
    finally:
        _config_file = None


def _describe(exc: Exception, config: Path | None) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        parts = []
        for err in errors():
            loc = ".".join(str(p) for p in err.get("loc", ()))
            parts.append(f"{loc}: {err.get('msg')}")
        where = f" (config {config})" if config else ""
        return "invalid settings" + where + ": " + "; ".join(parts)
    return str(exc)
