"""Our pods' usage as the kubelet reports it (federation.usage.summary, pure) and the kubelet's
/metrics/resource text (vkprovider.httpapi.resourcemetrics), read back with Prometheus's own
parser and with the rate metrics-server would compute between two scrapes."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from federation.usage.reader import MetricsReader
from federation.usage.summary import ContainerSample, CpuCounters, PodSample, pod_sample, seconds_of, summary
from vkprovider.httpapi.resourcemetrics import resource_metrics
from vkprovider.times import epoch

T0 = epoch("2026-12-05T10:00:00Z") or 0.0


def _metrics(at: str, cpu: str, memory: str, window: str = "10.5s") -> dict[str, Any]:
    return {
        "metadata": {"name": "m-pod", "namespace": "m-ns"},
        "timestamp": at,
        "window": window,
        "containers": [{"name": "main", "usage": {"cpu": cpu, "memory": memory}}],
    }


MEMBER_POD = {
    "metadata": {"name": "m-pod", "namespace": "m-ns", "uid": "member-uid-1", "labels": {}},
    "status": {
        "startTime": "2026-12-05T09:59:00Z",
        "containerStatuses": [{"name": "main", "state": {"running": {"startedAt": "2026-12-05T09:59:30Z"}}}],
    },
}


def _rate(first: dict[str, Any], second: dict[str, Any]) -> float:
    """Cores between two samples' cumulative CPU, as metrics-server computes it."""
    spent = float(second["usageCoreNanoSeconds"] - first["usageCoreNanoSeconds"]) / 1e9
    return spent / ((epoch(second["time"]) or 0.0) - (epoch(first["time"]) or 0.0))


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("10s", 10.0), ("10.027s", 10.027), ("1m0s", 60.0), ("1h2m3.5s", 3723.5), ("250ms", 0.25), ("", 0.0), (None, 0.0)],
)
def test_go_durations(text: str | None, seconds: float) -> None:
    assert seconds_of(text) == pytest.approx(seconds)


def test_a_sample_names_the_front_end_pod_and_reads_the_quantities() -> None:
    sample = pod_sample("team/job-0", MEMBER_POD, _metrics("2026-12-05T10:00:00Z", "250123456n", "64Mi"), uid="fe-uid")
    assert sample is not None
    assert (sample.namespace, sample.name, sample.uid, sample.member_uid) == ("team", "job-0", "fe-uid", "member-uid-1")
    assert sample.at == T0 and sample.window == 10.5
    (container,) = sample.containers
    assert container.nanocores == 250_123_456 and container.working_set == 64 * 2**20
    assert container.started == epoch("2026-12-05T09:59:30Z")
    assert pod_sample("team/job-0", MEMBER_POD, {"containers": []}, uid="x") is None


def test_the_rate_between_two_scrapes_is_the_members_rate() -> None:
    counters = CpuCounters()
    samples = [
        ("2026-12-05T10:00:00Z", "250m"),
        ("2026-12-05T10:00:10Z", "250m"),
        ("2026-12-05T10:00:25Z", "1500m"),
        ("2026-12-05T10:00:25Z", "1500m"),  # the member's same sample, read again
        ("2026-12-05T10:00:30Z", "10m"),
    ]
    summaries = []
    for at, rate in samples:
        sample = pod_sample("team/job-0", MEMBER_POD, _metrics(at, rate, "1Mi"), uid="fe-uid")
        assert sample is not None
        summaries.append(summary("vk", [sample], counters, node_started=T0 - 3600))
    cpu = [s["pods"][0]["containers"][0]["cpu"] for s in summaries]
    # As if it had run at its first rate since the container started (30 s before).
    assert cpu[0]["usageCoreNanoSeconds"] == 250_000_000 * 30
    assert _rate(cpu[0], cpu[1]) == pytest.approx(0.25)
    assert _rate(cpu[1], cpu[2]) == pytest.approx(1.5)
    assert cpu[3] == cpu[2]
    assert _rate(cpu[3], cpu[4]) == pytest.approx(0.01)
    nodes = [s["node"]["cpu"] for s in summaries]
    assert _rate(nodes[1], nodes[2]) == pytest.approx(1.5)


