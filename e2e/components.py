"""Command lines of the lab's processes, as pure functions of ports, paths and versions.

Kept free of I/O so the flag sets can be read and tested in one place. Sources for the flags:
shared/reference/control_plane.md (envtest, kwokctl and local-up-cluster flag sets, the 1.37
gang-scheduling gates).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Native gang (Workload/PodGroup, beta in 1.37) and topology-aware workload scheduling.
FEATURE_GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
#: v1beta1 carries Workload and PodGroup; v1alpha3 the alpha building blocks (CompositePodGroup).
RUNTIME_CONFIG = "scheduling.k8s.io/v1beta1=true,scheduling.k8s.io/v1alpha3=true"
SERVICE_CIDR = "10.96.0.0/16"
KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
#: Commands KWOK runs in its simulated containers find these first (e2e/kwok/bin/tar).
KWOK_TOOLS = Path(__file__).parent / "kwok" / "bin"

CONTROLLERS = (
    "namespace-controller",
    "clusterrole-aggregation-controller",
    "podgroup-protection-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "garbage-collector-controller",
    "replicaset-controller",
    "deployment-controller",
    "statefulset-controller",
    "daemonset-controller",
    "job-controller",
    "cronjob-controller",
    "ttl-after-finished-controller",
    "pod-garbage-collector-controller",
    "root-ca-certificate-publisher-controller",
    "node-lifecycle-controller",
    "taint-eviction-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "disruption-controller",
    "resourcequota-controller",
    "certificatesigningrequest-signing-controller",
    "certificatesigningrequest-approving-controller",
    "certificatesigningrequest-cleaner-controller",
)


@dataclass(frozen=True, kw_only=True)
class ClusterFiles:
    """Where one cluster's PKI and configuration live."""

    dir: Path
    kubeconfig: Path  # admin kubeconfig, used by the components too

    @property
    def pki(self) -> Path:
        return self.dir / "pki"

    def pem(self, stem: str, ext: str = "crt") -> Path:
        return self.pki / f"{stem}.{ext}"

    @property
    def audit_log(self) -> Path:
        return self.dir / "audit.log"

    @property
    def sa_key(self) -> Path:
        return self.pki / "service-account.key"

    @property
    def sa_public(self) -> Path:
        return self.pki / "service-account.pub"


def etcd_argv(*, binary: Path, data_dir: Path, client_port: int, peer_port: int) -> list[str]:
    client, peer = f"http://127.0.0.1:{client_port}", f"http://127.0.0.1:{peer_port}"
    return [
        str(binary),
        "--name=lab",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=lab={peer}",
        # tmpfs and no fsync: the lab's data is disposable, and fsync dominates write latency.
        "--unsafe-no-fsync=true",
        "--quota-backend-bytes=8589934592",
        "--auto-compaction-mode=periodic",
        "--auto-compaction-retention=5m",
        "--snapshot-count=100000",
        "--log-level=warn",
    ]


def apiserver_argv(*, binary: Path, files: ClusterFiles, cluster: str, port: int, etcd_port: int) -> list[str]:
    return [
        str(binary),
        f"--etcd-servers=http://127.0.0.1:{etcd_port}",
        f"--etcd-prefix=/registry/{cluster}",  # one etcd, one key space per cluster
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        "--advertise-address=127.0.0.1",
        "--endpoint-reconciler-type=none",  # 1.37 refuses a loopback advertise address otherwise
        f"--tls-cert-file={files.pem('apiserver')}",
        f"--tls-private-key-file={files.pem('apiserver', 'key')}",
        f"--client-ca-file={files.pem('ca')}",
        f"--kubelet-client-certificate={files.pem('apiserver-kubelet-client')}",
        f"--kubelet-client-key={files.pem('apiserver-kubelet-client', 'key')}",
        # The aggregation layer (metrics-server's Metrics API): the apiserver proxies to an
        # extension apiserver as front-proxy-client, its user in headers the extension trusts
        # from that name under the front-proxy CA only (a CA of its own, as kubeadm makes it).
        f"--requestheader-client-ca-file={files.pem('front-proxy-ca')}",
        f"--requestheader-allowed-names={FRONT_PROXY_CLIENT}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={files.pem('front-proxy-client')}",
        f"--proxy-client-key-file={files.pem('front-proxy-client', 'key')}",
        # Dial kubelets by IP (as kubeadm configures it): a Hostname first would send DNS queries
        # for node names off the machine.
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={files.sa_public}",
        f"--service-account-signing-key-file={files.sa_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        "--allow-privileged=true",
        f"--feature-gates={FEATURE_GATES}",
        f"--runtime-config={RUNTIME_CONFIG}",
        # Loopback benchmarks push thousands of requests a second; the defaults (400/200) would
        # measure the apiserver's throttle rather than our code.
        "--max-requests-inflight=1000",
        "--max-mutating-requests-inflight=500",
        "--profiling=false",
        # Requests of users in AUDITED_GROUP only (tests give the processes they judge such an
        # identity), so a test can read what a process did from the apiserver's own record.
        f"--audit-policy-file={files.dir / 'audit-policy.yaml'}",
        f"--audit-log-path={files.audit_log}",
        "--audit-log-format=json",
        "--audit-log-maxsize=0",
        "--v=0",
    ]


