"""The offline stacks' objects (e2e.stacks), from small manifests written here in the shape
kubebuilder gives them (the real ones are read from the Go module cache by the lab's tests)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from e2e import stacks, volcano

MANIFESTS = """
---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mjob.kb.io
  admissionReviewVersions: [v1]
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}}
  rules: [{apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}]
  sideEffects: None
- name: mpod.kb.io
  admissionReviewVersions: [v1]
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: validating-webhook-configuration}
webhooks:
- name: vpod.kb.io
  admissionReviewVersions: [v1]
  clientConfig: {service: {name: webhook-service, namespace: system, path: /validate--v1-pod}}
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
  sideEffects: None
"""


@pytest.fixture
def source(tmp_path: Path) -> Path:
    (tmp_path / "config/components/webhook").mkdir(parents=True)
    (tmp_path / "config/components/webhook/manifests.yaml").write_text(MANIFESTS)
    crds = tmp_path / "config/components/crd/bases"
    crds.mkdir(parents=True)
    for name in ("workloads.kueue.x-k8s.io", "resourceflavors.kueue.x-k8s.io"):
        (crds / f"{name}.yaml").write_text(yaml.safe_dump({"metadata": {"name": name}, "spec": {"group": "kueue"}}))
    return tmp_path


def test_with_names_known_stacks_in_start_order_and_refuses_others() -> None:
    assert stacks.parse("kueue, jobset") == ("jobset", "kueue")
    assert stacks.parse("") == ()
    with pytest.raises(stacks.StackError, match=r"unknown stack.*volcanoes.*known: jobset, kueue"):
        stacks.parse("jobset,volcanoes")


def test_jobset_webhooks_go_through_its_service_with_the_labs_ca_and_only_its_pods(source: Path) -> None:
    stack = stacks.STACKS["jobset"]
    mutating, validating = stacks.webhook_configurations(stack, source, port=9443, ca_bundle=b"CA")
    assert mutating["metadata"]["name"] == "jobset-mutating-webhook-configuration"
    assert validating["metadata"]["name"] == "jobset-validating-webhook-configuration"
    job, pod = mutating["webhooks"]
    assert job["clientConfig"] == {
        "service": {
            "namespace": "jobset-system",
            "name": "jobset-webhook-service",
            "path": "/mutate-batch-v1-job",
            "port": 9443,
        },
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    assert "objectSelector" not in job
    selector = {"matchExpressions": [{"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
    assert pod["objectSelector"] == selector and validating["webhooks"][0]["objectSelector"] == selector


def test_kueue_registers_only_enabled_paths_and_leaves_its_ca_to_its_rotator(source: Path) -> None:
    (mutating,) = stacks.webhook_configurations(stacks.STACKS["kueue"], source, port=9444, ca_bundle=None)
    # Pod webhooks (an integration not enabled) would put every pod of the front end behind Kueue.
    assert [h["name"] for h in mutating["webhooks"]] == ["mjob.kb.io"]
    assert "caBundle" not in mutating["webhooks"][0]["clientConfig"]


def test_kueue_crds_convert_through_its_webhook_as_its_kustomize_patches_say(source: Path) -> None:
    by_name = {c["metadata"]["name"]: c for c in stacks.crds(stacks.STACKS["kueue"], source, port=9444)}
    assert "conversion" not in by_name["resourceflavors.kueue.x-k8s.io"]["spec"]
    webhook = by_name["workloads.kueue.x-k8s.io"]["spec"]["conversion"]
    assert webhook["strategy"] == "Webhook"
    assert webhook["webhook"]["clientConfig"]["service"] == {
        "namespace": "kueue-system",
        "name": "kueue-webhook-service",
        "path": "/convert",
        "port": 9444,
    }


def test_volcanos_webhook_configurations_have_the_names_its_manager_waits_for_and_no_pod_hook() -> None:
    configs = volcano.webhook_configurations(8443, b"CA")
    names = [c["metadata"]["name"] for c in configs]
    assert names == [
        "volcano-admission-service-jobs-mutate",
        "volcano-admission-service-jobs-validate",
        "volcano-admission-service-podgroups-mutate",
        "volcano-admission-service-queues-mutate",
        "volcano-admission-service-queues-validate",
    ]
    resources = {r for c in configs for h in c["webhooks"] for rule in h["rules"] for r in rule["resources"]}
    assert resources == {"jobs", "podgroups", "queues"}  # not pods: every pod of the front end would wait on it
    hook = configs[0]["webhooks"][0]
    assert hook["clientConfig"]["service"] == {
        "namespace": "volcano-system",
        "name": "volcano-admission-service",
        "path": "/jobs/mutate",
        "port": 8443,
    }
    assert (
        configs[0]["kind"] == "MutatingWebhookConfiguration" and configs[1]["kind"] == "ValidatingWebhookConfiguration"
    )
