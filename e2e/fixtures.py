"""The lab as a pytest fixture: started once per test session and shared by the end-to-end tests.

Set `VKPROVIDER_LAB_STATE=DIR` to run the tests against a lab already up in DIR (started with
`python -m e2e up --offline-nodes 4 --state DIR`); it is left running afterwards. Otherwise the
fixture starts 3 members x 20 nodes and 4 native offline nodes in a temporary directory and
stops it at the end of the session.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import pytest_asyncio

from e2e import lab as lab_mod
from e2e.state import LabState
from vkprovider.kube import KubeClient, load_kubeconfig

MEMBERS = 3
NODES_PER_MEMBER = 20
OFFLINE_NODES = 4  # native nodes of the offline cluster, for hybrid jobs


@dataclass
class Lab:
    """A running lab as tests see it."""

    state: LabState

    @property
    def state_dir(self) -> Path:
        return self.state.root

    @property
    def members(self) -> list[str]:
        return [name for name, c in self.state.clusters.items() if c.role == "member"]

    def kubeconfig(self, cluster: str) -> Path:
        return self.state.kubeconfig(cluster)

    def client(self, cluster: str) -> KubeClient:
        """A new client for `cluster`; the caller closes it (use `async with`)."""
        return KubeClient(load_kubeconfig(self.kubeconfig(cluster)), user_agent="vkprovider-tests")


@pytest_asyncio.fixture(scope="session", loop_scope="session")
async def lab(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Lab]:
    reuse = os.environ.get("VKPROVIDER_LAB_STATE")
    if reuse:
        state = lab_mod.load_running(Path(reuse))
        if not lab_mod.is_running(state):
            pytest.fail(f"VKPROVIDER_LAB_STATE={reuse} names a lab that is not running")
        yield Lab(state)
        return
    state_dir = tmp_path_factory.mktemp("lab")
    spec = lab_mod.LabSpec(members=MEMBERS, nodes_per_member=NODES_PER_MEMBER, offline_nodes=OFFLINE_NODES)
    state = await lab_mod.up(state_dir, spec)
    try:
        yield Lab(state)
    finally:
        # From disk: tests restart clusters through the CLI functions, which record new PIDs there.
        lab_mod.teardown(lab_mod.load_running(state.root))
