"""Settings of the federation provider (`provider.federation` in the runtime's settings) and of
one member cluster, whether declared there or as a MemberCluster object."""

from __future__ import annotations

import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from federation import labels
from federation.capacity import quantities
from federation.capacity.summary import CapacityPolicy, TimeWindow
from federation.podsecurity import DEFAULT as DEFAULT_POD_SECURITY
from federation.podsecurity import Level


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class WindowConfig(_Model):
    start: str = Field(description='Local time "HH:MM" the window opens.')
    end: str = Field(description='Local time "HH:MM" it closes; before start means it crosses midnight.')
    multiplier: float = Field(1.0, ge=0, description="Share of the lendable capacity lent while open.")
    cap: dict[str, str] = Field(default_factory=dict, description="Caps on the sums while open (quantities).")

    @field_validator("start", "end")
    @classmethod
    def _clock(cls, value: str) -> str:
        datetime.time.fromisoformat(value)
        return value


class CapacityConfig(_Model):
    model: Literal["requests", "colocation"] = Field("requests", description="How lendable capacity is computed.")
    reserve_percent: float = Field(
        10.0, ge=0, le=100, alias="reservePercent", description="Share of each node kept for online bursts."
    )
    cap: dict[str, str] = Field(default_factory=dict, description="Hard cap on what the member lends (its quota).")
    windows: list[WindowConfig] = Field(default_factory=list, description="Time-of-day multipliers and caps.")
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="Taints our pods tolerate there (tainted nodes count only then)."
    )

    def policy(self) -> CapacityPolicy:
        return CapacityPolicy(
            model=self.model,
            reserve_percent=self.reserve_percent,
            tolerations=tuple(self.tolerations),
            windows=tuple(
                TimeWindow(
                    datetime.time.fromisoformat(w.start),
                    datetime.time.fromisoformat(w.end),
                    w.multiplier,
                    quantities.vector(w.cap),
                )
                for w in self.windows
            ),
            cap=quantities.vector(self.cap),
        )


class ReclaimConfig(_Model):
    """How a member takes capacity back (federation.reclaim) and where our bands sit in it."""

    notice_seconds: float = Field(
        30.0, ge=0, alias="noticeSeconds", description="Checkpoint notice when neither pod nor job asks for one."
    )
    max_notice_seconds: float = Field(
        300.0, ge=0, alias="maxNoticeSeconds", description="Longest notice a pod or job may ask for."
    )
    online_threshold: int = Field(
        0,
        alias="onlineThreshold",
        le=1_000_000_000,
        description="Priority from which a member pod is online; our classes sit below it.",
    )
    offline_preemption: bool = Field(
        False,
        alias="offlinePreemption",
        description="Let a higher offline band (PS) preempt a lower one (workers) in the member.",
    )


class TenantAccount(_Model):
    namespace: str
    name: str


class TenancyConfig(_Model):
    """Set by `vkprovider onboard`: the provider reaches the member as one tenant among others
    (federation.tenancy.policy) and must give itself its rights in each namespace it creates."""

    tenant: str = Field(description="The tenant's name; its member namespaces carry vkprovider.io/tenant.")
    cluster_role: str = Field(alias="clusterRole", description="ClusterRole bound in each tenant namespace.")
    service_account: TenantAccount = Field(alias="serviceAccount", description="The provider's account there.")
    quota: dict[str, str] = Field(
        default_factory=dict, description="ResourceQuota (requests) created in each tenant namespace."
    )
    allowed_tolerations: list[str] = Field(
        default_factory=list,
        alias="allowedTolerations",
        description="Taint keys the tenant's pods may tolerate there, beyond the node lifecycle ones Kubernetes "
        "adds to every pod; a pod with another toleration is refused before it is sent.",
    )
    monitoring_namespaces: list[str] = Field(
        default_factory=list,
        alias="monitoringNamespaces",
        description="Member namespaces whose pods may reach the tenant's (its NetworkPolicy admits them).",
    )
    token_seconds: int = Field(
        3600,
        ge=600,
        alias="tokenSeconds",
        description="Lifetime the provider asks for its member tokens (TokenRequest); renewed before expiry.",
    )


