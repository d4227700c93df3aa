"""The ClusterQueue quota of the virtual node's flavor (federation.queues.quota), pure."""

from __future__ import annotations

from typing import Any

import pytest

from federation.config import KueueQuotaConfig
from federation.queues.quota import with_quota


def _queue(**quotas: Any) -> dict[str, Any]:
    lent = [{"name": name.replace("_", "."), "nominalQuota": value} for name, value in quotas.items()]
    return {
        "resourceGroups": [
            {
                "coveredResources": [r["name"] for r in lent],
                "flavors": [
                    {"name": "on-prem", "resources": [{"name": r["name"], "nominalQuota": 100} for r in lent]},
                    {"name": "lent", "resources": lent},
                ],
            }
        ]
    }


def test_only_the_flavors_covered_resources_follow_the_node() -> None:
    spec = _queue(cpu=10, memory="64Gi")
    node = {"cpu": "1580", "memory": "8Ti", "pods": "4400", "nvidia.com/gpu": "160"}
    groups = with_quota(spec, "lent", node)
    assert groups is not None
    on_prem, lent = groups["resourceGroups"][0]["flavors"]
    assert lent["resources"] == [{"name": "cpu", "nominalQuota": "1580"}, {"name": "memory", "nominalQuota": "8Ti"}]
    assert on_prem == spec["resourceGroups"][0]["flavors"][0]  # another flavor is the owner's
    assert spec["resourceGroups"][0]["flavors"][1]["resources"][0]["nominalQuota"] == 10  # not changed in place


def test_nothing_to_write_when_equal_in_any_spelling_or_the_flavor_is_not_there() -> None:
    assert with_quota(_queue(cpu="1500m", memory="1Gi"), "lent", {"cpu": "1.5", "memory": "1073741824"}) is None
    assert with_quota(_queue(cpu=1), "elsewhere", {"cpu": "2"}) is None
    assert with_quota({}, "lent", {"cpu": "2"}) is None


def test_a_queue_without_a_flavor_is_refused() -> None:
    with pytest.raises(ValueError, match="flavor must name"):
        KueueQuotaConfig(cluster_queue="lent")
    assert not KueueQuotaConfig().enabled and KueueQuotaConfig(cluster_queue="q", flavor="f").enabled
