"""Create an object, or replace the one of that name: for objects we own whole (a webhook
configuration, a CRD), where the latest content is the truth."""

from __future__ import annotations

from typing import Any

from vkprovider.kube.client import KubeClient
from vkprovider.kube.errors import AlreadyExists


async def create_or_replace(client: KubeClient, collection: str, body: dict[str, Any]) -> dict[str, Any]:
    """`collection` is the list path (…/mutatingwebhookconfigurations); `body` names the object."""
    try:
        return await client.create(collection, body)
    except AlreadyExists:
        path = f"{collection}/{body['metadata']['name']}"
        current = await client.get(path)
        body = {**body, "metadata": {**body["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
        return await client.replace(path, body)
