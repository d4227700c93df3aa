"""Routes of the kubelet API and the plain health/metrics port.

Kubelet API (HTTPS, every request authenticated and authorized):
  GET /containerLogs/{namespace}/{pod}/{container}   logs, streamed and flushed line by line
  GET /pods                                          pods bound to the node, as the API has them
  GET /healthz                                       "ok"
  GET /stats/summary, /metrics/resource              usage from the provider (metrics-server)
  /exec/{namespace}/{pod}/{container}, /attach/...   remote command over SPDY/3.1 (remotecommand)
                                                     or a WebSocket (wsremotecommand)
  /portForward/{namespace}/{pod}[/{uid}]             port-forward over SPDY/3.1 (portforward)
  /run/...                                           501: the kubelet's deprecated one-shot run
Plain port: /healthz, /readyz, /metrics (Prometheus); with the federation provider also / (the
dashboard), /capacity and /history. Unauthenticated on the pod's loopback; with
`http.health_auth` (a plain port that listens beyond the pod) every path but the probes' asks
what the kubelet port asks (`kubelet_auth`).

What one client may hold of the kubelet port is bounded (vkprovider.httpapi.limits): connections
and header time by the listener's guard, each streaming session by `StreamLimits`, and the
number of sessions by a memory budget (503 beyond it). A client that fails authentication gets
no kept-alive connection.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import ssl
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import Gauge

from vkprovider import logs
from vkprovider.httpapi import portforward, remotecommand, wsremotecommand
from vkprovider.httpapi.auth import Authenticator, Authorizer, User, user_from_certificate
from vkprovider.httpapi.limits import DEFAULT_LIMITS, ConnectionGuard, StreamLimits
from vkprovider.httpapi.resourcemetrics import resource_metrics
from vkprovider.kube import ApiError
from vkprovider.metrics import Metrics
from vkprovider.objects import Pod, pod_key
from vkprovider.provider import (
    DashboardSource,
    ForecastSource,
    HistorySource,
    LogOptions,
    LogProvider,
    PodLifecycle,
    ProviderError,
    ProviderNotFound,
    ReclaimSource,
    StatsProvider,
)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_log = logs.get("kubelet-api")
USER = web.RequestKey("user", str)  # the authenticated client's name, for its share of sessions
NO_RUN = "vkprovider does not serve /run (the kubelet's deprecated one-shot command); kubectl exec uses /exec"


def _bool(value: str | None) -> bool:
    return (value or "").lower() in ("1", "true", "yes")


def _int(query: Any, name: str) -> int | None:
    raw = query.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError as exc:
        raise web.HTTPBadRequest(text=f"{name} must be an integer, not {raw!r}\n") from exc
    if value < 0:
        raise web.HTTPBadRequest(text=f"{name} must not be negative\n")
    return value


def log_options(query: Any) -> LogOptions:
    since_time = query.get("sinceTime") or None
    if since_time:
        try:
            datetime.datetime.fromisoformat(since_time.replace("Z", "+00:00"))
        except ValueError as exc:
            raise web.HTTPBadRequest(text=f"sinceTime must be RFC 3339, not {since_time!r}\n") from exc
    since_seconds = _int(query, "sinceSeconds")
    if since_seconds is not None and since_time:
        raise web.HTTPBadRequest(text="at most one of sinceTime or sinceSeconds may be given\n")
    return LogOptions(
        follow=_bool(query.get("follow")),
        tail_lines=_int(query, "tailLines"),
        limit_bytes=_int(query, "limitBytes"),
        since_seconds=since_seconds,
        since_time=since_time,
        timestamps=_bool(query.get("timestamps")),
        previous=_bool(query.get("previous")),
    )


class KubeletApi:
    """The aiohttp application of the kubelet API (TLS and the listener are set up outside)."""

    def __init__(
        self,
        *,
        node: str,
        provider: object,
        pods: Callable[[], list[Pod]],
        authenticator: Authenticator,
        authorizer: Authorizer,
        node_of: Callable[[str, str], str | None] | None = None,
        sessions: Gauge | None = None,
        limits: StreamLimits = DEFAULT_LIMITS,
        max_sessions: int = 1000,
        max_sessions_per_user: int = 0,
        guard: ConnectionGuard | None = None,
        exposition: Callable[[], bytes] | None = None,
    ) -> None:
        self._node = node
        #: The provider's own metrics, served at /metrics as a kubelet serves its own there.
        self._exposition = exposition
        self._limits = limits
        self._max_sessions = max_sessions
        self._open_sessions = 0
        #: One identity's share (0: half of all): a tenant that opens sessions without end does
        #: not take the kube-apiserver's, which carries every other user's.
        self._max_per_user = max_sessions_per_user or max(1, max_sessions // 2)
        self._per_user: dict[str, int] = {}
        self._guard = guard
        self._node_of = node_of
        self._sessions = sessions
        self._provider = provider
        self._pods = pods
        self._authn = authenticator
        self._authz = authorizer
        self._log = logs.get("kubelet-api", node=node)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/healthz/ping", self._healthz)
        app.router.add_get("/pods", self._list_pods)
        app.router.add_get("/pods/", self._list_pods)
        app.router.add_get("/runningpods", self._running_pods)
        app.router.add_get("/runningpods/", self._running_pods)
        app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._logs)
        app.router.add_get("/stats/summary", self._summary)
        app.router.add_get("/stats/summary/", self._summary)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/metrics/resource", self._resource_metrics)
        app.router.add_route("*", "/exec/{namespace}/{pod}/{container}", self._exec)
        app.router.add_route("*", "/attach/{namespace}/{pod}/{container}", self._attach)
        app.router.add_route("*", "/portForward/{namespace}/{pod}", self._port_forward)
        app.router.add_route("*", "/portForward/{namespace}/{pod}/{uid}", self._port_forward)
        app.router.add_route("*", "/run/{tail:.*}", self._no_run)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self._guard is None:
            return await self._authorized(request, handler)
        self._guard.request_started(request.transport)
        upgraded = False
        try:
            response = await self._authorized(request, handler)
            upgraded = response.status == 101
            return response
        finally:
            self._guard.request_ended(request.transport, upgraded=upgraded)

    async def _authorized(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        user = await identify(request, self._authn)
        if user is None:
            return unauthorized()
        node = self._node
        parts = request.path.split("/")
        if (
            self._node_of is not None
            and len(parts) >= 4
            and parts[1] in ("containerLogs", "exec", "attach", "portForward")
        ):
            node = self._node_of(parts[2], parts[3]) or node
        allowed, reason = await self._authz.check(user, method=request.method, path=request.path, node=node)
        if not allowed:
            return web.Response(status=403, text=f"Forbidden ({reason})\n")
        request[USER] = user.name
        return await handler(request)

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _list_pods(self, request: web.Request) -> web.Response:
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": self._pods()}
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def _running_pods(self, request: web.Request) -> web.Response:
        """What the provider runs of the pods bound here, in the kubelet's shape for its
        runtime's pods: name, namespace and UID, and each container's name and image."""
        bound = {pod_key(p): p for p in self._pods()}
        if not isinstance(self._provider, PodLifecycle):
            return web.Response(status=501, text="this provider runs no pods")
        try:
            provided = await self._provider.list_pods()
        except ProviderError as exc:
            return web.Response(status=503, text=f"the provider cannot list its pods now: {exc}")
        items = []
        for pod in provided:
            api_pod = bound.get(pod_key(pod))
            if api_pod is None:
                continue
            meta = api_pod["metadata"]
            containers = [
                {"name": c.get("name", ""), "image": c.get("image", ""), "resources": {}}
                for c in pod["spec"].get("containers", [])
            ]
            items.append(
                {
                    "metadata": {"name": meta.get("name"), "namespace": meta.get("namespace"), "uid": meta.get("uid")},
                    "spec": {"containers": containers},
                    "status": {},
                }
            )
        body = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def _exec(self, request: web.Request) -> web.StreamResponse:
        return await self._session(request, "exec", lambda: self._remote_command(request, attach=False))

    async def _attach(self, request: web.Request) -> web.StreamResponse:
        return await self._session(request, "attach", lambda: self._remote_command(request, attach=True))

    async def _remote_command(self, request: web.Request, *, attach: bool) -> web.StreamResponse:
        if request.headers.get("Upgrade", "").lower() == "websocket":
            return await wsremotecommand.serve(request, self._provider, attach=attach, limits=self._limits)
        return await remotecommand.serve(request, self._provider, attach=attach, limits=self._limits)

    async def _port_forward(self, request: web.Request) -> web.StreamResponse:
        return await self._session(
            request, "portforward", lambda: portforward.serve(request, self._provider, self._limits)
        )

    async def _session(
        self, request: web.Request, kind: str, serve: Callable[[], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """Admitted while the memory budget holds another session, and the client's identity
        its share (503 beyond either), and counted while open (vkprovider_stream_sessions): one
        that never ends is a leak."""
        user = request.get(USER, "")
        for limit, count, most in (
            ("sessions", self._open_sessions, self._max_sessions),
            ("sessions_per_user", self._per_user.get(user, 0), self._max_per_user),
        ):
            if count >= most:
                self._limits.hit(limit)
                whose = "" if limit == "sessions" else f" for {user}"
                busy = f"too many streaming sessions open{whose} ({most}); try again later\n"
                return web.Response(status=503, text=busy, headers={"Retry-After": "5"})
        gauge = self._sessions.labels(kind) if self._sessions is not None else None
        self._open_sessions += 1
        self._per_user[user] = self._per_user.get(user, 0) + 1
        if gauge is not None:
            gauge.inc()
        try:
            return await serve()
        finally:
            self._open_sessions -= 1
            left = self._per_user.pop(user) - 1
            if left:
                self._per_user[user] = left
            if gauge is not None:
                gauge.dec()

    async def _no_run(self, request: web.Request) -> web.Response:
        return web.Response(status=501, text=NO_RUN + "\n")

    async def _logs(self, request: web.Request) -> web.StreamResponse:
        if not isinstance(self._provider, LogProvider):
            return web.Response(status=501, text="this provider does not serve container logs\n")
        options = log_options(request.query)
        ns, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        stream = self._provider.container_logs(ns, pod, container, options)
        try:
            first = await anext(stream, None)
        except ProviderNotFound as exc:
            return web.Response(status=404, text=f"{exc}\n")
        except ProviderError as exc:
            return web.Response(status=500, text=f"{exc}\n")
        response = web.StreamResponse(headers={"Content-Type": "text/plain; charset=utf-8"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            if first is not None:
                await response.write(first)
                async for chunk in stream:
                    await response.write(chunk)
        except (ConnectionResetError, ProviderError) as exc:
            self._log.info("log stream ended early", pod=f"{ns}/{pod}", reason=repr(exc))
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        await response.write_eof()
        return response

    async def _summary(self, request: web.Request) -> web.Response:
        if not isinstance(self._provider, StatsProvider):
            return web.Response(status=501, text="this provider does not report stats\n")
        summary = await self._provider.stats_summary(self._node)
        return web.Response(text=json.dumps(summary), content_type="application/json")

    async def _metrics(self, request: web.Request) -> web.Response:
        if self._exposition is None:
            return web.Response(status=404, text="no metrics registry\n")
        return web.Response(body=self._exposition(), content_type="text/plain")

    async def _resource_metrics(self, request: web.Request) -> web.Response:
        if not isinstance(self._provider, StatsProvider):
            return web.Response(status=501, text="this provider does not report stats\n")
        summary = await self._provider.stats_summary(self._node)
        return web.Response(text=resource_metrics(summary), content_type="text/plain")


def tls_context(*, cert_file: str, key_file: str, client_ca: bytes | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert_file, key_file)
    if client_ca:
        ctx.load_verify_locations(cadata=client_ca.decode())
        ctx.verify_mode = ssl.CERT_OPTIONAL  # certificate or bearer token, as the kubelet accepts
    return ctx


def parse_duration(text: str) -> float:
    """Seconds in "90", "90s", "15m", "24h" or "14d"."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
    number, unit = (text[:-1], text[-1]) if text and text[-1] in units else (text, "s")
    try:
        value = float(number) * units[unit]
    except ValueError:
        raise ValueError(f"not a duration: {text!r} (say 90s, 15m, 24h or 14d)") from None
    if value <= 0:
        raise ValueError(f"not a positive duration: {text!r}")
    return value


