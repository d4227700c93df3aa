"""The pure parts of onboarding: tenant names, quotas, the admission policy's inputs, the plan's
comparison and the token's rotation rule (the objects themselves are tested against real
apiservers in tests/e2e/test_onboard.py)."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from federation.tenancy import policy as tenancy
from federation.tenancy.onboard import OnboardError, Step, _write, contains, table, token_is_current
from federation.tenancy.policy import TenancyError
from vkprovider.kube import AlreadyExists


def test_tenant_names_cannot_be_prefixes_of_each_other() -> None:
    tenancy.check_name("team7")
    for bad in ("a-b", "A", "7up", "", "x" * 21):
        with pytest.raises(TenancyError):
            tenancy.check_name(bad)


def test_quota_is_parsed_and_becomes_request_limits() -> None:
    quota = tenancy.parse_quota("cpu=8, memory=32Gi,nvidia.com/gpu=4")
    assert quota == {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "4"}
    assert tenancy.quota_hard(quota) == {
        "requests.cpu": "8",
        "requests.memory": "32Gi",
        "requests.nvidia.com/gpu": "4",
    }
    assert tenancy.parse_quota(None) == {}
    for bad in ("cpu", "cpu=", "cpu=lots"):
        with pytest.raises(TenancyError, match="cpu"):
            tenancy.parse_quota(bad)


def test_namespaces_may_be_labelled_only_as_strict_as_the_member_allows_or_stricter() -> None:
    assert tenancy.allowed_enforce_levels("baseline") == ["baseline", "restricted"]
    assert tenancy.allowed_enforce_levels("privileged") == ["privileged", "baseline", "restricted"]
    assert tenancy.allowed_enforce_levels("restricted") == ["restricted"]


def test_the_policy_applies_to_the_tenants_account_only_and_pins_the_quota() -> None:
    policy = tenancy.admission_policy("t1", "baseline", {"cpu": "2"}, tenancy.Fence())
    (condition,) = policy["spec"]["matchConditions"]
    assert "system:serviceaccount:vkprovider-tenant-t1:provider" in condition["expression"]
    rules = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert "'t1-'" in rules and "quantity('2')" in rules and "'vkprovider-worker-max'" in rules
    # Without a quota the tenant may create none.
    validations = tenancy.admission_policy("t1", "baseline", {}, tenancy.Fence())["spec"]["validations"]
    (quota,) = [v for v in validations if "quota" in v["message"]]
    assert quota["expression"].endswith("(false)")


def test_the_plan_ignores_what_the_server_defaulted() -> None:
    desired = {"spec": {"rules": [{"verbs": ["get"]}]}, "labels": {"a": "1"}}
    current = {"spec": {"rules": [{"verbs": ["get"], "extra": 1}], "defaulted": True}, "labels": {"a": "1", "b": "2"}}
    assert contains(current, desired)
    assert not contains({"spec": {"rules": [{"verbs": ["list"]}]}, "labels": {"a": "1"}}, desired)
    assert not contains({"spec": {"rules": []}, "labels": {"a": "1"}}, desired)


def _token(claims: dict[str, object]) -> str:
    body = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    return f"header.{body}.signature"


def _kubeconfig(token: str, server: str = "https://m:6443") -> str:
    return json.dumps(
        {"clusters": [{"cluster": {"server": server}}], "users": [{"user": {"token": token}}]}
    )  # JSON is YAML


def test_the_token_is_replaced_only_late_in_its_life_or_when_what_it_is_bound_to_changed() -> None:
    claims = {"exp": 1000.0, "kubernetes.io": {"secret": {"uid": "u1"}}}
    config = _kubeconfig(_token(claims))
    assert token_is_current(config, server="https://m:6443", binding_uid="u1", ttl=900, now=600) == ""
    assert token_is_current(config, server="https://m:6443", binding_uid="u1", ttl=900, now=800) == "expires soon"
    assert token_is_current(config, server="https://m:6443", binding_uid="u2", ttl=900, now=0) == "binding changed"
    assert token_is_current(config, server="https://other", binding_uid="u1", ttl=900, now=0) == "server changed"
    assert token_is_current("::", server="https://m:6443", binding_uid="u1", ttl=900, now=0) == "unreadable"


def test_the_table_has_one_row_per_object() -> None:
    steps = [
        Step("member", {"kind": "Namespace", "metadata": {"name": "vkprovider-tenant-t1"}}),
        Step("front end", {"kind": "Secret", "metadata": {"name": "s", "namespace": "vk"}}, action="rotate", why="x"),
    ]
    lines = table(steps).splitlines()
    assert lines[0].split() == ["CLUSTER", "KIND", "NAMESPACE", "NAME", "ACTION"]
    assert lines[1].split() == ["member", "Namespace", "-", "vkprovider-tenant-t1", "create"]
    assert lines[2].endswith("rotate (x)")


class _RacedMember:
    """A member where another tenant's onboarding made the PriorityClass between our plan and
    our write (a window of milliseconds: tests/e2e/test_onboard.py onboards two tenants at
    once and met it once, on a dev lab, as a second onboard that still had a mark to add)."""

    def __init__(self, value: int) -> None:
        self.existing = {"metadata": {"name": "pc", "labels": {"vkprovider.io/uses-b": "true"}}, "value": value}
        self.patches: list[dict[str, Any]] = []

    async def create(self, path: str, body: dict[str, Any]) -> None:
        raise AlreadyExists(409, "AlreadyExists", "exists")

    async def get(self, path: str) -> dict[str, Any]:
        return self.existing

    async def patch(self, path: str, body: dict[str, Any]) -> None:
        self.patches.append(body)


def _class_step() -> Step:
    labels = {"vkprovider.io/uses-a": "true"}
    return Step("member", {"kind": "PriorityClass", "metadata": {"name": "pc", "labels": labels}, "value": -10})


async def test_a_priority_class_made_meanwhile_by_another_tenant_gets_our_mark() -> None:
    member = _RacedMember(value=-10)
    await _write(member, _class_step())  # type: ignore[arg-type]
    assert member.patches == [{"metadata": {"labels": {"vkprovider.io/uses-a": "true"}}}]


async def test_a_priority_class_made_meanwhile_with_another_value_is_refused() -> None:
    member = _RacedMember(value=5)
    with pytest.raises(OnboardError, match="made meanwhile with value 5, -10 needed"):
        await _write(member, _class_step())  # type: ignore[arg-type]
    assert member.patches == []
