"""An asyncio apiserver client over aiohttp that speaks raw dicts.

One `KubeClient` per apiserver holds one connection pool. Requests are plain method + path +
JSON; answers are decoded dicts, errors are `vkprovider.kube.errors` classes. Watches are async
iterators of `WatchEvent`s; a compacted resourceVersion raises `Gone` so the caller relists.

Credentials come from the ClusterAccess before each request: a cached token (a cheap check),
renewed first when an exec plugin's credential is about to expire; a 401 obtains them again
once and repeats the request if they changed, else the 401 stands. A new client certificate
from a plugin gives a new SSL context (new connections; open ones keep their TLS session).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import random
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from typing import Any, Literal, TypedDict

import aiohttp
import orjson

from vkprovider.kube.access import ClusterAccess, KubeconfigError
from vkprovider.kube.errors import ApiError, Fenced, NoCredentials, Unreachable, error_for
from vkprovider.kube.pool import KEEPALIVE, NewestFirst

PatchType = Literal["merge", "strategic", "json", "apply"]

_PATCH_CONTENT_TYPES: dict[str, str] = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}

Params = Mapping[str, str | int | bool | None]
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
#: Items per page of a paged list: client-go's default, what apiservers are tuned for.
PAGE_SIZE = 500

#: A watch's base length in seconds (settings kube.watch_timeout), for every client of the
#: process: set once at start-up by `set_watch_timeout`.
_WATCH_TIMEOUT = [300.0]


def set_watch_timeout(seconds: float) -> None:
    """The base length of every watch this process opens from now on."""
    _WATCH_TIMEOUT[0] = seconds


def watch_timeout() -> int:
    """A watch's length: drawn from [base, 2 x base), as client-go does, so the watches of many
    processes (and of one process's many loops) do not all end and reopen at once."""
    base = _WATCH_TIMEOUT[0]
    return max(1, int(base * (1.0 + random.random())))


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
        keepalive: float = KEEPALIVE,
        fence: WriteFence | None = None,
    ) -> None:
        self.access = access
        self.fence = fence
        self.server = access.server
        self._timeout = aiohttp.ClientTimeout(total=request_timeout, sock_connect=5.0)
        self._ssl = access.ssl_context()
        self._tls_version = access.tls_version
        self._connector = NewestFirst(ssl=self._ssl, limit=connection_limit, keepalive_timeout=keepalive)
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

    async def _credentials(self) -> tuple[str | None, int]:
        """The bearer token to send and the credential version it belongs to, renewed first when
        due; the SSL context follows a changed client certificate."""
        access = self.access
        try:
            if access.stale():
                await access.refresh()
            token = access.bearer_token()
            if access.tls_version != self._tls_version:
                self._tls_version = access.tls_version
                self._ssl = access.ssl_context()
        except KubeconfigError as exc:
            raise NoCredentials(0, "NoCredentials", str(exc)) from None
        return token, access.version

    async def _renewed(self, rejected: int) -> bool:
        """After a 401: whether credentials other than those refused are now at hand."""
        try:
            return await self.access.refresh(rejected=rejected)
        except KubeconfigError as exc:
            raise NoCredentials(0, "NoCredentials", str(exc)) from None

    @staticmethod
    def _headers(token: str | None, content_type: str | None = None, accept: str | None = None) -> dict[str, str]:
        headers: dict[str, str] = {"Accept": accept} if accept else {}
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
        data = None if body is None else (body if isinstance(body, (bytes, str)) else orjson.dumps(body))
        client_timeout = self._timeout if timeout is None else aiohttp.ClientTimeout(total=timeout, sock_connect=5.0)
        retried = False
        while True:
            token, version = await self._credentials()
            self.calls[method] += 1
            try:
                async with self._session.request(
                    method,
                    self.server + path,
                    params=_query(params),
                    data=data,
                    headers=self._headers(token, content_type if data is not None else None, accept),
                    timeout=client_timeout,
                    ssl=self._ssl,
                ) as resp:
                    raw = await resp.read()
                    status, retry_after = resp.status, resp.headers.get("Retry-After")
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise self._unreachable(f"{method} {self.server}{path}: {exc!r}") from exc
            if status == 401 and not retried and await self._renewed(version):
                retried = True
                continue
            decoded = _decode(raw)
            if status >= 400:
                raise error_for(status, decoded, raw.decode(errors="replace"), retry_after)
            return decoded or {}

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
        `metadata_only` the apiserver sends each item's metadata alone (far less to decode).
        For collections that can hold thousands (pods), `pages` decodes one page at a time."""
        items: list[dict[str, Any]] = []
        page: dict[str, Any] = {}
        async for page in self.pages(path, params=params, metadata_only=metadata_only, limit=None):
            items.extend(page.get("items") or [])
        page["items"] = items
        return page

    async def pages(
        self,
        path: str,
        *,
        params: Params | None = None,
        metadata_only: bool = False,
        limit: int | None = PAGE_SIZE,
    ) -> AsyncIterator[dict[str, Any]]:
        """A list in pages of at most `limit` items (None: as the apiserver chooses, usually one
        page), each decoded only when the previous one is let go: a list of tens of thousands of
        pods costs one page of objects at a time, not the whole list at once. All pages come
        from one snapshot, whose resourceVersion every page's metadata carries; a snapshot that
        expires between pages raises Gone, as an expired watch does."""
        query = dict(params or {})
        if limit is not None:
            query["limit"] = limit
        accept = METADATA_LIST if metadata_only else None
        while True:
            page = await self.request("GET", path, params=query, accept=accept)
            token = (page.get("metadata") or {}).get("continue")
            yield page
            del page  # not held while the next page is fetched
            if not token:
                return
            query["continue"] = token

    async def watch(
        self,
        path: str,
        *,
        resource_version: str | None = None,
        params: Params | None = None,
        timeout_seconds: int | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Stream watch events until the server closes the watch (normal after timeout_seconds).

        Raises Gone when the resourceVersion is too old, so the caller lists again.
        """
        if timeout_seconds is None:
            timeout_seconds = watch_timeout()
        query: dict[str, str | int | bool | None] = dict(params or {})
        query.update(
            watch=True,
            resourceVersion=resource_version,
            allowWatchBookmarks=True,
            timeoutSeconds=timeout_seconds,
        )
        self.calls["WATCH"] += 1
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=timeout_seconds + 30)
        async with self._streaming("WATCH", path, query, timeout) as resp:
            buffer = b""
            async for chunk in resp.content.iter_any():
                buffer += chunk
                while (newline := buffer.find(b"\n")) >= 0:
                    line, buffer = buffer[:newline], buffer[newline + 1 :]
                    if line.strip():
                        yield _watch_event(line)

    async def stream(self, path: str, *, params: Params | None = None, opened: bool = False) -> AsyncIterator[bytes]:
        """Raw body chunks of a streaming GET (logs), as they arrive. With `opened`, an empty
        chunk first, as soon as the server answered 200: a caller relaying the stream can send
        its own headers then, before the first byte of a quiet log."""
        self.calls["GET"] += 1
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=5.0)
        async with self._streaming("GET", path, params, timeout) as resp:
            if opened:
                yield b""
            async for chunk in resp.content.iter_any():
                yield chunk

    @contextlib.asynccontextmanager
    async def websocket(
        self, path: str, *, query: builtins.list[tuple[str, str]], protocols: tuple[str, ...]
    ) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
        """A WebSocket to the apiserver (pods/exec, pods/attach), `query` with repeated keys
        (`command`). The apiserver's refusal raises as any answer would (Forbidden, NotFound);
        a connection that cannot be opened is Unreachable."""
        self.calls["GET"] += 1
        token, _ = await self._credentials()
        try:
            ws = await self._session.ws_connect(
                self.server + path,
                params=query,
                # Not the session's JSON: a KWOK kubelet's port-forward answers 406 to it.
                headers={**self._headers(token), "Accept": "*/*"},
                protocols=protocols,
                ssl=self._ssl,
                max_msg_size=0,
                timeout=aiohttp.ClientWSTimeout(ws_close=5.0),
            )
        except aiohttp.WSServerHandshakeError as exc:
            raise error_for(exc.status, None, exc.message) from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise self._unreachable(f"WEBSOCKET {self.server}{path}: {exc!r}") from exc
        try:
            yield ws
        finally:
            await ws.close()

    @contextlib.asynccontextmanager
    async def _streaming(
        self, what: str, path: str, params: Params | None, timeout: aiohttp.ClientTimeout
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """A GET whose body is read as it arrives (watches, logs); a 401 renews the credential
        once, and a broken connection, while opening or reading, is Unreachable."""
        retried = False
        while True:
            token, version = await self._credentials()
            try:
                async with self._session.get(
                    self.server + path,
                    params=_query(params),
                    headers=self._headers(token),
                    timeout=timeout,
                    ssl=self._ssl,
                ) as resp:
                    if resp.status >= 400:
                        text = await resp.text()
                        if resp.status == 401 and not retried and await self._renewed(version):
                            retried = True
                            continue
                        raise error_for(resp.status, _decode(text), text, resp.headers.get("Retry-After"))
                    yield resp
                    return
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise self._unreachable(f"{what} {self.server}{path}: {exc!r}") from exc

    async def wait_ready(self, *, timeout: float, path: str = "/readyz") -> None:
        """Poll a health endpoint until it answers 200; raise Unreachable with the last reason."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        last = "no answer"
        renewed = False
        while True:
            try:
                token, version = await self._credentials()
                async with self._session.get(
                    self.server + path,
                    headers=self._headers(token),
                    timeout=aiohttp.ClientTimeout(total=5),
                    ssl=self._ssl,
                ) as resp:
                    if resp.status == 200:
                        return
                    last = f"{resp.status}: {(await resp.text())[-300:]}"
                if resp.status == 401 and not renewed:
                    renewed = True
                    await self._renewed(version)
            except NoCredentials as exc:
                last = exc.message
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                last = repr(exc)
            if loop.time() >= deadline:
                raise Unreachable(0, "NotReady", f"{self.server}{path} not ready after {timeout:.0f}s: {last}")
            await asyncio.sleep(0.2)


def _lean(obj: dict[str, Any]) -> dict[str, Any]:
    """The object without metadata.managedFields, which nothing here reads and which is often
    the largest part of a pod held in a cache (a client that replaces an object without them
    leaves the server's record as it is)."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def _decode(text: str | bytes) -> dict[str, Any] | None:
    if not text:
        return None
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(value, dict):
        return None
    for item in value.get("items") or ():
        if isinstance(item, dict):
            _lean(item)
    return _lean(value)


def _watch_event(line: bytes) -> WatchEvent:
    event = orjson.loads(line)
    obj = _lean(event.get("object") or {})
    if event.get("type") == "ERROR":
        code = int(obj.get("code") or 500)
        raise error_for(code, obj, str(obj.get("message", "")))
    return WatchEvent(type=str(event.get("type")), object=obj)


__all__ = ["ApiError", "KubeClient", "WatchEvent", "WriteFence"]
