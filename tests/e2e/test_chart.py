"""The Helm chart (charts/vkprovider): rendering with the pinned helm, and installs into the
lab's front end that check what its accounts may do (issue 11, issue 36): exactly the documented
list, and, where RBAC cannot name the objects, the admission policy's limits.

Rendering needs only helm; the installs use the lab. The chart's pods run from the image in
test_chart_pods and test_chart_upgrade.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import binaries
from e2e import metrics as e2e_metrics
from e2e.fixtures import Lab
from tests.e2e.helpers import (
    can_i,
    eventually,
    install_member_cluster_crd,
    make_namespace,
    service_account_kubeconfig,
)
from vkprovider.kube import ApiError, KubeClient, NotFound, load_kubeconfig

pytestmark = [pytest.mark.e2e]

CHART = Path(__file__).resolve().parents[2] / "charts" / "vkprovider"
CRD = Path(__file__).resolve().parents[2] / "federation" / "crds" / "memberclusters.yaml"

#: Everything the chart's ServiceAccount may do on the front end, as `kubectl auth can-i --list`
#: shows it (resource, verbs), beyond what every authenticated account gets. A new permission
#: fails test_the_service_account_can_do_exactly_the_documented_list until this list (and the
#: comment in templates/rbac.yaml) say why.
DOCUMENTED = {
    "nodes": {"get", "list", "watch", "create", "patch", "delete"},
    "nodes/status": {"patch"},
    "pods": {"get", "list", "watch", "patch", "delete"},
    "pods/status": {"patch"},
    "events": {"create"},
    "configmaps": {"get"},
    "secrets": {"get", "patch"},  # patch: a tenant member's renewed token written back
    "services": {"list"},
    "namespaces": {"get"},  # kube-system only: the front end's identity
    "tokenreviews.authentication.k8s.io": {"create"},
    "subjectaccessreviews.authorization.k8s.io": {"create"},
    "certificatesigningrequests.certificates.k8s.io": {"get", "create"},
    "certificatesigningrequests.certificates.k8s.io/approval": {"update"},
    "signers.certificates.k8s.io": {"approve"},
    "podgroups.scheduling.k8s.io": {"get", "patch"},
    "podgroups.scheduling.x-k8s.io": {"get", "patch"},
    "podgroups.scheduling.volcano.sh": {"get", "patch"},
    "jobsets.jobset.x-k8s.io": {"get", "patch"},
    "jobs.batch": {"get"},
    "replicasets.apps": {"get"},
    "statefulsets.apps": {"get"},
    "memberclusters.vkprovider.io": {"get", "list", "watch", "patch", "delete"},
    "memberclusters.vkprovider.io/status": {"patch"},
    # in the release namespace: the election Lease and the drain's scale-down
    "leases.coordination.k8s.io": {"create", "get", "update"},
    "deployments.apps": {"get", "patch"},
}


#: A refusal in a provider's log; the word boundaries keep "403" in a timestamp or port out.
DENIED = re.compile(r"\b403\b|Forbidden")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binaries.ensure_all()["helm"]), *args], capture_output=True, text=True, check=check, timeout=120
    )


def render(*sets: str, values: dict[str, Any] | None = None, tmp: Path | None = None) -> list[dict[str, Any]]:
    args = ["template", "rel", str(CHART), "--namespace", "vk-system"]
    for item in sets:
        args += ["--set", item]
    if values is not None and tmp is not None:
        path = tmp / f"values-{uuid.uuid4().hex[:6]}.yaml"
        path.write_text(yaml.safe_dump(values))
        args += ["-f", str(path)]
    out = helm(*args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    assert len(found) == 1, f"{kind} {name or ''}: {len(found)} rendered"
    return found[0]


def settings_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and "settings.yaml" in d.get("data", {})]
    return dict(yaml.safe_load(config["data"]["settings.yaml"]))


def pod_spec(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, kind, name)["spec"]["template"]["spec"]
    return spec


MEMBER = {"name": "m1", "kubeconfig": "apiVersion: v1\nkind: Config\n"}


@pytest.mark.shares_lab
def test_helm_lint_is_clean(tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({"members": [MEMBER], "routing": {"enabled": True}}))
    result = helm("lint", str(CHART), "-f", str(values), "--strict", check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.shares_lab
def test_one_replica_is_recreated_more_roll_and_the_lease_is_always_held(tmp_path: Path) -> None:
    """A single replica never overlaps itself in a rollout (Recreate), and the leader Lease is
    held even then: a pod the kubelet believes gone while it still runs does not write beside
    its successor."""
    single = render()
    assert settings_of(single)["leader_election"]["enabled"] is True
    assert one(single, "Deployment")["spec"]["replicas"] == 1
    assert one(single, "Deployment")["spec"]["strategy"] == {"type": "Recreate"}
    three = render("replicas=3", "podDisruptionBudget.enabled=true")
    assert settings_of(three)["leader_election"]["enabled"] is True
    assert one(three, "Deployment")["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert one(three, "PodDisruptionBudget")["spec"]["minAvailable"] == 1
    assert not [d for d in render("podDisruptionBudget.enabled=true") if d["kind"] == "PodDisruptionBudget"]


@pytest.mark.shares_lab
def test_extra_env_volumes_and_account_annotations_reach_the_provider_and_the_drain(tmp_path: Path) -> None:
    """What an exec plugin in a member kubeconfig needs (a program, its credentials, a cloud's
    workload identity) reaches both containers that read the members."""
    values: dict[str, Any] = {
        "extraEnv": [{"name": "AWS_REGION", "value": "eu-west-1"}],
        "extraVolumes": [{"name": "aws", "secret": {"secretName": "aws"}}],
        "extraVolumeMounts": [{"name": "aws", "mountPath": "/opt/aws", "readOnly": True}],
        "serviceAccount": {"annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/vk"}},
        "federation": {"secretExecCommands": ["/opt/aws/bin/aws"], "secretFilePaths": ["/opt/aws"]},
    }
    docs = render(values=values, tmp=tmp_path)
    for kind, name in (("Deployment", "rel"), ("Job", "rel-drain")):
        spec = pod_spec(docs, kind, name)
        container = spec["containers"][0]
        assert values["extraEnv"][0] in container["env"], name
        assert values["extraVolumeMounts"][0] in container["volumeMounts"], name
        assert values["extraVolumes"][0] in spec["volumes"], name
        assert spec["serviceAccountName"] == "rel"
    assert one(docs, "ServiceAccount", "rel")["metadata"]["annotations"] == values["serviceAccount"]["annotations"]
    federation = settings_of(docs)["provider"]["federation"]
    assert federation["secret_exec_commands"] == ["/opt/aws/bin/aws"]
    assert federation["secret_file_paths"] == ["/opt/aws"]
    refused = helm("template", "rel", str(CHART), "--set", "federation.secretFilePaths={relative}", check=False)
    assert refused.returncode != 0 and "secretFilePaths" in refused.stderr, refused.stderr


#: The settings the chart itself writes into http.*: every other one is a kubeletLimits value.
CHART_HTTP = {"port", "bind", "cert_file", "key_file", "client_ca_file", "csr", "csr_timeout",
              "authn_cache_seconds", "authz_allow_cache_seconds", "authz_deny_cache_seconds",
              "health_port", "health_bind", "health_auth"}  # fmt: skip


@pytest.mark.shares_lab
def test_kubelet_limits_are_the_providers_settings(tmp_path: Path) -> None:
    """kubeletLimits names exactly the provider's limits of the kubelet port (camelCase), and what
    it renders loads as the provider's settings."""
    from vkprovider.settings import HttpSettings, Settings

    def camel(name: str) -> str:
        first, *rest = name.split("_")
        return first + "".join(word.title() for word in rest)

    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["kubeletLimits"]["properties"]
    assert set(schema) == {camel(f) for f in HttpSettings.model_fields if f not in CHART_HTTP}
    docs = render(values={"kubeletLimits": {"maxStreams": 64, "headerTimeout": 5.5}}, tmp=tmp_path)
    settings = settings_of(docs)
    assert settings["http"]["max_streams"] == 64 and settings["http"]["header_timeout"] == 5.5
    # Within the container's 1Gi: the provider's own ~100-200 MiB and the sessions' budget.
    assert settings["http"]["memory_budget_bytes"] == 512 << 20
    loaded = Settings.model_validate(settings)
    assert loaded.http.max_streams == 64 and loaded.http.memory_budget_bytes == 512 << 20
    refused = helm("template", "rel", str(CHART), "--set", "kubeletLimits.maxStream=64", check=False)
    assert refused.returncode != 0 and "maxStream" in refused.stderr, refused.stderr


