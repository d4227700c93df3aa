"""e2e.metrics, the tests' and benchmarks' reader of /metrics: what it reads from a real
prometheus_client exposition, and that a metric gone or renamed fails instead of reading as 0."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from e2e import metrics
from federation.config import FederationConfig
from federation.provider import FederationProvider
from vkprovider.metrics import Metrics


def _exposition() -> str:
    registry = CollectorRegistry()
    Counter("vkprovider_orphans_deleted", "", ["member", "why"], registry=registry).labels("m-1", "ended").inc(3)
    Counter("vkprovider_never_counted", "", ["member"], registry=registry)
    Gauge("vkprovider_member_reachable", "", ["member"], registry=registry).labels('a "quoted" name').set(1)
    waits = Histogram("vkprovider_wait_seconds", "", ["lane"], buckets=(0.1, 1.0), registry=registry)
    waits.labels("plain").observe(0.5)
    waits.labels("urgent").observe(0.05)
    return generate_latest(registry).decode()


def test_a_selector_reads_the_sum_of_what_it_selects() -> None:
    scrape = metrics.parse(_exposition())
    assert scrape.get('vkprovider_orphans_deleted_total{member="m-1",why="ended"}') == 3
    assert scrape.get('vkprovider_orphans_deleted_total{why="ended"}') == 3
    assert scrape.get('vkprovider_orphans_deleted_total{member="m-2"}') == 0  # no such child yet
    assert scrape.get('vkprovider_member_reachable{member="a \\"quoted\\" name"}') == 1
    assert scrape.get("vkprovider_wait_seconds_count") == 2
    assert scrape.by_label("vkprovider_wait_seconds_count", "lane") == {"plain": 1, "urgent": 1}
    assert scrape.histograms("vkprovider_wait_seconds")['vkprovider_wait_seconds{lane="plain"}'] == {
        0.1: 0,
        1.0: 1,
        float("inf"): 1,
    }


def test_a_declared_family_without_children_reads_as_zero() -> None:
    assert metrics.parse(_exposition()).get('vkprovider_never_counted_total{member="m-1"}') == 0


@pytest.mark.parametrize(
    "selector",
    [
        "vkprovider_orphans_deleted",  # the family's name without the counter's _total: no sample has it
        "vkprovider_orphan_deleted_total",  # misspelt
        "vkprovider_gone_total",
        'vkprovider_orphans_deleted_total{membr="m-1"}',  # a label the metric does not carry
    ],
)
def test_a_metric_gone_renamed_or_mislabelled_fails(selector: str) -> None:
    with pytest.raises(metrics.MetricMissing):
        metrics.parse(_exposition()).get(selector)


def test_a_malformed_selector_is_refused() -> None:
    with pytest.raises(ValueError, match="not a metric selector"):
        metrics.parse_selector('vkprovider_x{member="m-1"')


def test_every_metric_the_tests_and_benches_read_is_one_the_provider_exposes() -> None:
    """Every metric name written in the end-to-end tests and the benchmarks, against the
    federation provider's registry (a provider built, not run): a rename in the product fails
    here at once, before any lab runs (and the lab tests fail too, by e2e.metrics)."""
    built = Metrics()
    built.track_api_calls(dict)  # registered by the runtime with its client's counts
    registry = built.registry
    FederationProvider(FederationConfig(), node_name="reader").register_metrics(registry)

    async def inside_a_loop() -> str:  # the task gauge counts the running loop's tasks
        return generate_latest(registry).decode()

    exposed = metrics.parse(asyncio.run(inside_a_loop())).names()
    root = Path(__file__).resolve().parents[2]
    read: dict[str, str] = {}
    for path in [*(root / "tests" / "e2e").glob("*.py"), *(root / "bench").glob("*.py")]:
        for name in re.findall(r"""["'](vkprovider_[a-z_]+)["{]""", path.read_text()):
            read.setdefault(name, path.name)
    assert len(read) >= 20, read  # the scan finds what the tests read
    # A histogram is read by its family's name too (Scrape.histograms' keys).
    unknown = {n: f for n, f in read.items() if n not in exposed and f"{n}_bucket" not in exposed}
    assert unknown == {}
