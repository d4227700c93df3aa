"""The apiserver client's pure parts: paths, error mapping, kubeconfig parsing."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from vkprovider.kube import client, errors, paths
from vkprovider.kube.access import KubeconfigError, parse_kubeconfig


def test_paths() -> None:
    assert paths.resource_path("v1", "pods", namespace="ns", name="p", subresource="status") == (
        "/api/v1/namespaces/ns/pods/p/status"
    )
    assert paths.resource_path("scheduling.k8s.io/v1beta1", "podgroups", namespace="a") == (
        "/apis/scheduling.k8s.io/v1beta1/namespaces/a/podgroups"
    )
    assert paths.resource_path("v1", "nodes", name="a b") == "/api/v1/nodes/a%20b"


@pytest.mark.parametrize(
    ("status", "reason", "cls"),
    [
        (404, "NotFound", errors.NotFound),
        (409, "AlreadyExists", errors.AlreadyExists),
        (409, "Conflict", errors.Conflict),
        (410, "Expired", errors.Gone),
        (422, "Invalid", errors.Invalid),
        (403, "Forbidden", errors.Forbidden),
        (401, "Unauthorized", errors.Unauthorized),
        (503, "ServiceUnavailable", errors.ServerError),
    ],
)
def test_error_classes(status: int, reason: str, cls: type[errors.ApiError]) -> None:
    err = errors.error_for(status, {"reason": reason, "message": "m"}, "")
    assert type(err) is cls and err.status == status and err.message == "m"


def test_too_many_requests_carries_retry_after() -> None:
    err = errors.error_for(429, None, "slow down", "7")
    assert isinstance(err, errors.TooManyRequests) and err.retry_after == 7.0


def _kubeconfig(user: dict) -> dict:  # type: ignore[type-arg]
    return {
        "clusters": [{"name": "c", "cluster": {"server": "https://h:6443/", "certificate-authority-data": "Q0E="}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }


def test_kubeconfig_with_embedded_client_certificate() -> None:
    user = {
        "client-certificate-data": base64.b64encode(b"CERT").decode(),
        "client-key-data": base64.b64encode(b"KEY").decode(),
    }
    access = parse_kubeconfig(_kubeconfig(user), base=Path("/"))
    assert access.server == "https://h:6443"
    assert access.ca_data == b"CA" and access.cert_data == b"CERT" and access.key_data == b"KEY"


def test_kubeconfig_token_and_missing_context() -> None:
    access = parse_kubeconfig(_kubeconfig({"token": "t"}), base=Path("/"))
    assert access.bearer_token() == "t"
    with pytest.raises(KubeconfigError, match="no context named"):
        parse_kubeconfig(_kubeconfig({"token": "t"}), base=Path("/"), context="nope")


def test_kubeconfig_exec_plugins_are_used_and_malformed_ones_refused_clearly() -> None:
    user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "aws", "args": ["eks", "get-token"]}}
    access = parse_kubeconfig(_kubeconfig(user), base=Path("/"))
    assert access.stale() and access.bearer_token() is None  # the plugin runs at the first request
    with pytest.raises(KubeconfigError, match=r"exec plugin in the kubeconfig: .*apiVersion"):
        parse_kubeconfig(_kubeconfig({"exec": {"command": "aws"}}), base=Path("/"))
    with pytest.raises(KubeconfigError, match="auth-provider"):
        parse_kubeconfig(_kubeconfig({"auth-provider": {"name": "oidc"}}), base=Path("/"))


def test_decoded_objects_leave_managed_fields_out() -> None:
    # Nothing reads them, and in a cache of pods they are the largest part of each.
    managed = [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}]
    pod = {"metadata": {"name": "p", "managedFields": managed}, "status": {"phase": "Running"}}
    decoded = client._decode(json.dumps({"kind": "PodList", "items": [pod, pod]}))
    assert decoded is not None and all("managedFields" not in i["metadata"] for i in decoded["items"])
    single = client._decode(json.dumps(pod))
    assert single == {"metadata": {"name": "p"}, "status": {"phase": "Running"}}
    event = client._watch_event(json.dumps({"type": "MODIFIED", "object": pod}).encode())
    assert event["object"]["metadata"] == {"name": "p"}


def test_an_expiry_after_events_lists_again_at_once_and_one_right_after_a_list_backs_off() -> None:
    from vkprovider.kube.relist import Expiries

    expiries = Expiries(base=0.2, cap=1.0)
    expiries.listed("1")
    expiries.delivered("2")
    assert expiries.expired() == 0.0  # a long watch's normal end
    waits = []
    for _ in range(5):  # each list's watch expires before delivering anything
        expiries.listed("3")
        waits.append(expiries.expired())
    assert waits == [0.2, 0.4, 0.8, 1.0, 1.0]
    expiries.listed("4")
    expiries.delivered("5")  # the watch works again: the next expiry is normal
    assert expiries.expired() == 0.0
    assert expiries.relists == 7
