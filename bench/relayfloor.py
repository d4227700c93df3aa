"""The lean relay floor: the least code that relays a pod from a front end to a member, written
without any of the provider's code, so the provider's CPU per pod can be read against what any
Python relay making the same calls must pay on this machine (issue 39).

What it does, and nothing more: watch the front end's pods bound to one node (all namespaces,
fieldSelector spec.nodeName=NODE); create each in the member, same name and namespace name (the
namespace made once, the first time one of its pods comes); watch the member's pods it created
(by a label naming the node); when one is Running, write the front-end pod's status once (a merge
patch of phase, conditions, container statuses and pod IP). aiohttp, orjson, one keep-alive
connection pool per cluster (`--pool`), TLS client certificates from the kubeconfigs. No
placement, capacity, translation, retries, logging or metrics; an error ends the process.

The event loop is `--loop asyncio|uvloop`, so it can run with the one the provider uses. It
prints `ready` once both watches have listed; its CPU is read from outside (bench.dispatch, phase
relayfloor: started and warmed up before the window, run alone, never beside the provider).

Run: `python -m bench.relayfloor --front KUBECONFIG --member KUBECONFIG --node NODE [--loop uvloop]`.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib
import os
import ssl
import sys
import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

LABEL = "bench.vkprovider.io/relay"  # on the member pods: the node they were relayed from
KEPT = ("name", "image", "resources")  # of a container
CARRIED = ("phase", "conditions", "containerStatuses", "podIP")  # of the member pod's status
JSON = {"Content-Type": "application/json"}
MERGE = {"Content-Type": "application/merge-patch+json"}
REQUEST = aiohttp.ClientTimeout(total=60, sock_connect=5)
WATCH = aiohttp.ClientTimeout(total=None, sock_connect=5, sock_read=None)


class Failed(Exception):
    """An answer the relay does not handle: it ends."""


def _pem(entry: dict[str, Any], key: str, base: Path) -> bytes:
    """A PEM from a kubeconfig entry: inline (`key-data`, base64) or a file (`key`)."""
    if entry.get(f"{key}-data"):
        return base64.b64decode(str(entry[f"{key}-data"]))
    return Path(base, str(entry[key])).read_bytes()


def _tls(kubeconfig: Path) -> tuple[str, ssl.SSLContext]:
    """The server and an SSL context (its CA, our client certificate) of a kubeconfig's current
    context."""
    doc = yaml.safe_load(kubeconfig.read_text())
    base = kubeconfig.parent
    context = next(c["context"] for c in doc["contexts"] if c["name"] == doc["current-context"])
    cluster = next(c["cluster"] for c in doc["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in doc["users"] if u["name"] == context["user"])
    ctx = ssl.create_default_context(cadata=_pem(cluster, "certificate-authority", base).decode())
    with tempfile.TemporaryDirectory(prefix="relayfloor-") as tmp:  # ssl reads a chain from files only
        cert, key = Path(tmp, "tls.crt"), Path(tmp, "tls.key")
        for path, entry in ((cert, "client-certificate"), (key, "client-key")):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(_pem(user, entry, base))
        ctx.load_cert_chain(cert, key)
    return str(cluster["server"]).rstrip("/"), ctx


class Cluster:
    """One apiserver: a session over one keep-alive pool."""

    def __init__(self, kubeconfig: Path, pool: int) -> None:
        server, ctx = _tls(kubeconfig)
        connector = aiohttp.TCPConnector(ssl=ctx, limit=pool, keepalive_timeout=60)
        self.session = aiohttp.ClientSession(server, connector=connector, headers={"Accept": "application/json"})

    async def call(self, method: str, path: str, body: Any = None, *, headers: dict[str, str] = JSON) -> int:
        """One request; its status (2xx or 409 and 404, which the caller judges)."""
        data = None if body is None else orjson.dumps(body)
        async with self.session.request(method, path, data=data, headers=headers, timeout=REQUEST) as resp:
            await resp.read()
            if resp.status >= 300 and resp.status not in (404, 409):
                raise Failed(f"{method} {path}: {resp.status}")
            return resp.status

    async def watch(
        self, path: str, selector: dict[str, str], handle: Callable[[dict[str, Any]], None], listed: asyncio.Event
    ) -> None:
        """List, then watch from the list's version, forever: `handle` gets every pod seen (not
        the deleted ones), `listed` is set once the first list is handled; a watch that expires
        or ends starts again from a list."""
        while True:
            async with self.session.get(path, params=selector, timeout=REQUEST) as resp:  # one page: all
                if resp.status != 200:
                    raise Failed(f"list {path}: {resp.status}")
                pods = orjson.loads(await resp.read())
            for obj in pods["items"]:
                handle(obj)
            listed.set()
            params = {"watch": "1", "resourceVersion": pods["metadata"]["resourceVersion"], **selector}
            async with self.session.get(path, params={**params, "allowWatchBookmarks": "true"}, timeout=WATCH) as resp:
                if resp.status != 200:
                    raise Failed(f"watch {path}: {resp.status}")
                rest, expired = b"", False
                async for chunk in resp.content.iter_any():
                    *lines, rest = (rest + chunk).split(b"\n")
                    for line in lines:
                        event = orjson.loads(line)
                        if event["type"] in ("ADDED", "MODIFIED"):
                            handle(event["object"])
                        elif event["type"] == "ERROR":
                            expired = True  # 410 Gone and the like: list again
                    if expired:
                        break


async def relay(front_config: Path, member_config: Path, node: str, pool: int) -> None:
    front, member = Cluster(front_config, pool), Cluster(member_config, pool)
    tasks: set[asyncio.Task[None]] = set()
    sent: set[tuple[str, str]] = set()
    reported: set[tuple[str, str]] = set()
    namespaces: dict[str, asyncio.Task[None]] = {}

    def spawn(coro: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro)
        tasks.add(task)
        task.add_done_callback(finished)
        return task

    def finished(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            print(f"relayfloor: {task.exception()!r}", file=sys.stderr, flush=True)
            os._exit(1)  # the bench sees the exit, not a wait that never ends

    async def namespace(name: str) -> None:
        await member.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})

    async def create(ns: str, body: dict[str, Any]) -> None:
        await namespaces[ns]
        await member.call("POST", f"/api/v1/namespaces/{ns}/pods", body)

    async def report(ns: str, name: str, status: dict[str, Any]) -> None:
        patch = {"status": {k: status[k] for k in CARRIED if k in status}}
        await front.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", patch, headers=MERGE)

    def on_front(pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        if key in sent or "deletionTimestamp" in meta:
            return
        sent.add(key)
        if key[0] not in namespaces:
            namespaces[key[0]] = spawn(namespace(key[0]))
        body = {
            "metadata": {"name": key[1], "labels": {LABEL: node}},
            "spec": {
                "terminationGracePeriodSeconds": 0,
                "containers": [{k: c[k] for k in KEPT if k in c} for c in pod["spec"]["containers"]],
            },
        }
        spawn(create(key[0], body))

    def on_member(pod: dict[str, Any]) -> None:
        status = pod.get("status") or {}
        meta = pod["metadata"]
        key = (meta["namespace"], meta["name"])
        if status.get("phase") == "Running" and key not in reported:
            reported.add(key)
            spawn(report(*key, status))

    listed = [asyncio.Event(), asyncio.Event()]
    watches = [
        spawn(front.watch("/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"}, on_front, listed[0])),
        spawn(member.watch("/api/v1/pods", {"labelSelector": f"{LABEL}={node}"}, on_member, listed[1])),
    ]
    await asyncio.gather(*(e.wait() for e in listed))
    print("ready", flush=True)
    await asyncio.gather(*watches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--front", type=Path, required=True, help="the front end's kubeconfig")
    parser.add_argument("--member", type=Path, required=True, help="the member's kubeconfig")
    parser.add_argument("--node", required=True, help="the front-end node whose pods it relays")
    parser.add_argument("--pool", type=int, default=32, help="connections per apiserver")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    args = parser.parse_args()
    factory = None
    if args.loop == "uvloop":
        try:
            factory = importlib.import_module("uvloop").new_event_loop
        except ImportError:
            sys.exit("relayfloor: --loop uvloop asked, but uvloop is not installed in this Python")
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(relay(args.front, args.member, args.node, args.pool))


if __name__ == "__main__":
    main()
