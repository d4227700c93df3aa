"""kubernetes-asyncio's kubeconfig loader and exec plugin runner, without the rest of the package.

They are all we use of kubernetes-asyncio, but importing any part of it runs the package's
`__init__`, which imports its whole generated client (every API and model class): 0.2-0.4 s at
each start and 35 MB of RSS for the life of the process, a third of an idle provider's memory.
The loader itself needs only `client.Configuration`. So, unless kubernetes-asyncio is imported
already, its top package and its `client` package are registered as deferred modules first:
each runs its real `__init__` on the first lookup of a name it does not have yet, so code that
does use the generated client still gets all of it, only later.
"""

from __future__ import annotations

import importlib.util
import sys
import types
from typing import Any

PACKAGE = "kubernetes_asyncio"
CLIENT = "kubernetes_asyncio.client"


class _Deferred(types.ModuleType):
    """A package whose own `__init__` runs when a name it lacks is first looked up."""

    def __getattr__(self, name: str) -> Any:
        if self.__dict__.get("_deferred_ran"):
            raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")
        self.__dict__["_deferred_ran"] = True
        spec = self.__spec__
        assert spec is not None and spec.loader is not None
        spec.loader.exec_module(self)
        return getattr(self, name)


def _defer(name: str) -> types.ModuleType:
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None or spec.submodule_search_locations is None:
        raise ImportError(f"{name} is not an importable package")
    module = _Deferred(name)
    module.__spec__, module.__loader__, module.__file__ = spec, spec.loader, spec.origin
    module.__path__ = list(spec.submodule_search_locations)
    module.__package__ = name
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def _api_client(*args: Any, **kwargs: Any) -> Any:
    """Stands in for `client.ApiClient`, which the loader names but we never call."""
    return importlib.import_module(f"{CLIENT}.api_client").ApiClient(*args, **kwargs)


def _register() -> None:
    if PACKAGE in sys.modules:
        return
    _defer(PACKAGE)
    client = _defer(CLIENT)
    configuration = importlib.import_module(f"{CLIENT}.configuration").Configuration
    client.__dict__.update(Configuration=configuration, ApiClient=_api_client)


_register()

# After _register, on purpose: these imports must find the deferred packages.
from kubernetes_asyncio.config.config_exception import ConfigException  # noqa: E402
from kubernetes_asyncio.config.dateutil import parse_rfc3339  # noqa: E402
from kubernetes_asyncio.config.exec_provider import ExecProvider  # noqa: E402
from kubernetes_asyncio.config.kube_config import ConfigNode, FileOrData, KubeConfigLoader  # noqa: E402

__all__ = ["ConfigException", "ConfigNode", "ExecProvider", "FileOrData", "KubeConfigLoader", "parse_rfc3339"]
