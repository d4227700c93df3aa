"""`vkprovider crds apply`: the MemberCluster CRD (or the ones given) applied to the front end.

Helm installs a chart's `crds/` on the first install and never again: a field added to the CRD
in a later chart (`spec.tenancy`, say) is missing from an upgraded cluster's schema, and the
apiserver prunes it from every MemberCluster written afterwards, silently. The chart runs this
command in a pre-upgrade hook with the CRDs of the chart being installed; an operator who
installs with `--skip-crds` runs it by hand (or applies `federation/crds/` with kubectl).

Server-side apply with the field manager `vkprovider` and `force`: whoever created the CRD
(Helm's install, kubectl), the schema becomes the one given. It then waits until each CRD is
`Established` and its stored versions are served, so a provider started next finds it. Nothing
else is touched; a file that holds anything but CustomResourceDefinitions is refused before any
change.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from vkprovider.kube import ApiError, ClusterAccess, KubeClient, NotFound, load_kubeconfig
from vkprovider.kube.access import KubeconfigError, in_cluster

#: The provider's own CRDs, shipped in the package (the chart's crds/ holds the same files).
OWN = Path(__file__).resolve().parents[1] / "crds"
PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
FIELD_MANAGER = "vkprovider"
POLL = 0.5


class CrdError(Exception):
    """A manifest that is not a set of CRDs, or a CRD the apiserver did not take."""


def add_arguments(sub: Any) -> None:
    crds = sub.add_parser("crds", help="the CRDs vkprovider works with, applied to the front end")
    verbs = crds.add_subparsers(dest="crds_command", required=True)
    apply = verbs.add_parser("apply", help="server-side apply the CRDs and wait until they are established")
    apply.add_argument(
        "-f", "--file", type=Path, action="append", default=[],
        help="a CRD manifest or a directory of them (*.yaml); default: vkprovider's own",
    )  # fmt: skip
    apply.add_argument("--kubeconfig", type=Path, help="front-end kubeconfig; unset: in-cluster")
    apply.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for each CRD to be established")


def manifests(paths: list[Path]) -> list[dict[str, Any]]:
    """Every CRD in the files (directories: their *.yaml, sorted), or CrdError naming the file."""
    files: list[Path] = []
    for path in paths or [OWN]:
        if path.is_dir():
            files.extend(sorted(path.glob("*.yaml")))
        elif path.is_file():
            files.append(path)
        else:
            raise CrdError(f"{path}: no such file or directory")
    crds: list[dict[str, Any]] = []
    for file in files:
        try:
            docs = [d for d in yaml.safe_load_all(file.read_text()) if d is not None]
        except yaml.YAMLError as exc:
            raise CrdError(f"{file}: not YAML: {exc}") from None
        for doc in docs:
            kind = doc.get("kind") if isinstance(doc, dict) else None
            api = doc.get("apiVersion") if isinstance(doc, dict) else None
            if kind != "CustomResourceDefinition" or api != "apiextensions.k8s.io/v1":
                raise CrdError(f"{file}: holds a {api}/{kind}, not an apiextensions.k8s.io/v1 CustomResourceDefinition")
            if not doc.get("metadata", {}).get("name"):
                raise CrdError(f"{file}: a CustomResourceDefinition without metadata.name")
            crds.append(doc)
    if not crds:
        raise CrdError(f"no CustomResourceDefinition in {', '.join(map(str, files)) or 'nothing'}")
    return crds


def established(crd: dict[str, Any]) -> bool:
    """Established, and the schema applied: what a client relies on once apply returns."""
    conditions = {c.get("type"): c.get("status") for c in (crd.get("status") or {}).get("conditions") or []}
    return conditions.get("Established") == "True" and conditions.get("NamesAccepted") == "True"


async def apply(access: ClusterAccess, crds: list[dict[str, Any]], *, timeout: float) -> list[str]:
    """Each CRD applied and established; the lines to print."""
    said: list[str] = []
    async with KubeClient(access, user_agent="vkprovider-crds") as client:
        for crd in crds:
            name = crd["metadata"]["name"]
            body = {k: v for k, v in crd.items() if k != "status"}
            try:
                before: dict[str, Any] | None = await client.get(f"{PATH}/{name}")
            except NotFound:
                before = None
            except ApiError as exc:
                raise CrdError(f"{name}: not readable: {exc}") from None
            try:
                after = await client.patch(
                    f"{PATH}/{name}", body, patch_type="apply", field_manager=FIELD_MANAGER, force=True
                )
            except ApiError as exc:
                raise CrdError(f"{name}: not applied: {exc}") from None
            deadline = time.monotonic() + timeout
            while not established(after):
                if time.monotonic() > deadline:
                    raise CrdError(f"{name}: applied, but not established within {timeout:.0f}s")
                await asyncio.sleep(POLL)
                after = await client.get(f"{PATH}/{name}")
            if before is None:
                verdict = "created"
            elif before.get("spec") == after.get("spec"):
                verdict = "unchanged"
            else:
                verdict = "updated"
            said.append(f"{name}: {verdict}, established")
    return said


def main(args: argparse.Namespace) -> int:
    try:
        crds = manifests(args.file)
        access = load_kubeconfig(args.kubeconfig) if args.kubeconfig else in_cluster()
    except (CrdError, KubeconfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        said = asyncio.run(apply(access, crds, timeout=args.timeout))
    except CrdError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in said:
        print(line)
    return 0
