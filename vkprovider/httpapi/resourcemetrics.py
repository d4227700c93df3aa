"""The kubelet's `/metrics/resource` text, rendered from a `stats/v1alpha1` Summary: what
metrics-server scrapes (and Prometheus, through the apiserver's node proxy).

As the kubelet writes it: families in name order, each with its HELP (and stability) and TYPE;
container series labelled `container`, `namespace`, `pod` in that order, pod series `namespace`,
`pod`; every sample stamped with the time it was measured, in milliseconds. metrics-server
reads the counters' cumulative core-seconds and takes the rate between two scrapes, so a
sample's time must be when it was measured, not when it was served.
"""

from __future__ import annotations

from typing import Any

from vkprovider.times import epoch

_CPU = "[STABLE] Cumulative cpu time consumed by the {} in core-seconds"
_MEMORY = "[STABLE] Current working set of the {} in bytes"
#: (name, type, help) of each family, in the order the kubelet writes them.
_FAMILIES = (
    ("container_cpu_usage_seconds_total", "counter", _CPU.format("container")),
    ("container_memory_working_set_bytes", "gauge", _MEMORY.format("container")),
    ("container_start_time_seconds", "gauge", "[STABLE] Start time of the container since unix epoch in seconds"),
    ("node_cpu_usage_seconds_total", "counter", _CPU.format("node")),
    ("node_memory_working_set_bytes", "gauge", _MEMORY.format("node")),
    ("pod_cpu_usage_seconds_total", "counter", _CPU.format("pod")),
    ("pod_memory_working_set_bytes", "gauge", _MEMORY.format("pod")),
    ("resource_scrape_error", "gauge", "[STABLE] 1 if there was an error while getting container metrics, 0 otherwise"),
)


def _stamp(ts: str | None) -> str:
    seconds = epoch(ts)
    return "" if seconds is None else f" {int(seconds * 1000)}"


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) and not value.is_integer() else str(int(value))


def _cpu(stats: dict[str, Any]) -> str | None:
    cpu = stats.get("cpu") or {}
    if "usageCoreNanoSeconds" not in cpu:
        return None
    return f"{_number(cpu['usageCoreNanoSeconds'] / 1e9)}{_stamp(cpu.get('time'))}"


def _memory(stats: dict[str, Any]) -> str | None:
    memory = stats.get("memory") or {}
    if "workingSetBytes" not in memory:
        return None
    return f"{_number(memory['workingSetBytes'])}{_stamp(memory.get('time'))}"


def _samples(summary: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {name: [] for name, _, _ in _FAMILIES}

    def add(family: str, labels: str, value: str | None) -> None:
        if value is not None:
            out[family].append(f"{family}{labels} {value}")

    for pod in summary.get("pods") or []:
        ref = pod.get("podRef") or {}
        pod_labels = f'namespace="{ref.get("namespace")}",pod="{ref.get("name")}"'
        for container in pod.get("containers") or []:
            labels = f'{{container="{container.get("name")}",{pod_labels}}}'
            add("container_cpu_usage_seconds_total", labels, _cpu(container))
            add("container_memory_working_set_bytes", labels, _memory(container))
            started = epoch(container.get("startTime"))
            if started is not None:
                cpu_time = (container.get("cpu") or {}).get("time")
                add("container_start_time_seconds", labels, f"{_number(started)}{_stamp(cpu_time)}")
        add("pod_cpu_usage_seconds_total", f"{{{pod_labels}}}", _cpu(pod))
        add("pod_memory_working_set_bytes", f"{{{pod_labels}}}", _memory(pod))
    node = summary.get("node") or {}
    add("node_cpu_usage_seconds_total", "", _cpu(node))
    add("node_memory_working_set_bytes", "", _memory(node))
    add("resource_scrape_error", "", "0")
    return out


def resource_metrics(summary: dict[str, Any]) -> str:
    """The Prometheus text of /metrics/resource from a Summary."""
    samples = _samples(summary)
    lines: list[str] = []
    for name, kind, text in _FAMILIES:
        if samples[name]:
            lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}", *samples[name]]
    return "\n".join(lines) + "\n"
