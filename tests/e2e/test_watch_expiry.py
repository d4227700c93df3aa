"""Watch expiry end to end (issue 40, item 5): the front end's and a member's apiserver answer
the provider's watches with 410 Gone, as real apiservers do after a long disconnection, and the
provider lists once per expired watch, then goes on as if nothing happened.

The front end and member-2 are each reached through a second apiserver without a watch cache
(tests.e2e.uncached), and the provider's watches last 1 s (kube.watch_timeout): each time one
ends it is opened again from the last resourceVersion it saw. The lab's etcd is compacted to
its head; the next reopening, from a revision now compacted, gets a 410. What the provider did
is read from those apiservers' own audit logs and from its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest

from e2e import audit
from e2e.fixtures import Lab
from tests.e2e.helpers import eventually, make_namespace
from tests.e2e.test_dispatch import cleanup_and_stop
from tests.e2e.test_federation_capacity import federation_vk
from tests.e2e.test_outages import plain_pod, running, start_provider
from tests.e2e.uncached import compact_etcd, uncached_apiserver
from tests.e2e.vk import VkProcess
from vkprovider.kube import KubeClient

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]

#: Not member-1, where the reclaim chain runs alone (e2e.fixtures.CHAIN).
MEMBER = "member-2"
WATCH_SECONDS = 1.0  # each watch lasts 1 s ([1, 2) drawn, whole seconds asked for)


def _expiries(proc: VkProcess) -> Counter[str]:
    """The provider's "watch expired" log lines, by where: "front-end" (its pod watch) or the
    member's resource ("nodes", "pods", "topologies")."""
    found: Counter[str] = Counter()
    for line in proc.log_path.read_text().splitlines():
        record = json.loads(line) if line.startswith("{") else {}
        if record.get("event") == "watch expired; listing again":
            found[str(record.get("kind") or record.get("path") or "front-end")] += 1
    return found


def _lists(lab: Lab, cluster: str, log: Path, user: str, since: float) -> Counter[str]:
    records = audit.records(lab.state, cluster, users={user}, log=log)
    return Counter(r.resource for r in records if r.verb == "list" and r.received >= since)


# Beside other tests: the compaction is one the apiservers make every few minutes anyway (their
# watch caches do not notice it); only watches served by etcd from an older revision, those of
# this test's own uncached apiservers, expire. Counts are of this test's user alone.
@pytest.mark.lab_turn(shares=["offline", MEMBER])
async def test_watches_that_expire_list_once_each_and_the_provider_goes_on(
    lab: Lab, offline: KubeClient, tmp_path: Path
) -> None:
    user = f"vk-expiry-{uuid.uuid4().hex[:6]}"
    (tmp_path / "front").mkdir()
    (tmp_path / "member").mkdir()
    async with contextlib.AsyncExitStack() as stack:
        # Both start at once; one that fails stops the other (each stops its own process when
        # cut off while it starts), and whichever is up is stopped when the block ends.
        async with asyncio.TaskGroup() as starting:
            starting_front = starting.create_task(
                stack.enter_async_context(uncached_apiserver(lab, "offline", tmp_path / "front")),
                name="test/uncached-front-end",
            )
            starting_member = starting.create_task(
                stack.enter_async_context(uncached_apiserver(lab, MEMBER, tmp_path / "member")),
                name=f"test/uncached-{MEMBER}",
            )
        front, member = starting_front.result(), starting_member.result()
        proc = federation_vk(lab, tmp_path, [MEMBER], audited_as=user)
        mine = Path(audit.user_kubeconfig(lab.state, "offline", user, groups=("system:masters",)))
        proc.overrides["kube.kubeconfig"] = str(front.kubeconfig(mine, tmp_path / "front.yaml"))
        ours = Path(audit.user_kubeconfig(lab.state, MEMBER, user, groups=("system:masters",)))
        proc.overrides["provider.federation"]["members"] = [
            {"name": MEMBER, "kubeconfig": str(member.kubeconfig(ours, tmp_path / "member.yaml"))}
        ]
        proc.overrides["kube.watch_timeout"] = WATCH_SECONDS
        await start_provider(proc, 1)
        ns = await make_namespace(offline, f"expiry-{uuid.uuid4().hex[:6]}")
        try:
            await offline.create(f"/api/v1/namespaces/{ns}/pods", plain_pod("before", proc.node))
            await eventually(lambda: running(offline, ns, 1), timeout=60, what="the first pod running")
            assert not _expiries(proc), "no expiry before the compaction"

            compacted_at = time.time()
            await compact_etcd(lab)

            # Every watch of the provider reopens within 2 s of it, from a compacted revision
            # (unless an event moved it on first): the front end's pod watch of its node (our
            # pods only: quiet) expires; the member's node, pod and topology watches may.
            async def expired() -> Counter[str] | None:
                found = _expiries(proc)
                return found if found["front-end"] and found["nodes"] + found["pods"] + found["topologies"] else None

            await eventually(expired, timeout=30, what="the provider's watches expired")
            await asyncio.sleep(2 * 2 * WATCH_SECONDS)  # every watch has reopened at least twice since
            found = _expiries(proc)
            front_lists = _lists(lab, "offline", front.audit_log, user, compacted_at)
            member_lists = _lists(lab, MEMBER, member.audit_log, user, compacted_at)
            print(f"after the compaction: expiries {dict(found)}, lists front {front_lists}, member {member_lists}")
            # One list per expired watch, each once: not a storm, and not again once listed (the
            # periodic orphan check may add one list of member pods).
            assert found["front-end"] == 1 and front_lists["pods"] == 1, (found, front_lists)
            assert found["nodes"] <= 1 and member_lists["nodes"] == found["nodes"], (found, member_lists)
            assert found["topologies"] <= 1 and member_lists["noderesourcetopologies"] == found["topologies"]
            assert found["pods"] <= 1 and found["pods"] <= member_lists["pods"] <= found["pods"] + 1, member_lists
            settled = sum(found.values())
            await asyncio.sleep(2 * WATCH_SECONDS)
            assert sum(_expiries(proc).values()) == settled, _expiries(proc)

            # And nothing was lost: a new pod is dispatched, the first one is still Running.
            await offline.create(f"/api/v1/namespaces/{ns}/pods", plain_pod("after", proc.node))
            await eventually(lambda: running(offline, ns, 2), timeout=60, what="both pods running")
        finally:
            await cleanup_and_stop(lab, offline, ns, proc)
