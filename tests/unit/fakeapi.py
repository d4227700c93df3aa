"""An apiserver in a dict, for unit tests of the dispatcher's decisions (not of the API):
objects by path, and only the calls the dispatcher makes."""

from __future__ import annotations

import copy
import uuid
from typing import Any

from vkprovider.kube import AlreadyExists, NotFound


class FakeApi:
    """Objects by path; only what the dispatcher calls."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.creates: list[str] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []
        #: What a list of a namespace's pods answers when set (the front end's native pods).
        self.pod_lists: dict[str, list[dict[str, Any]]] = {}
        self.fence = None

    async def create(self, path: str, body: dict[str, Any], *, params: Any = None) -> dict[str, Any]:
        key = f"{path}/{body['metadata']['name']}"
        self.creates.append(key)
        if key in self.objects:
            raise AlreadyExists(409, "AlreadyExists", key)
        obj = copy.deepcopy(body)
        obj["metadata"].setdefault("uid", str(uuid.uuid4()))
        self.objects[key] = obj
        return copy.deepcopy(obj)

    async def get(self, path: str, *, params: Any = None) -> dict[str, Any]:
        if path.endswith("/serviceaccounts/default"):
            return {"metadata": {"name": "default"}}
        if path not in self.objects:
            raise NotFound(404, "NotFound", path)
        return copy.deepcopy(self.objects[path])

    async def patch(self, path: str, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.patches.append((path, copy.deepcopy(body)))
        meta = self.objects[path]["metadata"]
        for field in ("labels", "annotations"):
            meta.setdefault(field, {}).update(body.get("metadata", {}).get(field, {}))
        return copy.deepcopy(self.objects[path])

    async def list(self, path: str, *, params: Any = None, **_: Any) -> dict[str, Any]:
        if path in self.pod_lists:
            return {"items": copy.deepcopy(self.pod_lists[path]), "metadata": {}}
        return {"items": [o for k, o in self.objects.items() if k.startswith(path + "/")], "metadata": {}}

    async def delete(self, path: str, **_: Any) -> dict[str, Any]:
        self.objects.pop(path, None)
        return {}