class MemberConfig(_Model):
    name: str = Field(description="Name of the member cluster.")
    kubeconfig: Path | None = Field(None, description="Kubeconfig file of the member (or kubeconfig_secret).")
    enabled: bool = Field(True, description="A disabled member lends nothing and receives no pods.")
    weight: int = Field(1, ge=0, description="Preference among members that can host a job.")
    capacity: CapacityConfig = Field(default_factory=CapacityConfig)
    network_pod_label: str = Field(labels.NETWORK_POD, description="Node label naming a node's network pod.")
    source: Literal["direct", "agent"] = Field("direct", description="Watch the member, or read its capacity agent.")
    agent_address: str | None = Field(None, description="host:port of the member's capacity agent.")
    agent_tls_ca: Path | None = Field(None, description="CA of the agent's certificate; unset: plaintext.")
    namespace_prefix: str = Field("", description="Member namespace = prefix + front-end namespace.")
    gang_api: Literal["native", "scheduler-plugins", "volcano"] = Field(
        "native", description="The gang object the member's scheduler understands."
    )
    scheduler_name: str = Field("default-scheduler", description="schedulerName of pods created there.")
    service_account: str = Field("default", description="Service account our pods use in the member.")
    reclaim: ReclaimConfig = Field(default_factory=ReclaimConfig)
    pod_security: Level = Field(
        DEFAULT_POD_SECURITY,
        alias="podSecurity",
        description="Pod Security Standards level our pods must meet there: restricted, baseline or privileged. "
        "Checked before a pod is sent (a pod no member admits ends Failed, reason ForbiddenByMemberPolicy) "
        "and set as the Pod Security Admission labels (enforce, warn, audit) of our member namespaces.",
    )
    tenancy: TenancyConfig | None = Field(None, description="Set when the member was joined by `vkprovider onboard`.")


class HistoryConfig(_Model):
    """The capacity history and the lent/used statistics (federation.view.tide). Memory is
    series x slots x 4 bytes: 12 series a member at the defaults, 0.6 MB a member."""

    tiers: list[tuple[float, int]] = Field(
        default_factory=lambda: [(10.0, 8640), (300.0, 4032)],
        min_length=1,
        description="[seconds per point, points] per resolution: 24 h at 10 s and 14 days at 5 min.",
    )
    max_series: int = Field(1024, gt=0, description="At most this many series (member x resource x kind).")
    file: str = Field(
        "",
        description="A file the history and the reclaims kept are read from at start and written to "
        "every save_interval seconds and at stop (federation.view.store); empty: memory only.",
    )
    save_interval: float = Field(300.0, gt=0, description="Seconds between two writes of `file`.")


class StreamingConfig(_Model):
    """Sessions of kubectl exec, attach and port-forward carried to members (federation.streams.session)."""

    idle_timeout: float = Field(
        14400.0,
        gt=0,
        description="Seconds without traffic either way before a session is closed (as the "
        "kubelet's streamingConnectionIdleTimeout, 4 h).",
    )
    max_duration: float = Field(0.0, ge=0, description="Seconds a session may last at most; 0: no limit.")


class RoutingConfig(_Model):
    """The routing webhook (federation.dispatch.routing, federation.dispatch.webhook)."""

    enabled: bool = Field(False, description="Serve and register the mutating webhook that routes pods by band.")
    port: int = Field(9443, description="HTTPS port of the webhook.")
    bind: str = Field("0.0.0.0", description="Address the webhook listens on.")
    hosts: list[str] = Field(
        default_factory=lambda: ["127.0.0.1"], min_length=1, description="Names and IPs its certificate carries."
    )
    url: str | None = Field(
        None, description="Base URL the apiserver calls (a Service's https address); default https://hosts[0]:port."
    )
    configuration_name: str | None = Field(
        None, description="Name of the MutatingWebhookConfiguration; default vkprovider-routing-<node>."
    )


