"""What the benchmarks share: a lab to run on, a vkprovider process to measure, its counters,
and how busy each process was (so a figure says which process was the limit)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import aiohttp
import psutil
import yaml

from e2e import lab as lab_mod
from e2e import metrics, ports
from vkprovider.kube import KubeClient


def free_port() -> int:
    return ports.listen_port()


async def on_lab(
    state: Path | None, spec: lab_mod.LabSpec, run: Callable[[Path, Path], Awaitable[dict[str, Any]]]
) -> dict[str, Any]:
    """`run(lab_state_dir, workdir)` on the lab in `state`, or on a fresh lab started (and
    stopped) for it. SIGINT or SIGTERM cancels the run, so the provider and the lab stop too."""
    loop, task = asyncio.get_running_loop(), asyncio.current_task()
    assert task is not None
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, task.cancel)
    with tempfile.TemporaryDirectory(prefix="vkprovider-bench-") as tmp:
        workdir = Path(tmp)
        if state:
            return await run(state, workdir)
        lab = await lab_mod.up(workdir / "lab", spec)
        try:
            return await run(lab.root, workdir)
        finally:
            lab_mod.teardown(lab)


#: The provider under tracemalloc when BENCH_MEMTRACE names a file (bench.memtrace), under a
#: stall recorder when BENCH_STALLS does (bench.stalls).
MODULE = (
    "bench.memtrace"
    if os.environ.get("BENCH_MEMTRACE")
    else "bench.stalls"
    if os.environ.get("BENCH_STALLS")
    else "vkprovider.cli"
)


def weigh_cpu(pid: int, nice: int) -> None:
    """Set the CPU weight of `pid`'s session (its autogroup, which the kernel schedules as one):
    on a saturated machine a session gets a share by weight, as a container gets one by its CPU
    request, so a negative `nice` stands for cores a real deployment reserves for a process."""
    Path(f"/proc/{pid}/autogroup").write_text(str(nice))


class Provider:
    """A `vkprovider run` process with `config` (its HTTP ports are filled in), ready when
    `/readyz` answers 200 and `ready(session, health_port)` (if given) is true."""

    def __init__(
        self,
        config: dict[str, Any],
        workdir: Path,
        *,
        ready: Callable[[aiohttp.ClientSession, int], Awaitable[bool]] | None = None,
    ) -> None:
        self.health_port = free_port()
        self.config = {
            **config,
            "http": {
                "port": free_port(),
                "health_port": self.health_port,
                "bind": "127.0.0.1",
                "csr": False,
                **config.get("http", {}),
            },
        }
        self.workdir = workdir
        self._ready = ready
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def __aenter__(self) -> Provider:
        path = self.workdir / "vk.yaml"
        path.write_text(yaml.safe_dump(self.config))
        with open(self.workdir / "vk.log", "wb") as log:
            # Its own session, as every lab process has (e2e.procs): with the kernel's autogroup
            # scheduling a session shares one CPU share, and in the bench's session the provider
            # competed with the load generator while each apiserver had a share to itself.
            self.proc = subprocess.Popen(
                [sys.executable, "-m", MODULE, "run", "--config", str(path)],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        async with aiohttp.ClientSession() as session:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"vkprovider exited ({self.proc.returncode}); see {self.workdir / 'vk.log'}")
                try:
                    async with session.get(f"http://127.0.0.1:{self.health_port}/readyz") as resp:
                        if resp.status == 200 and (self._ready is None or await self._ready(session, self.health_port)):
                            return self
                except (aiohttp.ClientError, ValueError):
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError("vkprovider not ready after 60 s")

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(30)

    async def scrape(self) -> metrics.Scrape:
        """The provider's /metrics, parsed (e2e.metrics: a metric it no longer exposes fails)."""
        return await metrics.scrape(f"http://127.0.0.1:{self.health_port}/metrics")

    async def histograms(self) -> dict[str, dict[float, float]]:
        """Every histogram's cumulative bucket counts, `{"name{labels}": {le: count}}` (labels
        other than `le`, sorted)."""
        return (await self.scrape()).histograms()

    async def counters(self) -> dict[str, float]:
        """Front-end API calls by verb (`api:<VERB>`), pod status writes (`status_writes`) and pod
        syncs of any result (`syncs`)."""
        scrape = await self.scrape()
        out = {f"api:{verb}": n for verb, n in scrape.by_label("vkprovider_api_calls_total", "verb").items()}
        out["status_writes"] = scrape.value("vkprovider_pod_status_writes_total")
        out["syncs"] = scrape.value("vkprovider_pod_sync_seconds_count")  # every result
        return out


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float | None:
    """The upper bound of the bucket holding quantile `q` of what a histogram observed between
    two scrapes (cumulative counts by `le`); None when it observed nothing."""
    counts = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    if not counts or counts[-1][1] <= 0:
        return None
    for le, count in counts:
        if count >= q * counts[-1][1]:
            return le
    return counts[-1][0]


