"""Inventory nodes to protobuf messages and back (pure), shared by the agent and its clients so
both sides mean the same thing by a node."""

from __future__ import annotations

from federation.agent import capacity_pb2 as pb
from federation.capacity import quantities
from federation.capacity.inventory import Inventory, NodeRecord, NumaZone


def _resources(vector: dict[str, int]) -> list[pb.Resource]:
    return [pb.Resource(name=k, value=v) for k, v in sorted(vector.items()) if v]


def _vector(resources: list[pb.Resource]) -> dict[str, int]:
    return {r.name: r.value for r in resources}


def node_message(inventory: Inventory, name: str, owner: str = "") -> pb.Node:
    """One node as `owner` sees it: its pods are ours, everyone else's online load (an
    inventory that keeps each provider's share apart); every provider's pods ours with no owner."""
    node = inventory.nodes[name]
    ours, online = inventory.ours_used.get(name, {}), inventory.online_used.get(name, {})
    if owner:
        mine = inventory.by_owner.get(name, {}).get(owner, {})
        online, ours = quantities.add(online, quantities.add(ours, mine, -1)), mine
    return pb.Node(
        name=node.name,
        ready=node.ready,
        schedulable=node.schedulable,
        taints=[pb.Taint(key=k, value=v, effect=e) for k, v, e in node.taints],
        allocatable=_resources(node.allocatable),
        online_used=_resources(online),
        ours_used=_resources(ours),
        gpu_product=node.gpu_product or "",
        network_pod=node.network_pod or "",
        zone=node.zone or "",
        numa=[pb.NumaZone(name=z.name, available=_resources(z.available)) for z in inventory.numa.get(name, ())],
    )


def apply_node(inventory: Inventory, message: pb.Node) -> None:
    """Put one node, as the agent sees it, into a client-side inventory."""
    name = message.name
    inventory.nodes[name] = NodeRecord(
        name=name,
        ready=message.ready,
        schedulable=message.schedulable,
        taints=tuple((t.key, t.value, t.effect) for t in message.taints),
        allocatable=_vector(list(message.allocatable)),
        gpu_product=message.gpu_product or None,
        network_pod=message.network_pod or None,
        zone=message.zone or None,
    )
    inventory.online_used[name] = _vector(list(message.online_used))
    inventory.ours_used[name] = _vector(list(message.ours_used))
    if message.numa:
        inventory.numa[name] = tuple(NumaZone(z.name, _vector(list(z.available))) for z in message.numa)
    else:
        inventory.numa.pop(name, None)
    inventory.touch(name)


def remove_node(inventory: Inventory, name: str) -> None:
    inventory.nodes.pop(name, None)
    inventory.online_used.pop(name, None)
    inventory.ours_used.pop(name, None)
    inventory.numa.pop(name, None)
    inventory.node_versions.pop(name, None)
    inventory.version += 1


def fingerprint(message: pb.Node) -> bytes:
    """Deterministic bytes of a node message: equal bytes, nothing to send."""
    return bytes(message.SerializeToString(deterministic=True))
