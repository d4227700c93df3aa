"""Pure construction of apiserver URL paths (no I/O), so requests can be built and tested alone."""

from __future__ import annotations

from urllib.parse import quote


def group_version_prefix(api_version: str) -> str:
    """`v1` lives under /api, every named group under /apis."""
    return "/api/v1" if api_version == "v1" else f"/apis/{api_version}"


def resource_path(
    api_version: str,
    plural: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
) -> str:
    """The path of a collection, an object or one of its subresources."""
    parts = [group_version_prefix(api_version)]
    if namespace is not None:
        parts.append(f"namespaces/{quote(namespace, safe='')}")
    parts.append(plural)
    if name is not None:
        parts.append(quote(name, safe=""))
        if subresource is not None:
            parts.append(subresource)
    return "/".join(parts)
