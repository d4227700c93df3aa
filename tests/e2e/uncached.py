"""A second kube-apiserver for one lab cluster, without a watch cache, and etcd compaction: a
watch expiry (410 Gone) as a real apiserver gives it, on demand.

A cached apiserver keeps a window of events and sends bookmarks, so a client rarely meets a
410, and the window cannot be made small (any non-zero --watch-cache-sizes means only "cache
on"). Without the cache a watch is served by etcd itself: once etcd is compacted past the
revision a client watches from, the apiserver answers that watch with a 410 ERROR event, as
after any long disconnection in production. The second apiserver shares the cluster's etcd
prefix, certificates and flags (an HA control plane's second member) and writes its own audit
log, so a test reads what a client did through it.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

from e2e import ports, procs
from e2e.fixtures import Lab
from vkprovider.kube import KubeClient, load_kubeconfig


@dataclass
class Uncached:
    cluster: str
    port: int
    audit_log: Path

    def kubeconfig(self, source: Path, path: Path) -> Path:
        """A copy of `source` (a kubeconfig of the cluster) that talks to this apiserver."""
        config = yaml.safe_load(source.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        path.write_text(yaml.safe_dump(config))
        return path


def _flag(argv: list[str], name: str) -> str:
    return next(a.partition("=")[2] for a in argv if a.startswith(f"--{name}="))


@contextlib.asynccontextmanager
async def uncached_apiserver(lab: Lab, cluster: str, workdir: Path) -> AsyncIterator[Uncached]:
    """Run a second apiserver of `cluster` with --watch-cache=false until the block ends."""
    original = lab.state.clusters[cluster].processes["kube-apiserver"].argv
    port = ports.listen_port()
    server = Uncached(cluster, port, workdir / "audit.log")
    replaced = {"secure-port": str(port), "audit-log-path": str(server.audit_log)}
    argv = [
        f"--{name}={replaced[name]}" if (name := a[2:].partition("=")[0]) in replaced else a
        for a in original
        if not a.startswith("--watch-cache")
    ]
    argv.append("--watch-cache=false")
    pid = procs.spawn(argv, log_path=workdir / "apiserver.log")
    try:
        probe = server.kubeconfig(lab.kubeconfig(cluster), workdir / "admin.yaml")
        async with KubeClient(load_kubeconfig(probe), user_agent="vkprovider-tests") as client:
            await client.wait_ready(timeout=60)
        yield server
    finally:
        procs.terminate([pid], lab.state.marker, grace=5.0)


async def compact_etcd(lab: Lab) -> int:
    """Compact the lab's etcd (shared by every cluster) up to its current revision, through
    etcd's JSON gateway; the revision. Cached apiservers watch etcd at its head and do not
    notice; a watch served from etcd from an older revision gets a 410."""
    assert lab.state.etcd is not None
    url = _flag(lab.state.etcd.argv, "advertise-client-urls").split(",")[0]
    async with aiohttp.ClientSession() as session:
        # Two writes of a key outside every cluster's prefix first: on a quiet lab the newest
        # revision may be the one a watch already stands at, which a compaction up to it spares.
        key = base64.b64encode(b"/vkprovider-tests/compaction").decode()
        for value in (b"1", b"2"):
            put = {"key": key, "value": base64.b64encode(value).decode()}
            async with session.post(f"{url}/v3/kv/put", json=put) as resp:
                resp.raise_for_status()
                revision = int((await resp.json())["header"]["revision"])
        async with session.post(f"{url}/v3/kv/compaction", json={"revision": str(revision), "physical": True}) as resp:
            resp.raise_for_status()
    return revision
