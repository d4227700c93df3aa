"""Where a stream goes: the member pod of a front-end pod, and a client of its member, found
through `MemberPodIndex` (the provider hands in dispatch's reports; streams import no other
feature), and the member's refusals turned into errors that say which side failed.

Errors are ProviderErrors (500), as a kubelet answers when a container cannot be reached: the
apiserver passes a kubelet's text on to kubectl for a 5xx, but turns a 404 into its generic
"could not find the requested resource".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from federation.members.disruption import Disruption
from federation.members.pods import MemberPods
from vkprovider.kube import ApiError, Forbidden, KubeClient, NotFound
from vkprovider.provider import ProviderError


class MemberPodIndex(Protocol):
    """Where each front-end pod runs (federation.dispatch.reports.StatusReports)."""

    def member_pod(self, key: str) -> tuple[str, dict[str, Any]] | None: ...

    def pods_in(self, member: str) -> MemberPods | None: ...

    def tombstone(self, key: str) -> tuple[dict[str, Any], Disruption] | None: ...


def _gone_message(key: str, index: MemberPodIndex) -> str:
    tomb = index.tombstone(key)
    if tomb is None:
        return f"pod {key} has no pod in any member"
    _, why = tomb
    return f"the member pod of {key} is gone ({why.cause}: {why.message}); its log went with it"


def locate(index: MemberPodIndex, key: str, doing: str) -> tuple[str, str, KubeClient]:
    """(member, the member pod's path, a client of the member) for the front-end pod `key`;
    ProviderError saying why `doing` cannot be done now."""
    found = index.member_pod(key)
    if found is None:
        raise ProviderError(_gone_message(key, index))
    member, member_pod = found
    pods = index.pods_in(member)
    client = pods.client if pods is not None else None
    if client is None:
        raise ProviderError(f"member {member} is not connected; cannot {doing} for {key} now")
    meta: dict[str, Any] = member_pod["metadata"]
    return member, f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}", client


@contextlib.contextmanager
def explained(member: str, key: str, subresource: str, doing: str) -> Iterator[None]:
    """The member's refusals as ProviderErrors that say which side failed."""
    try:
        yield
    except Forbidden as exc:
        raise ProviderError(f"member {member} refuses pods/{subresource} to this provider: {exc}") from exc
    except NotFound as exc:
        raise ProviderError(f"the member pod of {key} in {member} is gone: {exc}") from exc
    except ApiError as exc:
        raise ProviderError(f"member {member}: cannot {doing} for {key}: {exc}") from exc
