"""Loopback ports for the lab: a deterministic plan from a base port, and checks that each is free.

A fixed plan (`--port-base`) makes a lab's addresses predictable; without one, the lab looks for
a base whose whole block is free.
"""

from __future__ import annotations

import random
import socket
from dataclasses import dataclass

#: Ports per cluster: apiserver, scheduler, controller manager, kwok, metrics-server.
PORTS_PER_CLUSTER = 5
ETCD_PORTS = 2  # client, peer


class PortBusy(RuntimeError):
    """A port the lab needs is taken by another process."""


@dataclass(frozen=True, kw_only=True)
class ClusterPorts:
    apiserver: int
    scheduler: int
    controller_manager: int
    kwok: int
    metrics_server: int


@dataclass(frozen=True, kw_only=True)
class PortPlan:
    etcd_client: int
    etcd_peer: int
    clusters: dict[str, ClusterPorts]

    def labelled(self) -> list[tuple[int, str]]:
        out = [(self.etcd_client, "etcd client"), (self.etcd_peer, "etcd peer")]
        for name, ports in self.clusters.items():
            out += [
                (ports.apiserver, f"{name} kube-apiserver"),
                (ports.scheduler, f"{name} kube-scheduler"),
                (ports.controller_manager, f"{name} kube-controller-manager"),
                (ports.kwok, f"{name} kwok"),
                (ports.metrics_server, f"{name} metrics-server"),
            ]
        return out


def plan(base: int, cluster_names: list[str]) -> PortPlan:
    """Pure: the ports of every process, laid out from `base` upwards."""
    clusters = {}
    for index, name in enumerate(cluster_names):
        first = base + ETCD_PORTS + index * PORTS_PER_CLUSTER
        clusters[name] = ClusterPorts(
            apiserver=first,
            scheduler=first + 1,
            controller_manager=first + 2,
            kwok=first + 3,
            metrics_server=first + 4,
        )
    return PortPlan(etcd_client=base, etcd_peer=base + 1, clusters=clusters)


def block_size(cluster_count: int) -> int:
    return ETCD_PORTS + cluster_count * PORTS_PER_CLUSTER


def is_free(port: int, *, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def check_free(port_plan: PortPlan) -> None:
    for port, label in port_plan.labelled():
        if not is_free(port):
            raise PortBusy(
                f"port {port} on 127.0.0.1 is in use (needed for {label}); free it or pass another --port-base"
            )


def find_base(cluster_count: int, *, low: int = 20000, high: int = 32000, attempts: int = 200) -> int:
    """A base port whose whole block is free now (below the ephemeral range, so rarely taken)."""
    size = block_size(cluster_count)
    rng = random.Random()
    for _ in range(attempts):
        base = rng.randrange(low, high - size)
        if all(is_free(port) for port in range(base, base + size)):
            return base
    raise PortBusy(f"found no block of {size} free ports between {low} and {high}")


def listen_port(*, low: int = 10000, high: int = 20000, attempts: int = 200) -> int:
    """A port free now on every address, for a process a test starts (a provider's kubelet or
    plain port). Not one the kernel hands out (bind to port 0): those come from the ephemeral
    range, where any outgoing connection may take the same number as its local port before the
    process binds it (a provider then failed with "address already in use" in a full run).
    Below the lab's band, so a lab started meanwhile does not take it either."""
    rng = random.Random()
    for _ in range(attempts):
        port = rng.randrange(low, high)
        if is_free(port, host="0.0.0.0"):
            return port
    raise PortBusy(f"found no free port between {low} and {high}")
