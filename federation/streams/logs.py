"""`kubectl logs` of a pod on a virtual node: the log of its member pod, read through the
member's `pods/log` and relayed as it arrives (never a whole log in memory).

Every option kubectl sends is passed on as the member's apiserver takes it, so the answer is the
member's own `kubectl logs`. A member pod we took away (or saw deleted) answers with the end of
its log kept before it went (federation.members.lastlogs). Errors say which side failed: a pod
we never sent, a member pod taken away with no log kept, a member that does not answer or refuses `pods/log`. They
are ProviderErrors (500), as a kubelet answers when a container's log cannot be read: the
apiserver passes a kubelet's text on to kubectl for a 5xx, but turns a 404 into its generic
"could not find the requested resource".
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from federation.members.lastlogs import LastLogs, tail
from federation.streams.locate import MemberPodIndex, explained, locate
from vkprovider.provider import LogOptions


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


async def stream(
    index: MemberPodIndex,
    namespace: str,
    name: str,
    container: str,
    options: LogOptions,
    kept: LastLogs | None = None,
) -> AsyncIterator[bytes]:
    key = f"{namespace}/{name}"
    if kept is not None and index.member_pod(key) is None:
        last = kept.get(key, container)
        if last is not None:
            # The member pod is gone (reclaimed, deleted in the member): the end of its log,
            # kept before it went, cut as asked; nothing follows.
            yield tail(last, lines=options.tail_lines, limit=options.limit_bytes)
            return
    member, pod_path, client = locate(index, key, "read the log")
    with explained(member, key, "log", "read the log"):
        async for chunk in client.stream(f"{pod_path}/log", params=log_params(container, options), opened=True):
            yield chunk
