"""OCI image layout, written directly: layers as reproducible gzipped tars, and the layout
(oci-layout, index.json, blobs) packed as one tar (`skopeo copy oci-archive:…`, `crane push`).

Reproducible by construction: entries sorted by name, numeric owners as in the tree (no user
names), timestamps clamped to an epoch (a file older than it keeps its own: a package's files
keep the package's time), hard links stored as links to the first name in sorted order, gzip
without a name and with mtime 0, JSON with sorted keys and no spaces. Device nodes, FIFOs and
sockets are left out: a runtime provides /dev.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
GZIP_LEVEL = 6  # zlib's default: level 9 takes three times as long for 1% less


@dataclass(frozen=True)
class Layer:
    """A gzipped layer tar in a file: its digest (of the gzip) and diff_id (of the tar)."""

    path: Path
    digest: str
    diff_id: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "diff_id": self.diff_id, "size": self.size}

    @classmethod
    def from_json(cls, path: Path, data: dict[str, Any]) -> Layer:
        return cls(path=path, digest=data["digest"], diff_id=data["diff_id"], size=data["size"])


def canonical_json(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def walk(root: Path, prefix: str, *, skip_below: frozenset[str] = frozenset()) -> Iterator[tuple[str, Path]]:
    """(name in the layer, path) of `root` (named `prefix`, or nothing when "") and everything
    under it, symlinks not followed; the contents of the directories named in `skip_below`
    (names in the layer, e.g. "dev") are left out, the directories themselves kept."""
    if prefix:
        yield prefix, root
    if prefix in skip_below:
        return
    with os.scandir(root) as entries:
        children = sorted(entries, key=lambda e: e.name)
    for entry in children:
        name = f"{prefix}/{entry.name}" if prefix else entry.name
        if entry.is_dir(follow_symlinks=False):
            yield from walk(Path(entry.path), name, skip_below=skip_below)
        else:
            yield name, Path(entry.path)


class _Hashing(io.RawIOBase):
    """A write-only stream that hashes and counts what passes through to `sink`."""

    def __init__(self, sink: BinaryIO) -> None:
        self.sink = sink
        self.hash = hashlib.sha256()
        self.size = 0

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.hash.update(view)
        self.sink.write(view)
        self.size += len(view)
        return len(view)


def _tarinfo(name: str, path: Path, st: os.stat_result, epoch: int) -> tarfile.TarInfo | None:
    info = tarfile.TarInfo(name)
    info.mode = stat.S_IMODE(st.st_mode)
    info.uid, info.gid = st.st_uid, st.st_gid
    info.uname = info.gname = ""
    info.mtime = min(int(st.st_mtime), epoch)
    if stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
    elif stat.S_ISREG(st.st_mode):
        info.type = tarfile.REGTYPE
        info.size = st.st_size
    else:
        return None
    return info


def write_layer(entries: Iterable[tuple[str, Path]], out: Path, *, epoch: int) -> Layer:
    """The named files as one gzipped tar at `out`, entries sorted by name."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    first_of_inode: dict[tuple[int, int], str] = {}
    with open(tmp, "wb") as raw:
        compressed = _Hashing(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=compressed, mtime=0, compresslevel=GZIP_LEVEL) as gz:
            plain = _Hashing(gz)  # type: ignore[arg-type]  # GzipFile is a binary stream
            with tarfile.open(fileobj=plain, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for name, path in sorted(entries):
                    st = path.lstat()
                    info = _tarinfo(name, path, st, epoch)
                    if info is None:
                        continue
                    if info.type == tarfile.REGTYPE and st.st_nlink > 1:
                        first = first_of_inode.setdefault((st.st_dev, st.st_ino), name)
                        if first != name:
                            info.type, info.linkname, info.size = tarfile.LNKTYPE, first, 0
                    if info.type == tarfile.REGTYPE:
                        with open(path, "rb") as f:
                            tar.addfile(info, f)
                    else:
                        tar.addfile(info)
    tmp.rename(out)
    return Layer(
        path=out,
        digest="sha256:" + compressed.hash.hexdigest(),
        diff_id="sha256:" + plain.hash.hexdigest(),
        size=compressed.size,
    )


@dataclass(frozen=True)
class Image:
    """An image's parts as blobs: the manifest is what a registry names by digest."""

    manifest: bytes
    config: bytes
    layers: tuple[Layer, ...]

    @property
    def digest(self) -> str:
        return sha256(self.manifest)


def assemble(layers: Iterable[Layer], config: dict[str, Any], annotations: dict[str, str]) -> Image:
    """The config (with the layers' diff_ids) and the manifest naming them."""
    layers = tuple(layers)
    config = dict(config, rootfs={"type": "layers", "diff_ids": [layer.diff_id for layer in layers]})
    config_blob = canonical_json(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": sha256(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": layer.digest, "size": layer.size} for layer in layers],
        "annotations": annotations,
    }
    return Image(manifest=canonical_json(manifest), config=config_blob, layers=layers)


def write_archive(image: Image, out: Path, *, ref_name: str, epoch: int) -> None:
    """The image as an OCI layout packed in one tar at `out` (written aside, then renamed)."""
    index = {
        "schemaVersion": 2,
        "mediaType": INDEX_TYPE,
        "manifests": [
            {
                "mediaType": MANIFEST_TYPE,
                "digest": image.digest,
                "size": len(image.manifest),
                "annotations": {"org.opencontainers.image.ref.name": ref_name},
            }
        ],
    }
    blobs: dict[str, bytes | Path] = {image.digest: image.manifest, sha256(image.config): image.config}
    for layer in image.layers:
        blobs[layer.digest] = layer.path
    files: dict[str, bytes | Path] = {
        "oci-layout": canonical_json({"imageLayoutVersion": "1.0.0"}),
        "index.json": canonical_json(index),
    }
    for digest, blob in blobs.items():
        files["blobs/sha256/" + digest.removeprefix("sha256:")] = blob
    tmp = out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in ("blobs", "blobs/sha256"):
            tar.addfile(_archive_info(name, tarfile.DIRTYPE, 0o755, 0, epoch))
        for name in sorted(files):
            content = files[name]
            if isinstance(content, bytes):
                tar.addfile(_archive_info(name, tarfile.REGTYPE, 0o644, len(content), epoch), io.BytesIO(content))
            else:
                with open(content, "rb") as f:
                    size = os.fstat(f.fileno()).st_size
                    tar.addfile(_archive_info(name, tarfile.REGTYPE, 0o644, size, epoch), f)
    tmp.rename(out)


def _archive_info(name: str, kind: bytes, mode: int, size: int, epoch: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.mtime = kind, mode, size, epoch
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info