class Profile:
    """py-spy sampling `pid` while the block runs, as collapsed stacks in `path` (no-op when
    `path` is None). Only samples holding the GIL count: the provider's own CPU, not its waits on
    the network. py-spy is not a project dependency: install it to use this."""

    def __init__(self, pid: int, path: Path | None) -> None:
        self.pid, self.path = pid, path
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Profile:
        if self.path is not None:
            beside = Path(sys.executable).with_name("py-spy")  # installed in the venv
            spy = str(beside) if beside.exists() else "py-spy"
            argv = [spy, "record", "-p", str(self.pid), "-r", "200", "--format", "raw", "--nonblocking", "--gil"]
            self.proc = subprocess.Popen([*argv, "-o", str(self.path)], stdout=subprocess.DEVNULL)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGINT)
            self.proc.wait(30)


def per_pod(before: dict[str, float], after: dict[str, float], pods: int) -> dict[str, float]:
    return {k: round((v - before.get(k, 0.0)) / pods, 2) for k, v in sorted(after.items()) if v != before.get(k, 0.0)}


class CpuMeter:
    """How busy each named process was between `start` and `stop`: cores used (1.0 = one full
    core). On a 2-core machine, a sum near 2 means the machine, not one process, was the limit.
    Beside the total, the machine's idle cores and its steal (cores the hypervisor gave to
    others while this machine wanted them), which no process's figure shows."""

    def __init__(self, pids: dict[str, int]) -> None:
        self._procs = {name: psutil.Process(pid) for name, pid in pids.items() if pid}
        self._before: dict[str, float] = {}
        self._machine = psutil.cpu_times()
        self._started = 0.0

    def _times(self) -> dict[str, float]:
        out = {}
        for name, proc in self._procs.items():
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            out[name] = times.user + times.system
        return out

    def start(self) -> None:
        self._before, self._machine, self._started = self._times(), psutil.cpu_times(), time.monotonic()

    def stop(self) -> dict[str, float]:
        wall = time.monotonic() - self._started
        now = self._times()
        cores = {name: round((now[name] - self._before[name]) / wall, 2) for name in now if name in self._before}
        cores["total"] = round(sum(cores.values()), 2)
        machine = psutil.cpu_times()
        for field in ("idle", "steal"):
            spent = getattr(machine, field, 0.0) - getattr(self._machine, field, 0.0)
            cores[f"machine {field}"] = round(spent / wall, 2)
        return cores


def lab_pids(state: Path, clusters: list[str]) -> dict[str, int]:
    """The PIDs of etcd and of each named cluster's control-plane processes."""
    lab = lab_mod.load_running(state)
    pids = {"etcd": lab.etcd.pid if lab.etcd and lab.etcd.pid else 0}
    for cluster in clusters:
        for kind, proc in lab.clusters[cluster].processes.items():
            if proc.pid:
                pids[f"{cluster}/{kind}"] = proc.pid
    return pids


class NamespaceWatch:
    """A watch of one namespace's pods (those `selector` selects) for the length of a block,
    each object handed to `observed` as it arrives (at what time, the subclass records)."""

    def __init__(self, client: KubeClient, namespace: str, *, selector: str = "") -> None:
        self.client, self.namespace = client, namespace
        self.params = {"labelSelector": selector} if selector else None
        self.task: asyncio.Task[None] | None = None

    def observed(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    async def _run(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        rv = (await self.client.list(path, params=self.params))["metadata"]["resourceVersion"]
        while True:  # the apiserver may end a watch early: go on from the last version seen
            async for event in self.client.watch(path, resource_version=rv, params=self.params):
                obj = event["object"]
                rv = obj["metadata"].get("resourceVersion", rv)
                if event["type"] in ("ADDED", "MODIFIED"):
                    self.observed(obj)

    async def __aenter__(self) -> Self:
        self.task = asyncio.create_task(self._run(), name=f"bench-watch/{self.namespace}")
        await asyncio.sleep(0.3)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
