"""The one package that talks to a kube-apiserver.

API objects travel as raw dicts (JSON as decoded): typed client models are too slow for watches
of thousands of pods. Everything above this package catches our own error classes
(`vkprovider.kube.errors`), never aiohttp's or the client library's.
"""

from vkprovider.kube.access import ClusterAccess, load_kubeconfig
from vkprovider.kube.client import KubeClient, WatchEvent, WriteFence
from vkprovider.kube.errors import (
    AlreadyExists,
    ApiError,
    Conflict,
    Fenced,
    Forbidden,
    Gone,
    Invalid,
    NoCredentials,
    NotFound,
    ServerError,
    TooManyRequests,
    Unauthorized,
    Unreachable,
)
from vkprovider.kube.namespaces import ensure_namespace, wait_for_account
from vkprovider.kube.paths import resource_path
from vkprovider.kube.upsert import create_or_replace

__all__ = [
    "AlreadyExists",
    "ApiError",
    "ClusterAccess",
    "Conflict",
    "Fenced",
    "Forbidden",
    "Gone",
    "Invalid",
    "KubeClient",
    "NoCredentials",
    "NotFound",
    "ServerError",
    "TooManyRequests",
    "Unauthorized",
    "Unreachable",
    "WatchEvent",
    "WriteFence",
    "create_or_replace",
    "ensure_namespace",
    "load_kubeconfig",
    "resource_path",
    "wait_for_account",
]
