"""An OCI layout archive (what `make image` writes) unpacked into a root directory, as a container
runtime prepares a container's root filesystem: the one manifest the index names, every blob
checked against its digest, the layers applied in order (each over the ones below, whiteouts
honoured), and the image's configuration returned for whoever runs it (e2e.image.sandbox).

It is here rather than in a test because several tests run the image: test_image runs its
entry point, e2e.podrun runs the chart's pods from it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from e2e.image.oci import LAYER_TYPE
from e2e.image.rootfs import ImageError

#: A layer's entry that deletes a lower layer's file of the same name without the prefix; the
#: opaque one empties its directory of what lower layers put there (OCI image spec, layer.md).
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


@dataclass(frozen=True)
class Unpacked:
    """The root filesystem and what the image says about running it."""

    root: Path
    digest: str  # the manifest's, as the archive's index names it
    #: The configuration's `config`: User, Entrypoint, Cmd, Env, WorkingDir.
    config: dict[str, Any]


def unpack(archive: Path, root: Path) -> Unpacked:
    """Unpacks the image in `archive` (an OCI layout as a tar) into `root` (made, and empty)."""
    root.mkdir(parents=True, exist_ok=True)
    if any(root.iterdir()):
        raise ImageError(f"{root}: not empty; unpack into a new directory")
    with tarfile.open(archive) as layout:
        if json.loads(_member(layout, "oci-layout")) != {"imageLayoutVersion": "1.0.0"}:
            raise ImageError(f"{archive}: not an OCI image layout 1.0.0")
        manifests = json.loads(_member(layout, "index.json"))["manifests"]
        if len(manifests) != 1:
            raise ImageError(f"{archive}: the index names {len(manifests)} manifests, not one")
        digest = manifests[0]["digest"]
        manifest = json.loads(_blob(layout, digest))
        config = json.loads(_blob(layout, manifest["config"]["digest"]))
        if len(manifest["layers"]) != len(config["rootfs"]["diff_ids"]):
            raise ImageError(f"{archive}: {len(manifest['layers'])} layers for {len(config['rootfs']['diff_ids'])}")
        for layer in manifest["layers"]:
            if layer["mediaType"] != LAYER_TYPE:
                raise ImageError(f"{archive}: layer {layer['digest']} is {layer['mediaType']}, not {LAYER_TYPE}")
            _apply(_blob(layout, layer["digest"]), root)
    return Unpacked(root=root, digest=digest, config=dict(config["config"]))


def _member(layout: tarfile.TarFile, name: str) -> bytes:
    member = layout.extractfile(name)
    if member is None:
        raise ImageError(f"{name}: missing from the layout")
    return member.read()


def _blob(layout: tarfile.TarFile, digest: str) -> bytes:
    data = _member(layout, "blobs/sha256/" + digest.removeprefix("sha256:"))
    if "sha256:" + hashlib.sha256(data).hexdigest() != digest:
        raise ImageError(f"blob {digest}: its content has another digest")
    return data


def _apply(layer: bytes, root: Path) -> None:
    """One gzipped layer over `root`: its whiteouts first (they name what lower layers made),
    then its files, with the owners and modes it records (GNU tar, as root; it follows the
    directory links lower layers made, which is safe for images built here, not for any)."""
    names = _tar(["-tz"], layer, root).splitlines()
    for name in names:
        path = PurePosixPath(name.removeprefix("./"))
        if path.name == OPAQUE:
            directory = inside(root, str(path.parent))
            for child in directory.iterdir() if directory.is_dir() else ():
                _remove(child)
        elif path.name.startswith(WHITEOUT):
            _remove(inside(root, str(path.parent)) / path.name.removeprefix(WHITEOUT))
    _tar(["-xz", "--numeric-owner", "--same-permissions", f"--exclude={WHITEOUT}*"], layer, root)


def _tar(args: list[str], data: bytes, root: Path) -> str:
    result = subprocess.run(["tar", *args, "-C", str(root)], input=data, capture_output=True, check=False)
    if result.returncode != 0:
        raise ImageError(f"tar {' '.join(args)}: {result.stderr.decode(errors='replace').strip()}")
    return result.stdout.decode()


def inside(root: Path, path: str, *, hops: int = 40) -> Path:
    """The host path of the container's `path` in the tree at `root`, symbolic links followed
    as the container sees them (an absolute target starts again at `root`, `..` stops there):
    never a path outside `root`, whatever the image's links say. A runtime resolves its mount
    points so (runc's securejoin)."""
    pending = [p for p in path.split("/") if p not in ("", ".")]
    resolved: list[str] = []
    while pending:
        part = pending.pop(0)
        if part == "..":
            resolved = resolved[:-1]
            continue
        candidate = root.joinpath(*resolved, part)
        if not candidate.is_symlink():
            resolved.append(part)
            continue
        hops -= 1
        if hops < 0:
            raise ImageError(f"{path}: too many symbolic links in the image")
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = []
        pending = [p for p in target.split("/") if p not in ("", ".")] + pending
    return root.joinpath(*resolved)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.is_symlink() or path.exists():
        os.unlink(path)
