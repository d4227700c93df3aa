"""An asyncio apiserver client over aiohttp that speaks raw dicts.

One `KubeClient` per apiserver holds one connection pool. Requests are plain method + path +
JSON; answers are decoded dicts, errors are `vkprovider.kube.errors` classes. Watches are async
iterators of `WatchEvent`s; a compacted resourceVersion raises `Gone` so the caller relists.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal, TypedDict

import aiohttp
import orjson

from vkprovider.kube.access import ClusterAccess
from vkprovider.kube.errors import ApiError, Fenced, Unreachable, error_for

PatchType = Literal["merge", "strategic", "json", "apply"]

_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}

Params = Mapping[str, str | int | bool | None]
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


class WatchEvent(TypedDict):
    type: str
    object: dict[str, Any]


def _query(params: Params | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in (params or {}).items():
        if value is None:
            continue
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


class WriteFence:
    """Shared by every client of one process: once closed (leadership lost), no client sends a
    write again, whatever task asks, so a deposed leader cannot write after it stepped down."""

    def __init__(self) -> None:
        self.closed: str | None = None

    def close(self, reason: str) -> None:
        self.closed = self.closed or reason


class KubeClient:
    """Requests against one apiserver. Create inside a running event loop; `close()` when done."""

    def __init__(
        self,
        access: ClusterAccess,
        *,
        user_agent: str = "vkprovider",
        request_timeout: float = 30.0,
        connection_limit: int = 100,
        fence: WriteFence | None = None,
    ) -> None:
        self.access = access
        self.fence = fence
        self.server = access.server
        self._timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=5.0)
        self._connector = aiohttp.TCPConnector(ssl=access.ssl_context(), limit=connection_limit)
        self._session = aiohttp.ClientSession(
            connector=self._connector,
            headers={"User-Agent": user_agent, "Accept": "application/json"},
            json_serialize=json.dumps,
        )
        #: API calls made, by HTTP verb: what the metrics and benchmarks count.
        self.calls: Counter[str] = Counter()

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._session.close()

    def _headers(self, content_type: str | None = None, accept: str | None = None) -> dict[str, str]:
        headers: dict[str, str] = {"Accept": accept} if accept else {}
        token = self.access.bearer_token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
        accept: str | None = None,
    ) -> dict[str, Any]:
        """One request; the decoded JSON answer, or an ApiError subclass."""
        if self.fence is not None and self.fence.closed and method != "GET":
            raise Fenced(0, "Fenced", f"{method} {path} not sent: {self.fence.closed}")
        self.calls[method] += 1
        data = None if body is None else (body if isinstance(body, (bytes, str)) else orjson.dumps(body))
        client_timeout = self._timeout if timeout is None else aiohttp.ClientTimeout(total=timeout, sock_connect=5.0)
        try:
            async with self._session.request(
                method,
                self.server + path,
                params=_query(params),
                data=data,
                headers=self._headers(content_type if data is not None else None, accept),
                timeout=client_timeout,
            ) as resp:
                raw = await resp.read()
                decoded = _decode(raw)
                if resp.status >= 400:
                    text = raw.decode(errors="replace")
                    raise error_for(resp.status, decoded, text, resp.headers.get("Retry-After"))
                return decoded or {}
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise self._unreachable(f"{method} {self.server}{path}: {exc!r}") from exc

    def _unreachable(self, message: str) -> Unreachable:
        err = Unreachable(0, "Unreachable", message)
        err.server = self.server
        return err

    async def get(self, path: str, *, params: Params | None = None) -> dict[str, Any]:
        return await self.request("GET", path, params=params)

    async def create(self, path: str, body: Mapping[str, Any], *, params: Params | None = None) -> dict[str, Any]:
        return await self.request("POST", path, body=body, params=params)

    async def replace(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        return await self.request("PUT", path, body=body)

    async def patch(
        self,
        path: str,
        body: Any,
        *,
        patch_type: PatchType = "merge",
        field_manager: str | None = None,
        force: bool | None = None,
    ) -> dict[str, Any]:
        params: dict[str, str | int | bool | None] = {"fieldManager": field_manager, "force": force}
        return await self.request(
            "PATCH", path, body=body, params=params, content_type=_PATCH_CONTENT_TYPES[patch_type]
        )

    async def delete(
        self, path: str, *, body: Mapping[str, Any] | None = None, params: Params | None = None
    ) -> dict[str, Any]:
        return await self.request("DELETE", path, body=body, params=params)

    async def list(self, path: str, *, params: Params | None = None, metadata_only: bool = False) -> dict[str, Any]:
        """A whole list, following `continue` tokens; items of all pages in one dict. With
        `metadata_only` the apiserver sends each item's metadata alone (far less to decode)."""
        items: list[dict[str, Any]] = []
        query = dict(params or {})
        accept = METADATA_LIST if metadata_only else None
        while True:
            page = await self.request("GET", path, params=query, accept=accept)
            items.extend(page.get("items") or [])
            token = (page.get("metadata") or {}).get("continue")
            if not token:
                page["items"] = items
                return page
            query["continue"] = token

    async def watch(
        self,
        path: str,
        *,
        resource_version: str | None = None,
        params: Params | None = None,
        timeout_seconds: int = 300,
    ) -> AsyncIterator[WatchEvent]:
        """Stream watch events until the server closes the watch (normal after timeout_seconds).

        Raises Gone when the resourceVersion is too old, so the caller lists again.
        """
        query: dict[str, str | int | bool | None] = dict(params or {})
        query.update(
            watch=True,
            resourceVersion=resource_version,
            allowWatchBookmarks=True,
            timeoutSeconds=timeout_seconds,
        )
        self.calls["WATCH"] += 1
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=timeout_seconds + 30)
        try:
            async with self._session.get(
                self.server + path, params=_query(query), headers=self._headers(), timeout=timeout
            ) as resp:
                if resp.status >= 400:
                    text = await resp.text()
                    raise error_for(resp.status, _decode(text), text, resp.headers.get("Retry-After"))
                buffer = b""
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    while (newline := buffer.find(b"\n")) >= 0:
                        line, buffer = buffer[:newline], buffer[newline + 1 :]
                        if line.strip():
                            yield _watch_event(line)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise self._unreachable(f"WATCH {self.server}{path}: {exc!r}") from exc

    async def stream(self, path: str, *, params: Params | None = None) -> AsyncIterator[bytes]:
        """Raw body chunks of a streaming GET (logs), as they arrive."""
        self.calls["GET"] += 1
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0)
        try:
            async with self._session.get(
                self.server + path, params=_query(params), headers=self._headers(), timeout=timeout
            ) as resp:
                if resp.status >= 400:
                    text = await resp.text()
                    raise error_for(resp.status, _decode(text), text)
                async for chunk in resp.content.iter_any():
                    yield chunk
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise self._unreachable(f"GET {self.server}{path}: {exc!r}") from exc

    async def wait_ready(self, *, timeout: float, path: str = "/readyz") -> None:
        """Poll a health endpoint until it answers 200; raise Unreachable with the last reason."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last = "no answer"
        while True:
            try:
                async with self._session.get(
                    self.server + path, headers=self._headers(), timeout=aiohttp.ClientTimeout(total=5)
                ) as resp:
                    if resp.status == 200:
                        return
                    last = f"{resp.status}: {(await resp.text())[-300:]}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                last = repr(exc)
            if loop.time() >= deadline:
                raise Unreachable(0, "NotReady", f"{self.server}{path} not ready after {timeout:.0f}s: {last}")
            await asyncio.sleep(0.2)


def _decode(text: str | bytes) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def _watch_event(line: bytes) -> WatchEvent:
    event = orjson.loads(line)
    obj = event.get("object") or {}
    if event.get("type") == "ERROR":
        code = int(obj.get("code") or 500)
        raise error_for(code, obj, str(obj.get("message", "")))
    return WatchEvent(type=str(event.get("type")), object=obj)


__all__ = ["ApiError", "KubeClient", "WatchEvent", "WriteFence"]
