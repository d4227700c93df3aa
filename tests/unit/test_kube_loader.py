"""vkprovider.kube.loader: the kubeconfig loader without kubernetes-asyncio's generated client,
which stays reachable for code that asks for it. Each check runs in a fresh interpreter, since
this one has imported the package already."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
import vkprovider.kube
from vkprovider.kube.access import parse_kubeconfig
generated = ("kubernetes_asyncio.client.models", "kubernetes_asyncio.client.api.")
print(sum(1 for m in sys.modules if m.startswith(generated)))
"""

LATER = """
import vkprovider.kube
from kubernetes_asyncio.client import ApiClient, CoreV1Api, V1Pod
import kubernetes_asyncio
assert V1Pod(metadata=None).to_dict()["kind"] is None
assert callable(CoreV1Api) and ApiClient.__name__ == "ApiClient"
print(kubernetes_asyncio.__version__)
"""


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_loader_does_not_import_the_generated_client() -> None:
    assert _run(PROBE) == "0"


def test_the_generated_client_is_still_there_for_code_that_asks() -> None:
    assert _run(LATER)