@pytest.mark.shares_lab
def test_the_crds_are_applied_before_each_upgrade_by_an_account_that_may_touch_only_them() -> None:
    docs = render()
    job = one(docs, "Job", "rel-crds")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][:4] == ["crds", "apply", "--file", "/etc/vkprovider/crds"]
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    crds = one(docs, "ConfigMap", "rel-crds")
    assert crds["data"] == {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    role = one(docs, "ClusterRole", "rel-vk-system-crds")
    assert role["rules"] == [
        {
            "apiGroups": ["apiextensions.k8s.io"],
            "resources": ["customresourcedefinitions"],
            "resourceNames": ["memberclusters.vkprovider.io"],
            "verbs": ["get", "patch"],
        }
    ]
    # Everything the Job needs is created before it (a lower weight), as hooks: the release's own
    # objects are not yet upgraded when pre-upgrade hooks run.
    for kind, name in (("ServiceAccount", "rel-crds"), ("ClusterRole", "rel-vk-system-crds"),
                       ("ClusterRoleBinding", "rel-vk-system-crds"), ("ConfigMap", "rel-crds")):  # fmt: skip
        annotations = one(docs, kind, name)["metadata"]["annotations"]
        assert annotations["helm.sh/hook"] == "pre-upgrade" and int(annotations["helm.sh/hook-weight"]) < 0
    assert not [d for d in render("crds.applyOnUpgrade=false") if d["metadata"]["name"].endswith("-crds")]


@pytest.mark.shares_lab
def test_the_deployment_is_hardened_and_probed() -> None:
    spec = one(render(), "Deployment")["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert "podAntiAffinity" in spec["affinity"]


@pytest.mark.shares_lab
def test_the_plain_port_is_loopback_unless_exposed() -> None:
    """The plain port is unauthenticated: by default it listens on the pod's loopback, is in no
    Service, and the probes ask it from inside the container; exposed, it listens on the pod's
    address, the Service carries it and the kubelet probes it over HTTP."""
    docs = render()
    assert settings_of(docs)["http"]["health_bind"] == "127.0.0.1"
    assert settings_of(docs)["http"]["health_auth"] is False  # the pod's own loopback only
    assert settings_of(docs)["http"]["bind"] == "0.0.0.0"  # the kubelet API (authenticated)
    container = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "metrics" not in [p["name"] for p in container["ports"]]
    assert "metrics" not in [p["name"] for p in one(docs, "Service")["spec"]["ports"]]
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        command = container[probe]["exec"]["command"]
        assert command[0] == "python" and "'127.0.0.1', 10255" in command[-1] and f"'{path}'" in command[-1]
        # The probe's code runs here against a server that answers 200, 503, or nothing.
        assert probe_exit(command, 200) == 0 and probe_exit(command, 503) != 0 and probe_exit(command, None) != 0
    refused = helm("template", "rel", str(CHART), "--set", "serviceMonitor.enabled=true", check=False)
    assert refused.returncode != 0 and "ports.exposeMetrics" in refused.stderr, refused.stderr

    exposed = render("ports.exposeMetrics=true", "serviceMonitor.enabled=true")
    assert settings_of(exposed)["http"]["health_bind"] == "0.0.0.0"
    # Then behind the kubelet port's authentication (tests/unit/test_plain_port_auth.py), and
    # Prometheus scrapes with its account's token.
    assert settings_of(exposed)["http"]["health_auth"] is True
    container = one(exposed, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 10255} in container["ports"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert "metrics" in [p["name"] for p in one(exposed, "Service")["spec"]["ports"]]
    endpoint = one(exposed, "ServiceMonitor")["spec"]["endpoints"][0]
    assert endpoint["port"] == "metrics"
    assert endpoint["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"


def probe_exit(command: list[str], status: int | None) -> int:
    """The exit status of an exec probe's Python code (its port replaced by a local server's that
    answers `status`, or by a closed port when None)."""
    import http.server
    import socket
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status or 200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    port = server.server_address[1]
    if status is None:
        server.server_close()
        with socket.socket() as sock:  # a port nobody listens on
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
    else:
        threading.Thread(target=server.handle_request, daemon=True).start()
    try:
        code = command[-1].replace("10255", str(port))
        return subprocess.run(
            [sys.executable, *command[1:-1], code], capture_output=True, check=False, timeout=30
        ).returncode
    finally:
        server.server_close()


@pytest.mark.shares_lab
def test_every_read_only_container_has_a_writable_tmp() -> None:
    """Python, TLS and client libraries write temporary files: every container whose root
    filesystem is read-only (the Deployment's, every hook Job's) mounts an emptyDir at /tmp."""
    checked = []
    for doc in render("replicas=2", "routing.enabled=true"):
        if doc["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
            template = doc["spec"]["template"]
        elif doc["kind"] == "CronJob":
            template = doc["spec"]["jobTemplate"]["spec"]["template"]
        elif doc["kind"] == "Pod":
            template = doc
        else:
            continue
        spec = template["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec.get("initContainers", []) + spec["containers"]:
            if not container.get("securityContext", {}).get("readOnlyRootFilesystem"):
                continue
            mounts = [m for m in container.get("volumeMounts", []) if m["mountPath"] == "/tmp"]
            where = f"{doc['kind']} {doc['metadata']['name']} container {container['name']}"
            assert len(mounts) == 1, f"{where}: no /tmp mount"
            assert "emptyDir" in volumes[mounts[0]["name"]], f"{where}: /tmp is not an emptyDir"
            assert not mounts[0].get("readOnly"), where
            checked.append(where)
    # The provider, the drain hook, the CRDs' hook (and any other, such as the helm test's pod).
    assert {"Deployment rel", "Job rel-drain", "Job rel-crds"} <= {w.split(" container")[0] for w in checked}


@pytest.mark.shares_lab
def test_no_other_pod_carries_the_providers_selector() -> None:
    """`vkprovider drain` waits for the pods of the Deployment's selector to go: a hook's or the
    helm test's pod carrying it would wait for itself until its deadline."""
    docs = render()
    selector = one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    others = [d for d in docs if d["kind"] in ("Job", "Pod")]
    assert len(others) >= 3, [d["metadata"]["name"] for d in others]  # drain, CRDs, helm test
    for doc in others:
        pod_labels = (doc["spec"]["template"]["metadata"] if doc["kind"] == "Job" else doc["metadata"])["labels"]
        assert not selector.items() <= pod_labels.items(), doc["metadata"]["name"]


#: Kinds of the chart's objects that are not in a namespace.
CLUSTER_SCOPED = {
    "ClusterRole",
    "ClusterRoleBinding",
    "MemberCluster",
    "MutatingWebhookConfiguration",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
}


def cluster_wide_names(namespace: str) -> set[tuple[str, str]]:
    """(kind, name) of what release `vk` in `namespace` names outside its namespace: its
    cluster-scoped objects, those in shared namespaces (kube-node-lease), and the routing
    webhook's configuration the provider registers."""
    args = ["template", "vk", str(CHART), "--namespace", namespace, "--set", "routing.enabled=true",
            "--set", "rbac.secretNamespaces={jobs}"]  # fmt: skip
    docs = [d for d in yaml.safe_load_all(helm(*args).stdout) if d]
    names = set()
    for doc in docs:
        meta = doc["metadata"]
        if doc["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in meta, doc["kind"]
            names.add((doc["kind"], meta["name"]))
        elif meta.get("namespace") != namespace:
            names.add((doc["kind"], f"{meta.get('namespace')}/{meta['name']}"))
    routing = settings_of(docs)["provider"]["federation"]["routing"]["configuration_name"]
    names.add(("MutatingWebhookConfiguration", routing))
    # The bindings name the roles rendered beside them, and the webhook's rule its configuration.
    roles = {(d["kind"], d["metadata"]["name"]) for d in docs if d["kind"] in ("ClusterRole", "Role")}
    for binding in (d for d in docs if d["kind"] in ("ClusterRoleBinding", "RoleBinding")):
        assert (binding["roleRef"]["kind"], binding["roleRef"]["name"]) in roles, binding["metadata"]["name"]
    cluster_role = one(docs, "ClusterRole", f"vk-{namespace}")
    webhook_rules = [
        r for r in cluster_role["rules"] if r.get("resourceNames") and "mutatingwebhookconfigurations" in r["resources"]
    ]
    assert [r["resourceNames"] for r in webhook_rules] == [[routing]]
    return names


@pytest.mark.shares_lab
def test_releases_of_one_name_in_two_namespaces_share_no_cluster_wide_name() -> None:
    a, b = cluster_wide_names("a"), cluster_wide_names("b")
    assert {kind for kind, _ in a} >= {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}, a
    assert not a & b, a & b
    assert ("ClusterRole", "vk-a") in a


@pytest.mark.shares_lab
def test_members_from_values_or_an_existing_secret(tmp_path: Path) -> None:
    existing = {"name": "m2", "existingSecret": {"name": "theirs", "key": "config"}, "weight": 3}
    docs = render(values={"members": [MEMBER, existing]}, tmp=tmp_path)
    secrets = [d["metadata"]["name"] for d in docs if d["kind"] == "Secret"]
    assert secrets == ["rel-member-m1"]  # none made for the existing one
    m2 = one(docs, "MemberCluster", "m2")["spec"]
    assert m2["kubeconfigSecretRef"] == {"namespace": "vk-system", "name": "theirs", "key": "config"}
    assert m2["weight"] == 3


@pytest.mark.shares_lab
def test_service_monitor_on_and_off() -> None:
    assert not [d for d in render() if d["kind"] == "ServiceMonitor"]
    monitor = one(
        render("ports.exposeMetrics=true", "serviceMonitor.enabled=true", "serviceMonitor.labels.release=prom"),
        "ServiceMonitor",
    )
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"


@pytest.mark.shares_lab
def test_the_node_proxy_monitor_names_every_virtual_node_and_grants_only_them(tmp_path: Path) -> None:
    """Per-member nodes are named from the listed members; Prometheus's account may proxy to
    them and to no other node. A real scrape with it: tests/e2e/test_scrape.py."""
    members = [{"name": m, "existingSecret": {"name": f"{m}-kc"}} for m in ("m1", "m2")]
    values = {
        "virtualNodes": "per-member",
        "members": members,
        "serviceMonitor": {"nodeProxy": {"enabled": True, "serviceAccount": {"namespace": "mon", "name": "prom"}}},
    }
    docs = render(values=values, tmp=tmp_path)
    monitor = one(docs, "ServiceMonitor")
    paths = [e["path"] for e in monitor["spec"]["endpoints"]]
    assert paths == [
        f"/api/v1/nodes/vk-pool-{m}/proxy{p}" for m in ("m1", "m2") for p in ("/metrics", "/metrics/resource")
    ]
    assert monitor["spec"]["selector"]["matchLabels"] == {"component": "apiserver", "provider": "kubernetes"}
    (rule,) = one(docs, "ClusterRole", "rel-vk-system-scraper")["rules"]
    assert rule == {
        "apiGroups": [""],
        "resources": ["nodes/proxy"],
        "resourceNames": ["vk-pool-m1", "vk-pool-m2"],
        "verbs": ["get"],
    }
    subjects = one(docs, "ClusterRoleBinding", "rel-vk-system-scraper")["subjects"]
    assert subjects == [{"kind": "ServiceAccount", "namespace": "mon", "name": "prom"}]
    # Without members listed, per-member nodes have no names to scrape: the install fails, saying so.
    failed = helm(
        "template",
        "rel",
        str(CHART),
        "--set",
        "virtualNodes=per-member",
        "--set",
        "serviceMonitor.nodeProxy.enabled=true",
        check=False,
    )
    assert failed.returncode != 0 and "list the members in values" in failed.stderr, failed.stderr


def exposed_metric_names() -> set[str]:
    """Every sample name the federation provider's /metrics can carry (a provider built, not
    run: its registry holds every family, with or without samples)."""
    from prometheus_client import generate_latest

    from federation.config import FederationConfig
    from federation.provider import FederationProvider
    from vkprovider.metrics import Metrics

    registry = Metrics().registry
    FederationProvider(FederationConfig(), node_name="rules").register_metrics(registry)
    return e2e_metrics.parse(generate_latest(registry).decode()).names()


#: promtool unit tests of the chart's alerts (rendered with gpuWatermark=2 and member-2's own
#: cpuWatermark 80; cpuWatermark 16, `for` 10m, noRoomFor 15m and reclaimsPerHour 50 by default),
#: minute by minute: each alert fires when and only when it should, with its labels and its
#: summary as rendered.
ALERT_TESTS = {
    "evaluation_interval": "1m",
    "tests": [
        {
            "interval": "1m",
            "input_series": [
                # member-1 stops answering at minute 11; member-2 always answers.
                {"series": 'vkprovider_member_reachable{member="member-1"}', "values": "1x10 0x20"},
                {"series": 'vkprovider_member_reachable{member="member-2"}', "values": "1x30"},
                # member-1 lends 8 cores in all from minute 6, 1 GPU from minute 6; member-2 64
                # cores, below its own watermark of 80; member-3 100, above the default.
                {"series": 'vkprovider_member_lent{member="member-1",resource="cpu"}', "values": "32x5 8x25"},
                {"series": 'vkprovider_member_lent{member="member-2",resource="cpu"}', "values": "64x30"},
                {"series": 'vkprovider_member_lent{member="member-3",resource="cpu"}', "values": "100x30"},
                {
                    "series": 'vkprovider_member_lent{member="member-1",resource="nvidia.com/gpu"}',
                    "values": "4x5 1x25",
                },
                # A gang whole at the front end that no member can take, from minute 6.
                {"series": 'vkprovider_jobs{state="NoMemberFits"}', "values": "0x5 1x25"},
                # Two gangs timed out from minute 6.
                {"series": 'vkprovider_jobs{state="GangTimeout"}', "values": "0x5 2x25"},
                {"series": 'vkprovider_jobs{state="dispatched"}', "values": "5x30"},
                # member-2 evicts one of ours at minute 11; member-1's reclaims are ours (planner).
                {
                    "series": 'vkprovider_reclaimed_pods_total{member="member-2",band="worker-min",cause="evicted"}',
                    "values": "0x10 1x20",
                },
                {
                    "series": 'vkprovider_reclaimed_pods_total{member="member-1",band="worker-min",cause="planner"}',
                    "values": "0x5 3x25",
                },
                # member-3 takes back 60 of ours at minute 11 (our notices: a storm, not a breach).
                {
                    "series": 'vkprovider_reclaimed_pods_total{member="member-3",band="worker-min",cause="planner"}',
                    "values": "0x10 60x20",
                },
            ],
            "alert_rule_test": [
                # Unreachable for 5 minutes from minute 11: pending at 15, firing at 16.
                {"eval_time": "15m", "alertname": "VkproviderMemberUnreachable", "exp_alerts": []},
                {
                    "eval_time": "16m",
                    "alertname": "VkproviderMemberUnreachable",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning", "member": "member-1"},
                            "exp_annotations": {
                                "summary": "Member member-1 does not answer: it lends nothing and its pods keep "
                                "their last status."
                            },
                        }
                    ],
                },
                # member-2 below its own 80 from the start: firing at 10; member-1 below the
                # default 16 from minute 6, for 10 minutes: firing at 16, not at 15.
                {
                    "eval_time": "15m",
                    "alertname": "VkproviderLentCpuBelowWatermark",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "info", "member": "member-2"},
                            "exp_annotations": {
                                "summary": "Member member-2 lends 64 cores in all (ours and free), "
                                "below its watermark of 80."
                            },
                        }
                    ],
                },
                {
                    "eval_time": "16m",
                    "alertname": "VkproviderLentCpuBelowWatermark",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "info", "member": "member-1"},
                            "exp_annotations": {
                                "summary": "Member member-1 lends 8 cores in all (ours and free), "
                                "below the watermark of 16."
                            },
                        },
                        {
                            "exp_labels": {"severity": "info", "member": "member-2"},
                            "exp_annotations": {
                                "summary": "Member member-2 lends 64 cores in all (ours and free), "
                                "below its watermark of 80."
                            },
                        },
                    ],
                },
                {
                    "eval_time": "16m",
                    "alertname": "VkproviderLentGpuBelowWatermark",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "info", "member": "member-1"},
                            "exp_annotations": {
                                "summary": "Member member-1 lends 1 GPUs in all (ours and free), "
                                "below the watermark of 2."
                            },
                        }
                    ],
                },
                # Whole and without room from minute 6, for 15 minutes: firing at 21, not at 20.
                {"eval_time": "20m", "alertname": "VkproviderGangsWithoutRoom", "exp_alerts": []},
                {
                    "eval_time": "21m",
                    "alertname": "VkproviderGangsWithoutRoom",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning"},
                            "exp_annotations": {
                                "summary": "1 gangs are whole at the front end but no member can take them (reason "
                                "NoMemberFits on their pods)."
                            },
                        }
                    ],
                },
                # 60 reclaims in member-3's hour: above 50 from minute 11; member-1's 3 never.
                {"eval_time": "10m", "alertname": "VkproviderReclaimsAboveRate", "exp_alerts": []},
                {
                    "eval_time": "12m",
                    "alertname": "VkproviderReclaimsAboveRate",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning", "member": "member-3"},
                            "exp_annotations": {
                                "summary": "Member member-3 took back 60 of our pods in the last hour, more than 50."
                            },
                        }
                    ],
                },
                {"eval_time": "6m", "alertname": "VkproviderGangTimedOut", "exp_alerts": []},
                {
                    "eval_time": "7m",
                    "alertname": "VkproviderGangTimedOut",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning"},
                            "exp_annotations": {
                                "summary": "2 gangs waited longer than their timeout for a member that fits them."
                            },
                        }
                    ],
                },
                # The eviction fires at once, the planner's own reclaims never.
                {"eval_time": "10m", "alertname": "VkproviderReclaimWithoutNotice", "exp_alerts": []},
                {
                    "eval_time": "12m",
                    "alertname": "VkproviderReclaimWithoutNotice",
                    "exp_alerts": [
                        {
                            "exp_labels": {"severity": "warning", "member": "member-2", "cause": "evicted"},
                            "exp_annotations": {
                                "summary": "Member member-2 took pods of ours away without our checkpoint notice "
                                "(evicted)."
                            },
                        }
                    ],
                },
            ],
        }
    ],
}


