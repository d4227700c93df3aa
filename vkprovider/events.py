"""Kubernetes Events about pods, as a kubelet emits them (source component and host set).

Best effort: an Event that cannot be written is logged, never retried at the cost of the work
that caused it. Identical events for the same object within a window are sent once.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from cachetools import TTLCache

from vkprovider import logs
from vkprovider.kube import ApiError, KubeClient
from vkprovider.podstatus import now_rfc3339


class EventRecorder:
    def __init__(self, client: KubeClient, *, component: str, host: str, dedupe_seconds: float = 60.0) -> None:
        self._client = client
        self._component = component
        self._host = host
        self._recent: TTLCache[tuple[str, str, str], bool] = TTLCache(maxsize=10000, ttl=dedupe_seconds)
        self._log = logs.get("events", node=host)

    async def emit(
        self, obj: Mapping[str, Any], *, reason: str, message: str, warning: bool = False, strict: bool = False
    ) -> None:
        """Record an Event (the same one twice in a row only once). A failure is logged, or with
        `strict` raised, for callers that try again until it is recorded."""
        meta = obj.get("metadata", {})
        dedupe = (str(meta.get("uid", "")), reason, message)
        if dedupe in self._recent:
            return
        self._recent[dedupe] = True
        namespace = meta.get("namespace") or "default"
        now = now_rfc3339()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta.get('name', 'object')}.{uuid.uuid4().hex[:16]}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": obj.get("apiVersion", "v1"),
                "kind": obj.get("kind", "Pod"),
                "name": meta.get("name"),
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": "Warning" if warning else "Normal",
            "source": {"component": self._component, "host": self._host},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
            "reportingComponent": self._component,
            "reportingInstance": self._host,
        }
        try:
            await self._client.create(f"/api/v1/namespaces/{namespace}/events", event)
        except ApiError as exc:
            if strict:
                self._recent.pop(dedupe, None)  # not recorded: the next try must not be skipped
                raise
            self._log.warning("event not recorded", reason=reason, error=str(exc))
