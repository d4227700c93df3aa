"""Relisting in pages (vkprovider.kube.relist) against a real apiserver: the pages of one list
share its snapshot, follow its `continue` tokens to the end, and what the store held that the
list no longer names is dropped only at the end."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from e2e.fixtures import Lab
from tests.e2e.helpers import delete_namespace, make_namespace
from vkprovider.kube.relist import Relist, relist

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="session")]


@pytest.mark.shares_lab
async def test_a_relist_in_pages_takes_every_item_once_from_one_snapshot(lab: Lab) -> None:
    async with lab.client("member-1") as client:
        ns = await make_namespace(client, f"relist-{uuid.uuid4().hex[:6]}")
        try:
            path = f"/api/v1/namespaces/{ns}/configmaps"
            names = [f"cm{i}" for i in range(7)]
            for name in names:
                await client.create(path, {"metadata": {"name": name, "labels": {"relist": "yes"}}})
            store: dict[str, dict[str, Any]] = {"gone": {}, "cm0": {}}
            pages: list[int] = []

            class Counted(Relist):
                def page(self, items: list[dict[str, Any]]) -> None:
                    pages.append(len(items))
                    super().page(items)

            def put(obj: dict[str, Any]) -> str:
                assert "gone" in store, "the old state is kept until the list ends"
                store[obj["metadata"]["name"]] = obj
                return str(obj["metadata"]["name"])

            def finish(seen: set[str]) -> None:
                for key in [k for k in store if k not in seen]:
                    del store[key]

            params = {"labelSelector": "relist=yes"}
            version = await relist(client, path, Counted(put, finish), params=params, limit=3)

            assert pages == [3, 3, 1]
            assert sorted(store) == names
            # the snapshot's version is one a watch can start from: a change after it is seen
            await client.create(path, {"metadata": {"name": "late", "labels": {"relist": "yes"}}})
            async for event in client.watch(path, resource_version=version, timeout_seconds=10):
                assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "late")
                break
        finally:
            await delete_namespace(client, ns)