#: The name the apiserver proxies to extension apiservers with (the aggregation layer).
FRONT_PROXY_CLIENT = "front-proxy-client"


#: Client certificates carrying this group (O=) have their requests audited by the lab.
AUDITED_GROUP = "vkprovider:audited"


def audit_policy() -> str:
    """Metadata (who, what, when, answer code, user agent) of the audited group's requests and
    of ServiceAccounts' writes and node-proxy requests (the lab runs no pods of its own: those
    are tests' processes holding an account's token, such as a chart's provider or a Prometheus
    scraping through the node proxy); nothing else."""
    return (
        "apiVersion: audit.k8s.io/v1\n"
        "kind: Policy\n"
        "omitStages: [RequestReceived]\n"
        "rules:\n"
        f"- level: Metadata\n  userGroups: [{AUDITED_GROUP!r}]\n"
        "- level: Metadata\n  userGroups: [system:serviceaccounts]\n"
        "  verbs: [create, update, patch, delete, deletecollection]\n"
        "- level: Metadata\n  userGroups: [system:serviceaccounts]\n"
        "  resources: [{group: '', resources: [nodes/proxy]}]\n"
        "- level: None\n"
    )


def _component_common(files: ClusterFiles, port: int) -> list[str]:
    return [
        f"--kubeconfig={files.kubeconfig}",
        f"--authentication-kubeconfig={files.kubeconfig}",
        f"--authorization-kubeconfig={files.kubeconfig}",
        "--leader-elect=false",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={files.dir / 'serving'}",
        "--profiling=false",
    ]


def scheduler_config(*, files: ClusterFiles) -> str:
    """KubeSchedulerConfiguration: the client QPS defaults (50/100) would cap binding at about
    50 pods/s, far below what the dispatch benchmarks offer."""
    return (
        "apiVersion: kubescheduler.config.k8s.io/v1\n"
        "kind: KubeSchedulerConfiguration\n"
        "clientConnection:\n"
        f"  kubeconfig: {files.kubeconfig}\n"
        "  qps: 1000\n"
        "  burst: 2000\n"
        "leaderElection:\n"
        "  leaderElect: false\n"
    )


def scheduler_argv(*, binary: Path, files: ClusterFiles, port: int) -> list[str]:
    return [
        str(binary),
        f"--config={files.dir / 'scheduler.yaml'}",
        f"--authentication-kubeconfig={files.kubeconfig}",
        f"--authorization-kubeconfig={files.kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={files.dir / 'serving'}",
        f"--feature-gates={FEATURE_GATES}",
    ]


def controller_manager_argv(*, binary: Path, files: ClusterFiles, port: int) -> list[str]:
    return [
        str(binary),
        *_component_common(files, port),
        f"--controllers={','.join(CONTROLLERS)}",
        f"--service-account-private-key-file={files.sa_key}",
        f"--root-ca-file={files.pem('ca')}",
        # Signs approved CSRs (kubelet-serving ones included) with the cluster CA.
        f"--cluster-signing-cert-file={files.pem('ca')}",
        f"--cluster-signing-key-file={files.pem('ca', 'key')}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--feature-gates=GenericWorkload=true",
        # Faster than the defaults so outage tests do not wait minutes; still longer than a
        # lease renewal (10 s) so healthy nodes never flap.
        "--node-monitor-grace-period=40s",
        "--node-monitor-period=5s",
        "--concurrent-deployment-syncs=10",
        "--concurrent-replicaset-syncs=10",
        "--concurrent-job-syncs=10",
        "--concurrent-gc-syncs=30",
        "--kube-api-qps=500",
        "--kube-api-burst=1000",
    ]