def test_the_node_counter_never_goes_back_when_a_pod_leaves() -> None:
    counters = CpuCounters()

    def sample(name: str, at: float, nanocores: int) -> PodSample:
        return PodSample(
            namespace="ns",
            name=name,
            uid=f"fe-{name}",
            member_uid=f"m-{name}",
            started=T0,
            at=at,
            window=10.0,
            containers=(ContainerSample(name="c", nanocores=nanocores, working_set=1 << 20, started=T0),),
        )

    first = summary("vk", [sample("a", T0 + 100, 10**9), sample("b", T0 + 100, 10**9)], counters, node_started=T0)
    second = summary("vk", [sample("a", T0 + 110, 10**9)], counters, node_started=T0)
    assert first["node"]["memory"]["workingSetBytes"] == 2 << 20
    assert second["node"]["cpu"]["usageCoreNanoSeconds"] > first["node"]["cpu"]["usageCoreNanoSeconds"]
    assert _rate(first["node"]["cpu"], second["node"]["cpu"]) == pytest.approx(1.0)
    assert len(counters) == 1  # b's counter is forgotten
    # A new member pod for the same front-end pod (a new uid) starts a counter of its own.
    third = summary("vk", [sample("b", T0 + 120, 10**9)], counters, node_started=T0)
    assert third["pods"][0]["cpu"]["usageCoreNanoSeconds"] == 120 * 10**9


def test_resource_metrics_as_the_kubelet_writes_them() -> None:
    sample = pod_sample("team/job-0", MEMBER_POD, _metrics("2026-12-05T10:00:00Z", "250m", "64Mi"), uid="fe-uid")
    assert sample is not None
    text = resource_metrics(summary("vk", [sample], CpuCounters(), node_started=T0 - 3600))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    # prometheus_client names counters without _total; the text keeps the kubelet's names.
    assert list(families) == [
        "container_cpu_usage_seconds",
        "container_memory_working_set_bytes",
        "container_start_time_seconds",
        "node_cpu_usage_seconds",
        "node_memory_working_set_bytes",
        "pod_cpu_usage_seconds",
        "pod_memory_working_set_bytes",
        "resource_scrape_error",
    ]
    (cpu,) = families["container_cpu_usage_seconds"].samples
    assert cpu.name == "container_cpu_usage_seconds_total"
    assert cpu.labels == {"container": "main", "namespace": "team", "pod": "job-0"}
    assert cpu.value == pytest.approx(0.25 * 30) and cpu.timestamp == T0
    (memory,) = families["pod_memory_working_set_bytes"].samples
    assert memory.labels == {"namespace": "team", "pod": "job-0"} and memory.value == 64 * 2**20
    (started,) = families["container_start_time_seconds"].samples
    assert started.value == epoch("2026-12-05T09:59:30Z")
    # The kubelet's label order, as metrics-server's parser expects it.
    assert 'container_memory_working_set_bytes{container="main",namespace="team",pod="job-0"} 67108864 ' in text
    assert families["resource_scrape_error"].samples[0].value == 0


def test_an_empty_node_reports_no_usage() -> None:
    text = resource_metrics(summary("vk", [], CpuCounters(), node_started=T0))
    assert "node_cpu_usage_seconds_total 0 " in text and "container_" not in text


class _Member:
    """A member's Metrics API reduced to what the reader asks of it, with a clock each read
    advances by its own length (a fake: the reader's cache is pure timing logic; the real API is
    read in tests/e2e/test_top.py)."""

    def __init__(self, now: list[float], read_takes: float) -> None:
        self.now, self.read_takes, self.reads = now, read_takes, 0

    async def get(self, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
        self.reads += 1
        self.now[0] += self.read_takes
        return {"items": [_metrics("2026-12-05T10:00:00Z", "1m", "1Mi")]}


@pytest.mark.parametrize("late", [-0.2, -0.05, 0.0, 0.05])
async def test_a_scraper_on_the_intervals_period_gets_a_fresh_read_each_time(late: float) -> None:
    """metrics-server at 10 s against the default 10 s interval: each scrape, a little early or
    late, reads the member anew; one stamped when its read ended made every other one reuse it."""
    now = [0.0]
    member = _Member(now, read_takes=0.3)
    reader = MetricsReader(interval=10.0, selector=lambda: "x", clock=lambda: now[0])
    for scrape in range(6):
        now[0] = scrape * 10.0 + (late if scrape else 0.0)
        await reader.samples("m", member, set())  # type: ignore[arg-type]
    assert member.reads == 6


async def test_scrapes_more_often_than_the_interval_share_one_read() -> None:
    now = [0.0]
    member = _Member(now, read_takes=0.3)
    reader = MetricsReader(interval=10.0, selector=lambda: "x", clock=lambda: now[0])
    for scrape in range(20):  # every 1.5 s for 30 s: reads at 0, 9, 18 and 27 (fresh for 0.9 of 10 s)
        now[0] = scrape * 1.5
        samples = await reader.samples("m", member, set())  # type: ignore[arg-type]
        assert ("m-ns", "m-pod") in samples
    assert member.reads == 4
