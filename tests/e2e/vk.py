"""Running vkprovider as a real process against the lab's front-end cluster, for tests that
stop, kill -9 and restart it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from e2e import metrics, ports
from e2e.fixtures import Lab


def free_port() -> int:
    return ports.listen_port()


@dataclass
class VkProcess:
    lab: Lab
    node: str
    workdir: Path
    overrides: dict[str, Any] = field(default_factory=dict)
    port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    #: The log file's name when replicas of one node run side by side (each its own log).
    replica: str = ""

    @property
    def state_file(self) -> Path:
        return self.workdir / f"{self.node}-provider.sqlite"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.node}{'-' + self.replica if self.replica else ''}.log"

    @property
    def tmp(self) -> Path:
        """The process's TMPDIR: what it leaves there after a stop or a kill -9 is left on disk."""
        return self.workdir / f"{self.node}{'-' + self.replica if self.replica else ''}-tmp"

    def config(self) -> Path:
        config: dict[str, Any] = {
            "kube": {"kubeconfig": str(self.lab.kubeconfig("offline"))},
            "node": {"name": self.node},
            "http": {"port": self.port, "health_port": self.health_port, "bind": "127.0.0.1"},
            "log": {"format": "json", "level": "info"},
            "provider": {"memory": {"startup_delay": 0.3, "stop_seconds": 1.0, "state_file": str(self.state_file)}},
        }
        for dotted, value in self.overrides.items():
            cursor = config
            *parents, last = dotted.split(".")
            for part in parents:
                cursor = cursor.setdefault(part, {})
            cursor[last] = value
        path = self.workdir / f"{self.node}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(exist_ok=True)
        config = self.config()
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vkprovider.cli", "run", "--config", str(config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(os.environ, PYTHONUNBUFFERED="1", TMPDIR=str(self.tmp)),
        )
        log.close()
        self.starts += 1

    async def wait_ready(self, timeout: float = 30.0) -> float:
        started = time.monotonic()
        async with aiohttp.ClientSession() as session:
            while time.monotonic() - started < timeout:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    raise AssertionError(f"vkprovider exited with {self.proc.returncode}: {self.tail()}")
                try:
                    async with session.get(f"http://127.0.0.1:{self.health_port}/readyz") as resp:
                        if resp.status == 200:
                            return time.monotonic() - started
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError(f"vkprovider not ready after {timeout}s: {self.tail()}")

    async def scrape(self) -> metrics.Scrape:
        """The provider's /metrics, parsed as Prometheus would."""
        return await metrics.scrape(f"http://127.0.0.1:{self.health_port}/metrics")

    async def metric(self, selector: str) -> float:
        """The sum of the samples `name{label="value",...}` selects; a metric the provider does not
        expose, or a label it does not carry, fails (e2e.metrics.MetricMissing) rather than
        reading as 0."""
        return (await self.scrape()).get(selector)

    async def view(self) -> dict[str, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{self.health_port}/capacity") as resp,
        ):
            return dict(await resp.json())

    def stop(self, timeout: float = 20.0) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def provider_pods(self) -> dict[str, str]:
        """key -> uid of the pods the (persisted) provider holds."""
        with sqlite3.connect(self.state_file) as db:
            rows = db.execute("SELECT key, body FROM pods").fetchall()
        return {key: json.loads(body)["metadata"]["uid"] for key, body in rows}

    def create_counts(self) -> dict[str, int]:
        with sqlite3.connect(self.state_file) as db:
            return dict(db.execute("SELECT uid, COUNT(*) FROM creates GROUP BY uid").fetchall())

    def create_calls(self) -> dict[str, list[tuple[int, str]]]:
        """uid -> every create call the provider received for it: (provider run, outcome), where
        outcome is created, repeated (the backend had it already and said nothing) or refused."""
        calls: dict[str, list[tuple[int, str]]] = {}
        with sqlite3.connect(self.state_file) as db:
            for uid, run, outcome in db.execute("SELECT uid, run, outcome FROM create_calls ORDER BY at"):
                calls.setdefault(uid, []).append((run, outcome))
        return calls

    def ensure_stopped(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