def kwok_debug_config(log: Path, workdir: Path) -> str:
    """What KWOK's kubelet server answers for every pod it runs: `pods/log` and `attach` read
    `log`; `exec` runs the command on this machine in `workdir` (the server listens on loopback
    only, where every simulated node is)."""
    return (
        "apiVersion: kwok.x-k8s.io/v1alpha1\nkind: ClusterLogs\nmetadata: {name: lab-logs}\n"
        f"spec:\n  logs:\n  - logsFile: {log}\n    previousLogsFile: {log}\n    follow: true\n"
        "---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: ClusterAttach\nmetadata: {name: lab-attach}\n"
        f"spec:\n  attaches:\n  - logsFile: {log}\n"
        "---\napiVersion: kwok.x-k8s.io/v1alpha1\nkind: ClusterExec\nmetadata: {name: lab-exec}\n"
        f"spec:\n  execs:\n  - local:\n      workDir: {workdir}\n"
    )


def kwok_argv(
    *,
    binary: Path,
    files: ClusterFiles,
    stages: Path,
    pod_cidr: str,
    port: int,
    debug: Path | None = None,
    metrics: Path | None = None,
) -> list[str]:
    # The lab's tar first on the PATH of the commands KWOK runs (see e2e/kwok/bin/tar); `env`
    # execs KWOK, so the process is KWOK's.
    path = f"PATH={KWOK_TOOLS}{os.pathsep}{os.environ.get('PATH', '/usr/bin:/bin')}"
    return [
        "/usr/bin/env",
        path,
        str(binary),
        f"--kubeconfig={files.kubeconfig}",
        "--manage-all-nodes=false",
        # Only nodes the lab created: never a virtual node that a test registers in a member.
        f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
        f"--config={stages}",
        "--node-lease-duration-seconds=40",
        f"--cidr={pod_cidr}",
        f"--server-address=127.0.0.1:{port}",
        *([f"--config={debug}"] if debug else []),
        # The kubelet's /metrics/resource per node, of usage simulated per pod (e2e/kwok/metrics.yaml).
        *([f"--config={metrics}"] if metrics else []),
        # Port-forwards come from ClusterPortForward objects a test creates (e2e/crds).
        *(["--enable-crds=ClusterPortForward"] if debug else []),
    ]


#: metrics-server's scrape interval: its minimum, so `kubectl top` answers soon after a pod starts.
METRIC_RESOLUTION = "10s"
#: The front end's metrics-server scrapes only virtual nodes labelled so (the demo's, and those of
#: the tests of `kubectl top`): the providers of other tests see no scrape, nor their members
#: the requests a scrape makes of them.
SCRAPED_LABEL = "e2e.vkprovider.io/scraped"


def metrics_server_argv(*, binary: Path, files: ClusterFiles, port: int, member: bool) -> list[str]:
    """metrics-server as kwokctl runs it beside KWOK: kubelets dialled at their node's address
    and status port; their serving certificates are self-signed (KWOK's, a provider's own)."""
    selector = "type=kwok" if member else f"{SCRAPED_LABEL}=true"
    return [
        str(binary),
        f"--kubeconfig={files.kubeconfig}",
        f"--authentication-kubeconfig={files.kubeconfig}",
        f"--authorization-kubeconfig={files.kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--cert-dir={files.dir / 'metrics-server'}",
        f"--metric-resolution={METRIC_RESOLUTION}",
        "--kubelet-request-timeout=5s",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        "--kubelet-use-node-status-port",
        "--kubelet-insecure-tls",
        f"--node-selector={selector}",
        "--profiling=false",
    ]


def metrics_api_objects(port: int) -> list[tuple[str, dict[str, Any]]]:
    """(collection path, object) of what makes metrics-server the cluster's Metrics API: a
    Service the aggregator resolves to loopback (an ExternalName; Endpoints may not name a
    loopback address) and the APIService of metrics.k8s.io/v1beta1 behind it."""
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "metrics-server", "namespace": "kube-system"},
        "spec": {
            "type": "ExternalName",
            "externalName": "127.0.0.1",
            "ports": [{"name": "https", "port": port, "targetPort": port}],
        },
    }
    api_service = {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": "v1beta1.metrics.k8s.io"},
        "spec": {
            "group": "metrics.k8s.io",
            "version": "v1beta1",
            "service": {"name": "metrics-server", "namespace": "kube-system", "port": port},
            # Its certificate is self-signed in its --cert-dir, as metrics-server's own manifests run it.
            "insecureSkipTLSVerify": True,
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }
    return [
        ("/api/v1/namespaces/kube-system/services", service),
        ("/apis/apiregistration.k8s.io/v1/apiservices", api_service),
    ]