async def identify(request: web.Request, authn: Authenticator) -> User | None:
    """The client: a certificate our CA verified (the apiserver's), else a bearer token the
    apiserver's TokenReview accepts; None when neither."""
    user = user_from_certificate(request.transport.get_extra_info("peercert") if request.transport else None)
    if user is not None:
        return user
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return None
    try:
        return await authn.token(header[len("Bearer ") :].strip())
    except ApiError as exc:  # not authenticated, whatever went wrong
        _log.warning("token review failed", error=repr(exc))
        return None


def unauthorized() -> web.Response:
    refused = web.Response(status=401, text="Unauthorized\n")
    refused.force_close()  # no kept-alive connection for a client we do not know
    return refused


def kubelet_auth(authn: Authenticator, authz: Authorizer, *, node: str, open_paths: frozenset[str]) -> Middleware:
    """The kubelet port's authentication and authorization for another listener (the plain port
    once it listens beyond the pod): `open_paths` (the probes' /healthz and /readyz, which the
    kubelet asks without credentials) and the pod's own loopback (exec probes, and `kubectl
    port-forward`, which the apiserver authorized as pods/portforward) pass; every other request
    needs what the kubelet port would ask: /metrics `get nodes/metrics`, the rest `get nodes/proxy`."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        if request.path in open_paths or (peer and ipaddress.ip_address(peer[0]).is_loopback):
            return await handler(request)
        user = await identify(request, authn)
        if user is None:
            return unauthorized()
        allowed, reason = await authz.check(user, method=request.method, path=request.path, node=node)
        if not allowed:
            return web.Response(status=403, text=f"Forbidden ({reason})\n")
        return await handler(request)

    return middleware


def health_app(
    *,
    middlewares: tuple[Middleware, ...] = (),
    metrics: Metrics,
    alive: Callable[[], bool],
    ready: Callable[[], bool],
    view: Callable[[], dict[str, Any]] | None = None,
    history: HistorySource | None = None,
    dashboard: DashboardSource | None = None,
    reclaims: ReclaimSource | None = None,
    forecast: ForecastSource | None = None,
) -> web.Application:
    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok") if alive() else web.Response(status=500, text="unhealthy\n")

    async def readyz(request: web.Request) -> web.Response:
        return web.Response(text="ok") if ready() else web.Response(status=503, text="not ready\n")

    async def prometheus(request: web.Request) -> web.Response:
        return web.Response(body=metrics.exposition(), content_type="text/plain")

    async def capacity(request: web.Request) -> web.Response:
        if view is None:
            return web.Response(status=404, text="this provider has no resource view\n")
        return web.Response(text=json.dumps(view(), indent=1), content_type="application/json")

    async def history_of(request: web.Request) -> web.Response:
        if history is None:
            return web.Response(status=404, text="this provider keeps no history\n")
        try:
            since = parse_duration(request.query.get("since", "24h"))
            points = int(request.query["points"]) if request.query.get("points") else None
        except ValueError as exc:
            return web.Response(status=400, text=f"{exc}\n")
        member, resource = request.query.get("member") or None, request.query.get("resource") or None
        body = history.history(since, member, resource, points)
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def reclaims_of(request: web.Request) -> web.Response:
        if reclaims is None:
            return web.Response(status=404, text="this provider keeps no reclaims\n")
        try:
            since = parse_duration(request.query.get("since", "24h"))
        except ValueError as exc:
            return web.Response(status=400, text=f"{exc}\n")
        body = reclaims.reclaims(since, request.query.get("member") or None)
        return web.Response(text=json.dumps(body), content_type="application/json")

    async def forecast_of(request: web.Request) -> web.Response:
        if forecast is None:
            return web.Response(status=404, text="this provider makes no forecast\n")
        try:
            hours = parse_duration(request.query.get("for", "6h")) / 3600.0
        except ValueError as exc:
            return web.Response(status=400, text=f"{exc}\n")
        if hours > 48:
            return web.Response(status=400, text="a forecast reaches at most 48h ahead\n")
        return web.Response(text=json.dumps(forecast.forecast(hours)), content_type="application/json")

    async def page(request: web.Request) -> web.Response:
        if dashboard is None:
            return web.Response(status=404, text="this provider has no dashboard\n")
        return web.Response(body=dashboard.dashboard_page(), content_type="text/html", charset="utf-8")

    app = web.Application(middlewares=middlewares)
    app.router.add_get("/", page)
    app.router.add_get("/capacity", capacity)
    app.router.add_get("/history", history_of)
    app.router.add_get("/reclaims", reclaims_of)
    app.router.add_get("/forecast", forecast_of)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", prometheus)
    return app