@pytest.mark.shares_lab
def test_alert_rules_pass_promtools_check_and_unit_tests_on_metrics_the_provider_exposes(tmp_path: Path) -> None:
    """The rules Prometheus would load, checked and unit-tested by Prometheus's own promtool
    (built from its pinned module, like helm); every metric they name is one the provider
    exposes."""
    assert not [d for d in render() if d["kind"] == "PrometheusRule"]
    values = (
        "prometheusRule.enabled=true",
        "prometheusRule.gpuWatermark=2",
        "prometheusRule.members.member-2.cpuWatermark=80",
    )
    rule = one(render(*values), "PrometheusRule")
    rules = rule["spec"]["groups"][0]["rules"]
    assert [r["alert"] for r in rules] == [
        "VkproviderMemberUnreachable",
        "VkproviderLentCpuBelowWatermark",
        "VkproviderLentCpuBelowWatermark",  # member-2's own
        "VkproviderLentGpuBelowWatermark",
        "VkproviderGangTimedOut",
        "VkproviderGangsWithoutRoom",
        "VkproviderReclaimsAboveRate",
        "VkproviderReclaimWithoutNotice",
    ]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], **ALERT_TESTS}))
    promtool = str(binaries.ensure_all()["promtool"])
    for argv in (["check", "rules", "rules.yaml"], ["test", "rules", "tests.yaml"]):
        done = subprocess.run([promtool, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, f"promtool {' '.join(argv)}:\n{done.stdout}{done.stderr}"
    exposed = exposed_metric_names()
    for r in rules:
        named = set(re.findall(r"\bvkprovider_[a-z_]+", r["expr"]))
        assert named and named <= exposed, (r["alert"], named - exposed)
    no_gpu = one(render("prometheusRule.enabled=true"), "PrometheusRule")["spec"]["groups"][0]["rules"]
    assert "VkproviderLentGpuBelowWatermark" not in [r["alert"] for r in no_gpu]


@pytest.mark.shares_lab
def test_the_grafana_dashboard_is_a_configmap_for_the_sidecar_that_grafanas_schema_accepts(tmp_path: Path) -> None:
    """Grafana's own dashboard schema (the strict decoding of grafana-foundation-sdk's generated
    types, e2e/tools/grafana) accepts the chart's dashboard, and refuses it with an unknown panel
    field or a mistyped one: the check is strict, not a JSON parse."""
    assert not [d for d in render() if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    docs = render("grafanaDashboard.enabled=true", "grafanaDashboard.annotations.grafana_folder=pooling")
    (config_map,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "pooling"}
    board = json.loads(config_map["data"]["vkprovider.json"])
    assert board["uid"] == "vkprovider-tide" and board["panels"], board.keys()
    check = str(binaries.ensure_all()["dashboardcheck"])
    good = tmp_path / "good.json"
    good.write_text(json.dumps(board))
    typo = json.loads(json.dumps(board))
    typo["panels"][1]["titel"] = "a misspelt field"
    mistyped = json.loads(json.dumps(board))
    mistyped["panels"][1]["gridPos"]["w"] = "wide"
    for name, body in (("typo.json", typo), ("mistyped.json", mistyped)):
        (tmp_path / name).write_text(json.dumps(body))
    done = subprocess.run([check, str(good)], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    for name, field in (("typo.json", "titel"), ("mistyped.json", "gridPos")):
        done = subprocess.run([check, str(tmp_path / name)], capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 1 and field in done.stderr, (name, done.stderr)


@pytest.mark.shares_lab
def test_kueue_quota_names_its_queue_in_the_settings_and_may_touch_only_that_queue() -> None:
    assert "kueue_quota" not in settings_of(render())["provider"]["federation"]
    docs = render("federation.kueueQuota.clusterQueue=lent", "federation.kueueQuota.flavor=vk-pool")
    assert settings_of(docs)["provider"]["federation"]["kueue_quota"] == {"cluster_queue": "lent", "flavor": "vk-pool"}
    rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d.get("rules") or []]
    queues = [r for r in rules if "clusterqueues" in r["resources"]]
    assert queues == [
        {
            "apiGroups": ["kueue.x-k8s.io"],
            "resources": ["clusterqueues"],
            "resourceNames": ["lent"],
            "verbs": ["get", "update"],
        }
    ]
    result = helm("template", "rel", str(CHART), "--set", "federation.kueueQuota.clusterQueue=lent", check=False)
    assert result.returncode != 0 and "federation.kueueQuota.flavor" in result.stderr, result.stderr


@pytest.mark.shares_lab
def test_a_misspelt_value_fails_with_its_name() -> None:
    result = helm("template", "rel", str(CHART), "--set", "replica=3", check=False)
    assert result.returncode != 0
    assert "replica" in result.stderr and "additional" in result.stderr.lower(), result.stderr
    result = helm("template", "rel", str(CHART), "--set", "serviceMonitor.intervall=1m", check=False)
    assert result.returncode != 0 and "intervall" in result.stderr, result.stderr


@pytest.mark.shares_lab
def test_a_misspelt_member_spec_key_fails_with_its_name(tmp_path: Path) -> None:
    for spec, key in (
        ({"capacity": {"reservePrecent": 10}}, "reservePrecent"),
        ({"reclaim": {"noticeSeconds": 2}, "gangAPI": "volcano"}, "gangAPI"),
        ({"weight": 2}, "weight"),  # the member's own field, not the spec's
    ):
        path = tmp_path / f"{key}.yaml"
        path.write_text(yaml.safe_dump({"members": [{**MEMBER, "spec": spec}]}))
        result = helm("template", "rel", str(CHART), "-f", str(path), check=False)
        assert result.returncode != 0 and key in result.stderr, result.stderr
    good = {
        "capacity": {"reservePercent": 10, "cap": {"cpu": "500", "nvidia.com/gpu": 8}},
        "reclaim": {"noticeSeconds": 2},
    }
    docs = render(values={"members": [{**MEMBER, "spec": good}]}, tmp=tmp_path)
    assert one(docs, "MemberCluster", "m1")["spec"]["capacity"] == good["capacity"]


def strict(node: dict[str, Any]) -> dict[str, Any]:
    """A CRD's structural schema as a JSON schema that refuses unknown keys (the apiserver
    prunes them silently)."""
    node = {k: v for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if "properties" in node:
        node["properties"] = {k: strict(v) for k, v in node["properties"].items()}
        node.setdefault("additionalProperties", False)
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = strict(node["additionalProperties"])
    if "items" in node:
        node["items"] = strict(node["items"])
    if "anyOf" in node:
        node["anyOf"] = [strict(n) for n in node["anyOf"]]
    return node


@pytest.mark.shares_lab
def test_the_member_spec_schema_is_the_crds() -> None:
    crd = yaml.safe_load((CHART / "crds" / "memberclusters.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec = {**spec, "properties": dict(spec["properties"])}
    for own in ("kubeconfigSecretRef", "enabled", "weight"):  # rendered from the member's fields
        del spec["properties"][own]
    del spec["required"]
    values = json.loads((CHART / "values.schema.json").read_text())
    ours = dict(values["properties"]["members"]["items"]["properties"]["spec"])
    del ours["description"]
    assert ours == strict(spec)


@pytest.mark.shares_lab
def test_the_charts_crd_is_the_providers() -> None:
    assert yaml.safe_load((CHART / "crds" / "memberclusters.yaml").read_text()) == yaml.safe_load(CRD.read_text())


@pytest.mark.shares_lab
def test_the_drain_hook_runs_before_deletion() -> None:
    job = one(render(), "Job", "rel-drain")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    args = job["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:1] == ["drain"]
    # Within `helm uninstall`'s default 5-minute wait for hooks, with time for the pod to start.
    assert args[args.index("--timeout") + 1] == "240" and job["spec"]["activeDeadlineSeconds"] == 240
    # It runs where the provider runs (it reaches the members from there).
    placed = one(render("nodeSelector.pool=system", "tolerations[0].key=system"), "Job", "rel-drain")
    assert placed["spec"]["template"]["spec"]["nodeSelector"] == {"pool": "system"}
    assert placed["spec"]["template"]["spec"]["tolerations"] == [{"key": "system"}]
    # Longer drains are told how to keep uninstall waiting for them.
    assert "helm uninstall --timeout" in (CHART / "values.yaml").read_text()


# -- installed into the lab --------------------------------------------------------------------


async def _can_i(kubeconfig: Path, namespace: str) -> dict[str, set[str]]:
    """What `kubectl auth can-i --list -n namespace` shows for the kubeconfig's account."""
    async with KubeClient(load_kubeconfig(kubeconfig)) as client:
        return await can_i(client, namespace)


@pytest.mark.asyncio(loop_scope="session")
async def test_the_installed_accounts_rights_are_exactly_the_documented_list(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    """What the chart's account may do, as the apiserver says (SelfSubjectRulesReview), is the
    documented list plus what every account may. That the list is enough for the provider, its
    drain and its helm test is shown by test_chart_pods, which runs them with this account's
    tokens (and finds no 403 in the provider's log)."""
    await install_member_cluster_crd(offline)
    release = f"vk{uuid.uuid4().hex[:5]}"
    namespace = await make_namespace(offline, f"{release}-system")
    node = f"vk-chart-{uuid.uuid4().hex[:5]}"
    installed = helm(
        "install", release, str(CHART), "-n", namespace, "--set", f"nodeName={node}",
        "--kubeconfig", str(lab.kubeconfig("offline")), "--skip-crds", check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    try:
        kubeconfig = tmp_path / "sa.kubeconfig"
        await service_account_kubeconfig(lab, offline, "offline", namespace, release, kubeconfig)
        nobody = tmp_path / "default.kubeconfig"
        await service_account_kubeconfig(lab, offline, "offline", namespace, "default", nobody)
        granted = await _can_i(kubeconfig, namespace)
        everyone = await _can_i(nobody, namespace)
        extra = {k: v - everyone.get(k, set()) for k, v in granted.items()}
        extra = {k: v for k, v in extra.items() if v}
        assert extra == DOCUMENTED, (
            f"granted beyond the list: { {k: v for k, v in extra.items() if DOCUMENTED.get(k) != v} }"
        )
        # Nodes are changed and deleted by name (pooled mode).
        async with KubeClient(load_kubeconfig(kubeconfig)) as account:
            with pytest.raises(ApiError) as refused:
                await account.delete(f"/api/v1/nodes/not-{node}")
            assert refused.value.status == 403
    finally:
        helm("uninstall", release, "-n", namespace, "--no-hooks", "--kubeconfig", str(lab.kubeconfig("offline")))


def _approval(csr: dict[str, Any]) -> dict[str, Any]:
    csr.setdefault("status", {})["conditions"] = [
        {"type": "Approved", "status": "True", "reason": "Test", "message": "approved by the test"}
    ]
    return csr


@pytest.mark.asyncio(loop_scope="session")
async def test_the_account_approves_only_its_own_csrs_and_changes_only_its_own_nodes(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    """RBAC cannot name a per-member node (`<nodeName>-<member>`, members come later) or the CSR
    a provider will submit; the chart's ValidatingAdmissionPolicy holds the provider's account
    to its own: a kubelet-serving CSR it did not submit cannot be approved, a node outside its
    names cannot be changed or deleted. Secrets are read only where rbac.secretNamespaces says,
    and written only in the release's namespace."""
    from cryptography.hazmat.primitives.asymmetric import ec

    from vkprovider.httpapi.certs import CSR_PATH, csr_object, csr_pem

    release = f"vk{uuid.uuid4().hex[:5]}"
    namespace = await make_namespace(offline, f"{release}-system")
    jobs = await make_namespace(offline, f"{release}-jobs")
    node = f"vk-vap-{uuid.uuid4().hex[:5]}"
    installed = helm(
        "install", release, str(CHART), "-n", namespace, "--skip-crds", "--kubeconfig", str(lab.kubeconfig("offline")),
        "--set", f"nodeName={node}", "--set", "virtualNodes=per-member", "--set", f"rbac.secretNamespaces={{{jobs}}}",
        check=False,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    kubeconfig = tmp_path / "sa.kubeconfig"
    await service_account_kubeconfig(lab, offline, "offline", namespace, release, kubeconfig)
    ours, other = f"{node}-m1", f"not-{node}"
    key = ec.generate_private_key(ec.SECP256R1())
    theirs = f"csr-{release}-admin"
    created: list[str] = []
    try:
        for name in (ours, other):
            await offline.create("/api/v1/nodes", {"metadata": {"name": name, "labels": {"test": release}}})
            created.append(name)
        await offline.create(CSR_PATH, csr_object(theirs, csr_pem(key, node, "127.0.0.1")))
        async with KubeClient(load_kubeconfig(kubeconfig)) as account:
            # Refused by the policy (RBAC lets per-member mode patch any node) once it is in force.
            async def refused_elsewhere() -> bool:
                try:
                    await account.patch(f"/api/v1/nodes/{other}", {"metadata": {"labels": {"x": "y"}}})
                except ApiError as exc:
                    assert exc.status == 403, exc
                    assert "only its own virtual nodes" in str(exc), exc
                    return True
                await offline.patch(f"/api/v1/nodes/{other}", {"metadata": {"labels": {"x": None}}})
                return False

            await eventually(refused_elsewhere, timeout=30, what="the admission policy in force")
            with pytest.raises(ApiError, match="only its own virtual nodes"):
                await account.delete(f"/api/v1/nodes/{other}")
            await account.patch(f"/api/v1/nodes/{ours}", {"metadata": {"labels": {"x": "y"}}})
            await account.delete(f"/api/v1/nodes/{ours}")
            created.remove(ours)

            # Someone else's serving CSR: refused; its own: approved.
            with pytest.raises(ApiError, match="approve only the kubelet-serving CSRs it submitted") as caught:
                await account.replace(
                    f"{CSR_PATH}/{theirs}/approval", _approval(await offline.get(f"{CSR_PATH}/{theirs}"))
                )
            assert caught.value.status == 403
            mine = f"csr-{release}-own"
            await account.create(CSR_PATH, csr_object(mine, csr_pem(key, node, "127.0.0.1")))
            approved = await account.replace(
                f"{CSR_PATH}/{mine}/approval", _approval(await account.get(f"{CSR_PATH}/{mine}"))
            )
            assert approved["status"]["conditions"][0]["type"] == "Approved"
            await offline.delete(f"{CSR_PATH}/{mine}")

            # Secrets: read in the listed namespace and the release's, nowhere else; written only
            # in the release's.
            for where, readable in ((jobs, True), (namespace, True), ("default", False)):
                rules = await can_i(account, where)
                assert ("get" in rules.get("secrets", set())) is readable, (where, rules.get("secrets"))
                assert ("patch" in rules.get("secrets", set())) is (where == namespace), (where, rules.get("secrets"))
    finally:
        for name in created:
            await offline.delete(f"/api/v1/nodes/{name}")
        with contextlib.suppress(NotFound):
            await offline.delete(f"{CSR_PATH}/{theirs}")
        helm("uninstall", release, "-n", namespace, "--no-hooks", "--kubeconfig", str(lab.kubeconfig("offline")))