class KueueQuotaConfig(_Model):
    """Kueue's quota kept to the tide (federation.queues): the virtual node's ResourceFlavor in a
    ClusterQueue gets, as its nominalQuota, what the node offers now (its published, damped
    allocatable), so Kueue admits no more than the members can lend."""

    cluster_queue: str | None = Field(None, description="The ClusterQueue to keep; unset: off.")
    flavor: str = Field("", description="The ResourceFlavor of the virtual node in that ClusterQueue.")
    node: str | None = Field(
        None, description="The virtual node whose allocatable is the quota; default the provider's (pooled) node."
    )

    @model_validator(mode="after")
    def _flavor_named(self) -> KueueQuotaConfig:
        if self.cluster_queue and not self.flavor:
            raise ValueError("kueue_quota.flavor must name the virtual node's ResourceFlavor in the ClusterQueue")
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.cluster_queue)


class FederationConfig(_Model):
    members: list[MemberConfig] = Field(default_factory=list, description="Members declared in the settings.")
    member_objects: bool = Field(True, description="Also take members from MemberCluster objects.")
    member_selector: str = Field(
        "",
        description="Label selector of the MemberCluster objects this provider takes (for one tenant's "
        "provider among several in a front end: vkprovider.io/tenant=NAME); empty: all of them.",
    )
    virtual_nodes: Literal["pooled", "per-member"] = Field(
        "pooled", description="One virtual node over all members, or one per member."
    )
    unreachable_grace: float = Field(30.0, description="Seconds a member may be unreachable before losing capacity.")
    pods_lost_after: float = Field(
        300.0,
        gt=0,
        description="Seconds a member may be unreachable before its pods are declared lost (MemberLost); "
        "until then they keep their last known status. Mirrors the 300 s tolerationSeconds for "
        "node.kubernetes.io/unreachable, as unreachable_grace mirrors the node monitor's grace.",
    )
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    kueue_quota: KueueQuotaConfig = Field(default_factory=KueueQuotaConfig)
    streaming: StreamingConfig = Field(default_factory=StreamingConfig)
    history: HistoryConfig = Field(default_factory=HistoryConfig)
    orphan_interval: float = Field(
        120.0, gt=0, description="Seconds between checks for member pods whose front-end pods are gone or ended."
    )
    publish_interval: float = Field(0.5, description="Seconds between capacity recomputations at most.")
    secret_exec_commands: list[str] = Field(
        default_factory=list,
        description="Exec plugin commands (exactly as written) a kubeconfig in a MemberCluster's Secret may "
        "name; they run inside the provider. Any other is refused with a condition on the MemberCluster.",
    )
    secret_file_paths: list[str] = Field(
        default_factory=list,
        description="Directories whose files (tokenFile, client certificates, CAs) a kubeconfig in a "
        "MemberCluster's Secret may name; they are read inside the provider. Any other is refused.",
    )
    kept_log_bytes: int = Field(
        1 << 20,
        ge=0,
        description="Bytes of each container's log kept when a member pod of ours is reclaimed or deleted "
        "in the member, served by `kubectl logs` on the Failed front-end pod (0: none kept).",
    )
    token_renew_after: float = Field(
        0.5,
        gt=0,
        lt=1,
        description="Share of a tenant member token's lifetime after which the provider renews it.",
    )
    credential_probe_interval: float = Field(
        30.0,
        gt=0,
        description="Seconds between checks that a tenant member still accepts the provider's token "
        "(a revoked one is noticed within this time).",
    )
    damping_hold: float = Field(10.0, description="Seconds a small increase waits before it is published.")
    usage_interval: float = Field(
        10.0,
        gt=0,
        description="Seconds between two reads of a member's Metrics API: however often the "
        "provider's /stats/summary and /metrics/resource are scraped, each member is asked about once "
        "per interval (a read is reused for 0.9 of it from when it began, so a scraper on the same "
        "period gets a fresh one each time; metrics-server's default resolution is 60 s, 10 s is its least).",
    )
