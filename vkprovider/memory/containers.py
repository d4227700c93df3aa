"""What the memory provider's containers do when asked: built-in commands for exec
(vkprovider.minishell), their simulated log (one line per `log_interval` while running) for
logs and attach, and synthetic usage for stats (half of what each container requests)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from vkprovider.memory.timeline import Record, Timeline, parse_time, rfc3339
from vkprovider.minishell import Shell
from vkprovider.provider import ExecStreams, LogOptions, ProviderError, ProviderNotFound


class MemoryContainers:
    def __init__(
        self,
        *,
        records: dict[str, Record],
        live: Callable[[str], Record | None],
        timeline: Timeline,
        clock: Callable[[], float],
    ) -> None:
        self._records = records  # the provider's own, read live
        self._live = live  # a record unless it is gone by now
        self._timeline = timeline
        self._clock = clock

    def _container(self, key: str, container: str) -> Record:
        record = self._live(key)
        if record is None:
            raise ProviderNotFound(f"pod {key} not found")
        if container not in {c.get("name") for c in record.pod["spec"].get("containers", [])}:
            raise ProviderNotFound(f"container {container} is not valid for pod {key.partition('/')[2]}")
        return record

    async def exec(self, namespace: str, name: str, container: str, command: list[str], streams: ExecStreams) -> int:
        """A built-in command (vkprovider.minishell) in a running container of the pod."""
        key = f"{namespace}/{name}"
        record = self._container(key, container)
        if self._timeline.status(record, self._clock()).get("phase") != "Running":
            raise ProviderError(f"container {container} of pod {key} is not running")
        return await Shell(streams).run(command)

    async def attach(self, namespace: str, name: str, container: str, streams: ExecStreams) -> None:
        """The container's output is its simulated log: new lines as they are written, until the
        container ends or the client closes its input."""
        key = f"{namespace}/{name}"
        record = self._container(key, container)
        if self._timeline.status(record, self._clock()).get("phase") != "Running":
            raise ProviderError(f"container {container} of pod {key} is not running")
        out = streams.stdout or streams.stderr
        lines = self.logs(namespace, name, container, LogOptions(follow=True, tail_lines=0))

        async def relay() -> None:
            async for line in lines:
                if out is not None:
                    await out.write(line.replace(b"\n", b"\r\n") if streams.tty else line)

        async def until_input_ends() -> None:
            assert streams.stdin is not None
            while await streams.stdin.read():
                pass  # a simulated process reads nothing

        waits = [asyncio.create_task(relay(), name=f"attach-relay {key}")]
        if streams.stdin is not None:
            waits.append(asyncio.create_task(until_input_ends(), name=f"attach-stdin {key}"))
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if (error := task.exception()) is not None:
                    raise error
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)

    async def logs(self, namespace: str, name: str, container: str, options: LogOptions) -> AsyncIterator[bytes]:
        key = f"{namespace}/{name}"
        record = self._container(key, container)
        if options.previous:
            raise ProviderNotFound(f"previous terminated container {container!r} in pod {name!r} not found")
        uid = record.uid
        interval = self._timeline.settings.log_interval
        start = self._timeline.started_at(record)
        since = None
        if options.since_seconds is not None:
            since = self._clock() - options.since_seconds
        elif options.since_time:
            since = parse_time(options.since_time)

        def end_time() -> float | None:
            current = self._records.get(key)
            if current is None or current.uid != uid:
                return self._clock()
            ended = self._timeline.exit(current)
            gone = self._timeline.gone_at(current)
            candidates = [t for t in (ended[0] if ended else None, gone) if t is not None]
            return min(candidates) if candidates else None

        def line(index: int) -> bytes:
            at = start + index * interval
            text = f"{namespace}/{name}/{container} line {index}\n"
            return (f"{rfc3339(at, nanos=True)} {text}" if options.timestamps else text).encode()

        def available(limit: float) -> int:
            return 0 if limit < start else int((limit - start) // interval) + 1

        now = self._clock()
        end = end_time()
        upto = available(min(now, end) if end is not None else now)
        first = 0 if since is None else max(0, available(since - 1e-9))
        if options.tail_lines is not None:
            first = max(first, upto - options.tail_lines)
        sent = 0
        index = first
        while True:
            while index < upto:
                chunk = line(index)
                if options.limit_bytes is not None:
                    if sent >= options.limit_bytes:
                        return
                    chunk = chunk[: options.limit_bytes - sent]
                sent += len(chunk)
                yield chunk
                index += 1
            if not options.follow:
                return
            end = end_time()
            if end is not None and self._clock() >= end:
                return
            next_at = start + index * interval
            await asyncio.sleep(max(0.0, next_at - self._clock()) + 0.001)
            now = self._clock()
            end = end_time()
            upto = available(min(now, end) if end is not None else now)

    async def stats(self, node_name: str) -> dict[str, Any]:
        now = rfc3339(self._clock())
        pods = []
        total_cpu = total_mem = 0
        for key in list(self._records):
            record = self._live(key)
            if record is None or self._timeline.status(record, self._clock()).get("phase") != "Running":
                continue
            containers = []
            for c in record.pod["spec"].get("containers", []):
                requests = c.get("resources", {}).get("requests", {})
                cpu = int(_cpu_nanos(requests.get("cpu", "10m")) * 0.5)
                mem = int(_bytes(requests.get("memory", "16Mi")) * 0.5)
                total_cpu += cpu
                total_mem += mem
                containers.append(
                    {
                        "name": c.get("name"),
                        "startTime": rfc3339(self._timeline.started_at(record)),
                        "cpu": {"time": now, "usageNanoCores": cpu, "usageCoreNanoSeconds": cpu},
                        "memory": {"time": now, "workingSetBytes": mem, "usageBytes": mem},
                    }
                )
            meta = record.pod["metadata"]
            pods.append(
                {
                    "podRef": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
                    "startTime": rfc3339(self._timeline.started_at(record)),
                    "containers": containers,
                    "cpu": {"time": now, "usageNanoCores": sum(c["cpu"]["usageNanoCores"] for c in containers)},
                    "memory": {"time": now, "workingSetBytes": sum(c["memory"]["workingSetBytes"] for c in containers)},
                }
            )
        return {
            "node": {
                "nodeName": node_name,
                "startTime": now,
                "cpu": {"time": now, "usageNanoCores": total_cpu, "usageCoreNanoSeconds": total_cpu},
                "memory": {"time": now, "workingSetBytes": total_mem, "usageBytes": total_mem},
            },
            "pods": pods,
        }


_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def _bytes(quantity: str) -> float:
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if quantity.endswith(suffix):
            return float(quantity[: -len(suffix)]) * _SUFFIX[suffix]
    return float(quantity)


def _cpu_nanos(quantity: str) -> float:
    if quantity.endswith("m"):
        return float(quantity[:-1]) * 1e6
    return float(quantity) * 1e9
