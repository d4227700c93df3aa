"""`kubectl logs` of a pod on a virtual node: the log of its member pod, read through the
member's `pods/log` and relayed as it arrives (never a whole log in memory).

Every option kubectl sends is passed on as the member's apiserver takes it, so the answer is the
member's own `kubectl logs`. Errors say which side failed: a pod we never sent, a member pod
taken away (its log went with it), a member that does not answer or refuses `pods/log`. They
are ProviderErrors (500), as a kubelet answers when a container's log cannot be read: the
apiserver passes a kubelet's text on to kubectl for a 5xx, but turns a 404 into its generic
"could not find the requested resource".
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from federation.dispatch.dispatcher import Dispatcher
from vkprovider.kube import ApiError, Forbidden, KubeClient, NotFound
from vkprovider.provider import LogOptions, ProviderError


def log_params(container: str, options: LogOptions) -> dict[str, str | int | bool | None]:
    """The query of the member's `pods/log` (unset options left out, as kubectl leaves them)."""
    params: dict[str, str | int | bool | None] = {"container": container}
    if options.follow:
        params["follow"] = "true"
    if options.previous:
        params["previous"] = "true"
    if options.timestamps:
        params["timestamps"] = "true"
    if options.tail_lines is not None:
        params["tailLines"] = options.tail_lines
    if options.limit_bytes is not None:
        params["limitBytes"] = options.limit_bytes
    if options.since_seconds is not None:
        params["sinceSeconds"] = options.since_seconds
    if options.since_time:
        params["sinceTime"] = options.since_time
    return params


def _gone_message(key: str, dispatcher: Dispatcher) -> str:
    tomb = dispatcher.tombstone(key)
    if tomb is None:
        return f"pod {key} has no pod in any member"
    _, why = tomb
    return f"the member pod of {key} is gone ({why.cause}: {why.message}); its log went with it"


def locate(dispatcher: Dispatcher, key: str, doing: str) -> tuple[str, str, KubeClient]:
    """(member, the member pod's path, a client of the member) for the front-end pod `key`;
    ProviderError saying why `doing` cannot be done now (shared with federation.memberexec)."""
    found = dispatcher.member_pod(key)
    if found is None:
        raise ProviderError(_gone_message(key, dispatcher))
    member, member_pod = found
    pods = dispatcher.pods_in(member)
    client = pods.client if pods is not None else None
    if client is None:
        raise ProviderError(f"member {member} is not connected; cannot {doing} for {key} now")
    meta: dict[str, Any] = member_pod["metadata"]
    return member, f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", client


@contextlib.contextmanager
def explained(member: str, key: str, subresource: str, doing: str) -> Iterator[None]:
    """The member's refusals as ProviderErrors that say which side failed (shared with
    federation.memberexec and federation.memberforward)."""
    try:
        yield
    except Forbidden as exc:
        raise ProviderError(f"member {member} refuses pods/{subresource} to this provider: {exc}") from exc
    except NotFound as exc:
        raise ProviderError(f"the member pod of {key} in {member} is gone: {exc}") from exc
    except ApiError as exc:
        raise ProviderError(f"member {member}: cannot {doing} for {key}: {exc}") from exc


async def stream(
    dispatcher: Dispatcher, namespace: str, name: str, container: str, options: LogOptions
) -> AsyncIterator[bytes]:
    key = f"{namespace}/{name}"
    member, pod_path, client = locate(dispatcher, key, "read the log")
    with explained(member, key, "log", "read the log"):
        async for chunk in client.stream(f"{pod_path}/log", params=log_params(container, options), opened=True):
            yield chunk
