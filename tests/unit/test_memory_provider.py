"""The in-memory provider on a fake clock: lifecycle by time, idempotent create, steering
annotations, logs with their options, and persistence across instances."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from vkprovider.memory import MemoryProvider, MemorySettings
from vkprovider.objects import Pod
from vkprovider.provider import LogOptions, ProviderError, ProviderNotFound


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _pod(name: str = "p", uid: str = "u1", **annotations: str) -> Pod:
    return {
        "metadata": {"name": name, "namespace": "n", "uid": uid, "annotations": dict(annotations)},
        "spec": {"containers": [{"name": "c", "image": "i"}]},
    }


def _provider(clock: Clock, **kwargs: Any) -> MemoryProvider:
    return MemoryProvider(MemorySettings(startup_delay=1.0, stop_seconds=2.0, log_interval=1.0, **kwargs), clock=clock)


async def test_lifecycle_follows_the_clock() -> None:
    clock = Clock()
    provider = _provider(clock)
    await provider.create_pod(_pod(**{"vkprovider.io/memory-run-seconds": "5", "vkprovider.io/memory-exit-code": "3"}))
    assert (await provider.get_pod_status("n", "p"))["phase"] == "Pending"  # type: ignore[index]
    clock.now += 1.5
    status = await provider.get_pod_status("n", "p")
    assert status is not None and status["phase"] == "Running" and status["podIP"].startswith("10.")
    clock.now += 5
    status = await provider.get_pod_status("n", "p")
    assert status is not None and status["phase"] == "Failed"
    assert status["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3


async def test_create_is_idempotent_and_refuses_a_second_incarnation_while_terminating() -> None:
    clock = Clock()
    provider = _provider(clock)
    await provider.create_pod(_pod())
    await provider.create_pod(_pod())
    assert len(await provider.list_pods()) == 1
    pod = _pod()
    pod["metadata"]["deletionGracePeriodSeconds"] = 30
    await provider.delete_pod(pod)
    with pytest.raises(ProviderError, match="still terminating"):
        await provider.create_pod(_pod(uid="u2"))
    clock.now += 2.1  # stop_seconds caps the grace
    assert await provider.get_pod("n", "p") is None
    with pytest.raises(ProviderNotFound):
        await provider.delete_pod(pod)


async def test_fail_create_and_actions() -> None:
    clock = Clock()
    provider = _provider(clock)
    with pytest.raises(ProviderError, match="full"):
        await provider.create_pod(_pod(**{"vkprovider.io/memory-fail-create": "full"}))
    await provider.create_pod(_pod())
    clock.now += 2
    await provider.update_pod(_pod(**{"vkprovider.io/memory-action": "evict"}))
    status = await provider.get_pod_status("n", "p")
    assert status is not None and status["phase"] == "Failed" and status["reason"] == "Evicted"
    await provider.update_pod(_pod(**{"vkprovider.io/memory-action": "lose"}))
    assert await provider.get_pod("n", "p") is None


async def _collect(provider: MemoryProvider, options: LogOptions) -> list[str]:
    return [chunk.decode() async for chunk in provider.container_logs("n", "p", "c", options)]


async def test_log_options() -> None:
    clock = Clock()
    provider = _provider(clock)
    await provider.create_pod(_pod())
    clock.now += 1 + 9.5  # running for 9.5 s: lines 0..9
    lines = await _collect(provider, LogOptions())
    assert len(lines) == 10 and lines[0] == "n/p/c line 0\n"
    assert await _collect(provider, LogOptions(tail_lines=2)) == ["n/p/c line 8\n", "n/p/c line 9\n"]
    assert "".join(await _collect(provider, LogOptions(limit_bytes=20))) == "n/p/c line 0\nn/p/c l"
    assert len(await _collect(provider, LogOptions(since_seconds=3))) == 3
    stamped = await _collect(provider, LogOptions(tail_lines=1, timestamps=True))
    assert stamped[0].startswith("2027-01-15T") and stamped[0].endswith(" n/p/c line 9\n")
    with pytest.raises(ProviderNotFound):
        await _collect(provider, LogOptions(previous=True))
    with pytest.raises(ProviderNotFound):
        [c async for c in provider.container_logs("n", "p", "nope", LogOptions())]


async def test_state_file_keeps_pods_across_instances(tmp_path: Path) -> None:
    clock = Clock()
    first = _provider(clock, state_file=tmp_path / "s.sqlite")
    first.resume()
    await first.create_pod(_pod())
    first.close()
    second = _provider(clock, state_file=tmp_path / "s.sqlite")
    second.resume()
    assert [p["metadata"]["uid"] for p in await second.list_pods()] == ["u1"]
    await second.create_pod(_pod())  # the same UID again: not a second create
    assert second.create_count("u1") == 1
    second.close()
