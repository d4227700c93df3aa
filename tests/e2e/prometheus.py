"""A real Prometheus (built from its pinned module, like promtool) scraping the lab, for the
chart's ServiceMonitors.

The Prometheus Operator is not run: it turns a ServiceMonitor into scrape configuration and
runs Prometheus as a StatefulSet, which needs a kubelet that runs containers. `scrape_configs`
writes what the operator generates for a ServiceMonitor endpoint (its keep rules on the selected
Service's labels and port name, the namespace, service, job and endpoint target labels, then
the endpoint's own relabelings), for the fields the chart uses; any other field fails, so a
chart change the translation does not know cannot pass unnoticed. Files a ServiceMonitor names
inside the Prometheus pod (its account's token and CA) are mapped to files the test writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from e2e import binaries

#: The ServiceMonitor endpoint fields the translation knows.
ENDPOINT_FIELDS = frozenset(
    {"port", "scheme", "path", "interval", "honorLabels", "bearerTokenFile", "tlsConfig", "relabelings"}
)
RELABEL_FIELDS = {
    "action": "action",
    "sourceLabels": "source_labels",
    "targetLabel": "target_label",
    "replacement": "replacement",
    "regex": "regex",
    "separator": "separator",
}


def _label(name: str) -> str:
    """A Kubernetes label name as Prometheus's service discovery spells it in meta labels."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def scrape_configs(
    monitor: dict[str, Any], *, api_server: str, sd_tls: dict[str, str], files: dict[str, Path]
) -> list[dict[str, Any]]:
    """Prometheus scrape configs for `monitor` (a ServiceMonitor), discovering endpoints through
    `api_server` with `sd_tls` (the operator's Prometheus uses its in-cluster account there);
    `files` maps the paths the ServiceMonitor names to local files."""
    meta, spec = monitor["metadata"], monitor["spec"]
    namespaces = spec.get("namespaceSelector", {}).get("matchNames") or [meta["namespace"]]
    selector = spec["selector"]
    assert set(selector) == {"matchLabels"}, f"selector fields the translation does not know: {selector}"
    configs = []
    for i, endpoint in enumerate(spec["endpoints"]):
        unknown = set(endpoint) - ENDPOINT_FIELDS
        assert not unknown, f"ServiceMonitor endpoint fields the translation does not know: {unknown}"
        relabel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
        for key, value in selector["matchLabels"].items():
            relabel.append(
                {
                    "action": "keep",
                    "source_labels": [
                        f"__meta_kubernetes_service_label_{_label(key)}",
                        f"__meta_kubernetes_service_labelpresent_{_label(key)}",
                    ],
                    "regex": f"({re.escape(value)});true",
                }
            )
        relabel += [
            {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": endpoint["port"]},
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
        ]
        for rule in endpoint.get("relabelings", []):
            unknown = set(rule) - set(RELABEL_FIELDS)
            assert not unknown, f"relabeling fields the translation does not know: {unknown}"
            relabel.append({RELABEL_FIELDS[k]: v for k, v in rule.items()})
        config: dict[str, Any] = {
            "job_name": f"serviceMonitor/{meta['namespace']}/{meta['name']}/{i}",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "kubernetes_sd_configs": [
                {
                    "role": "endpoints",
                    "api_server": api_server,
                    "tls_config": sd_tls,
                    "namespaces": {"names": namespaces},
                }
            ],
            "scheme": endpoint.get("scheme", "http"),
            "metrics_path": endpoint.get("path", "/metrics"),
            "relabel_configs": relabel,
        }
        if "interval" in endpoint:
            config["scrape_interval"] = endpoint["interval"]
            config["scrape_timeout"] = endpoint["interval"]
        if "bearerTokenFile" in endpoint:
            config["authorization"] = {"type": "Bearer", "credentials_file": str(files[endpoint["bearerTokenFile"]])}
        tls = endpoint.get("tlsConfig", {})
        unknown = set(tls) - {"caFile", "serverName"}
        assert not unknown, f"tlsConfig fields the translation does not know: {unknown}"
        if tls:
            config["tls_config"] = {
                **({"ca_file": str(files[tls["caFile"]])} if "caFile" in tls else {}),
                **({"server_name": tls["serverName"]} if "serverName" in tls else {}),
            }
        configs.append(config)
    return configs


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Prometheus:
    """One Prometheus process with the given scrape configs; its HTTP API on loopback."""

    def __init__(self, workdir: Path, scrape: list[dict[str, Any]]) -> None:
        self.dir = workdir / "prometheus"
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": scrape}))
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = self.dir / "prometheus.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[Prometheus]:
        binary = str(binaries.ensure_all()["prometheus"])
        with self.log.open("wb") as log:
            self._proc = subprocess.Popen(
                [
                    binary,
                    f"--config.file={self.dir / 'prometheus.yml'}",
                    f"--storage.tsdb.path={self.dir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            try:
                yield self
            finally:
                self._proc.terminate()
                try:
                    self._proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait(timeout=10)

    def _get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as answer:
            return json.loads(answer.read())

    async def api(self, path: str, **params: str) -> Any:
        """The data of a Prometheus HTTP API answer (asserting its status is success)."""
        body = await asyncio.to_thread(self._get, path, **params)
        assert body["status"] == "success", body
        return body["data"]

    async def ready(self) -> bool:
        assert self._proc is not None and self._proc.poll() is None, self.log.read_text()[-2000:]
        try:
            await asyncio.to_thread(urllib.request.urlopen, f"{self.url}/-/ready", None, 5)
        except OSError:
            return False
        return True

    async def targets(self) -> list[dict[str, Any]]:
        data = await self.api("/api/v1/targets", state="active")
        targets: list[dict[str, Any]] = data["activeTargets"]
        return targets

    async def query(self, promql: str) -> list[dict[str, Any]]:
        data = await self.api("/api/v1/query", query=promql, time=str(time.time()))
        result: list[dict[str, Any]] = data["result"]
        return result
