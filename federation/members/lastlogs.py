"""The last log lines of member pods we take away, kept so `kubectl logs` on the Failed
front-end pod still prints them.

After a reclaim, the log people need is the one of the pod that is gone: whether it saw its
notice, whether its checkpoint finished. Before reclaim deletes a member pod it reads the end
of each container's log (at most `per_pod` bytes per container, default 1 MiB, read as a stream
and trimmed as it comes, within a few seconds); a pod the member deletes itself is read while
it terminates, as far as its grace period allows. The bytes live in memory, bounded in total
(the least recently kept go first): a restarted provider has none, and the log then says so,
as it always did. Keeping them in the API (a ConfigMap per pod) would put up to a megabyte per
reclaim into etcd; memory is the honest size for something only people read.
"""

from __future__ import annotations

import asyncio
from typing import Any

from cachetools import LRUCache, TTLCache

from federation.members.member import Member
from federation.members.pods import MemberPods
from vkprovider import logs
from vkprovider.kube import ApiError, KubeClient

PER_POD = 1 << 20
TOTAL = 64 << 20
READ_TIMEOUT = 5.0


def _size(logs_by_container: dict[str, bytes]) -> int:
    return sum(len(v) for v in logs_by_container.values()) or 1


def tail(text: bytes, *, lines: int | None, limit: int | None) -> bytes:
    """The kept log as `kubectl logs --tail/--limit-bytes` would cut it."""
    if lines is not None and lines >= 0:
        parts = text.splitlines(keepends=True)
        text = b"".join(parts[-lines:]) if lines else b""
    if limit is not None and limit >= 0:
        text = text[:limit]
    return text


class LastLogs:
    def __init__(self, *, per_pod: int = PER_POD, total: int = TOTAL) -> None:
        self.per_pod = per_pod
        self._kept: LRUCache[str, dict[str, bytes]] = LRUCache(maxsize=max(1, total), getsizeof=_size)
        self._uids: TTLCache[str, bool] = TTLCache(maxsize=100_000, ttl=600)  # pods kept or being kept
        self._tasks: set[asyncio.Task[None]] = set()
        self._log = logs.get("lastlogs")

    def keep_soon(self, client: KubeClient | None, member_pod: dict[str, Any]) -> None:
        """Keep a terminating member pod's log in the background (once per pod)."""
        uid = member_pod["metadata"].get("uid", "")
        if client is None or self.per_pod <= 0 or uid in self._uids:
            return
        self._uids[uid] = True
        task = asyncio.create_task(self.keep(client, member_pod), name=f"lastlogs/{MemberPods.origin(member_pod)}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Stop reads in flight (bounded: each is cancelled, none awaited longer)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def get(self, key: str, container: str) -> bytes | None:
        """The kept end of a container's log of front-end pod `key`, if any."""
        found = self._kept.get(key)
        return None if found is None else found.get(container)

    async def keep_member(self, member: Member, member_pod: dict[str, Any]) -> None:
        """Reclaim's hook: the log of a member pod it is about to delete."""
        pods = member.pods
        if pods is not None and pods.client is not None:
            self._uids[member_pod["metadata"].get("uid", "")] = True
            await self.keep(pods.client, member_pod)

    async def keep(self, client: KubeClient, member_pod: dict[str, Any]) -> None:
        """Read and keep the end of every container's log of a member pod about to go."""
        if self.per_pod <= 0:
            return
        meta = member_pod["metadata"]
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/log"
        kept: dict[str, bytes] = {}
        for container in (member_pod.get("spec") or {}).get("containers") or []:
            name = container.get("name", "")
            buffer = bytearray()
            try:
                async with asyncio.timeout(READ_TIMEOUT):
                    async for chunk in client.stream(path, params={"container": name}):
                        buffer += chunk
                        if len(buffer) > 2 * self.per_pod:
                            del buffer[: len(buffer) - self.per_pod]
            except TimeoutError:
                self._log.info("log kept as far as read in time", pod=MemberPods.origin(member_pod), container=name)
            except ApiError as exc:  # gone already, or refused: nothing to keep, kubectl says so
                self._log.info("log not kept", pod=MemberPods.origin(member_pod), container=name, error=str(exc))
                continue
            kept[name] = bytes(buffer[-self.per_pod :])
        if kept and self.per_pod * len(kept) <= self._kept.maxsize:
            self._kept[MemberPods.origin(member_pod)] = kept
