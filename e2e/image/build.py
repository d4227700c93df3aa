"""The image put together: the three layers (cached where they can be), its configuration (user,
entry point, environment for a read-only root filesystem) and the OCI archive.

The configuration matches the chart's pod (charts/vkprovider/templates/deployment.yaml): user
65532:65532, a read-only root filesystem and an emptyDir at /tmp, which is therefore HOME and
the working directory; PYTHONDONTWRITEBYTECODE because the bytecode is already there.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from e2e.binaries import cache_root
from e2e.image import oci, python, rootfs
from e2e.image.rootfs import BASE_EPOCH, GID, HOME, SKIP_BELOW, UID, log

REPO = Path(__file__).resolve().parents[2]
ENV = (
    f"PATH={python.VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    f"HOME={HOME}",
    "LANG=C.UTF-8",
    "PYTHONDONTWRITEBYTECODE=1",
    "PYTHONUNBUFFERED=1",
)
ENTRYPOINT = ("vkprovider",)
WORKDIR = HOME
STALE_DAYS = 7


@dataclass(frozen=True)
class Built:
    path: Path
    digest: str  # the manifest's: what a registry names the image by
    size: int  # of the archive
    layers: tuple[oci.Layer, ...]


def image_cache() -> Path:
    return cache_root() / "image"


def source_epoch(repo: Path) -> int:
    """SOURCE_DATE_EPOCH when set, else the time of the commit checked out."""
    if os.environ.get("SOURCE_DATE_EPOCH"):
        return int(os.environ["SOURCE_DATE_EPOCH"])
    out = subprocess.run(
        ["git", "-C", str(repo), "log", "-1", "--format=%ct"], check=False, capture_output=True, text=True
    )
    return int(out.stdout.strip()) if out.returncode == 0 and out.stdout.strip() else BASE_EPOCH


def _revision(repo: Path) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), "describe", "--always", "--dirty", "--abbrev=40"],
        check=False,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip() if out.returncode == 0 else "unknown"


def _cached_layer(directory: Path, build: Callable[[Path], oci.Layer]) -> oci.Layer:
    """The layer saved in `directory` (layer.tar.gz, layer.json), written first if missing."""
    blob, meta = directory / "layer.tar.gz", directory / "layer.json"
    if blob.exists() and meta.exists():
        return oci.Layer.from_json(blob, json.loads(meta.read_text()))
    layer = build(blob)
    meta.write_text(json.dumps(layer.to_json()))
    return layer


def build(*, repo: Path = REPO, refresh: bool = False) -> Built:
    """Builds the image into the cache; returns where, and its digest."""
    rootfs.require_root()
    cache = image_cache()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time: they share the cache's work dirs
        return _build(repo, cache, refresh=refresh)


def _build(repo: Path, cache: Path, *, refresh: bool) -> Built:
    started = time.monotonic()
    version, epoch = python.project_version(repo), source_epoch(repo)
    base = rootfs.ensure_base(cache, refresh=refresh)

    def base_layer(out: Path) -> oci.Layer:
        log("writing the Debian layer")
        return oci.write_layer(rootfs_entries(base.rootfs), out, epoch=BASE_EPOCH)

    layers = [_cached_layer(base.dir, base_layer)]

    pins, pip = python.runtime_pins(), python.pip_pin()
    wheels = python.ensure_wheels(cache / "wheels", [*pins, pip])
    deps_dir = cache / f"python-{python.deps_key(base, pins, pip)}"
    layers.append(_deps_layer(base, wheels, pip, cache, deps_dir))

    log(f"building and installing {python.PROJECT} {version}")
    work = _fresh(cache / "work")
    wheel = python.build_wheel(repo, work / "wheel", epoch=epoch)
    venv, added = python.install_project(base, deps_dir / "venv", wheel, wheels[pip], work / "root", epoch=epoch)
    prefix = python.VENV.lstrip("/")
    entries = [(f"{prefix}/{rel}", venv / rel) for rel in added]
    layers.append(oci.write_layer(entries, work / "project.tar.gz", epoch=epoch))

    _prune(cache, keep={base.dir.name, deps_dir.name})
    image = oci.assemble(layers, _config(version, epoch, repo), _annotations(version, epoch, repo, base.packages))
    out = cache / f"vkprovider-{version}.oci.tar"
    oci.write_archive(image, out, ref_name=version, epoch=epoch)
    shutil.rmtree(work)
    log(f"built {out} ({out.stat().st_size / 2**20:.0f} MiB, {image.digest}) in {time.monotonic() - started:.0f}s")
    return Built(path=out, digest=image.digest, size=out.stat().st_size, layers=tuple(layers))


def _deps_layer(
    base: rootfs.Base, wheels: dict[python.Pin, Path], pip: python.Pin, cache: Path, deps_dir: Path
) -> oci.Layer:
    """The dependencies' virtualenv (deps_dir/venv) and its layer, made unless cached."""
    if not (deps_dir / "layer.json").exists():
        log(f"installing {len(wheels) - 1} Python packages into a virtualenv")
        work = _fresh(cache / "work")
        venv = python.install_deps(base, wheels, pip, work / "root", epoch=BASE_EPOCH)
        tmp = _fresh(cache / f".tmp-{deps_dir.name}")
        venv.rename(tmp / "venv")
        prefix = python.VENV.lstrip("/")
        _cached_layer(tmp, lambda out: oci.write_layer(oci.walk(tmp / "venv", prefix), out, epoch=BASE_EPOCH))
        shutil.rmtree(deps_dir, ignore_errors=True)
        tmp.rename(deps_dir)
        shutil.rmtree(work)
    return oci.Layer.from_json(deps_dir / "layer.tar.gz", json.loads((deps_dir / "layer.json").read_text()))


def _prune(cache: Path, *, keep: set[str]) -> None:
    """Marks the trees this build used, and removes those no build used for `STALE_DAYS` (a
    tree is a few hundred MiB; another checkout may still use an older one)."""
    now = time.time()
    for entry in cache.iterdir():
        if not entry.name.startswith(("base-", "python-")) or not entry.is_dir():
            continue
        used = entry / "used"
        if entry.name in keep:
            used.touch()
        elif used.exists() and now - used.stat().st_mtime > STALE_DAYS * 86400:
            log(f"removing {entry}, unused for {STALE_DAYS} days")
            shutil.rmtree(entry)


def rootfs_entries(root: Path) -> list[tuple[str, Path]]:
    return list(oci.walk(root, "", skip_below=SKIP_BELOW))


def _fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


def _created(epoch: int) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _labels(version: str, epoch: int, repo: Path) -> dict[str, str]:
    return {
        "org.opencontainers.image.title": "vkprovider",
        "org.opencontainers.image.description": "A virtual kubelet pooling member clusters",
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.revision": _revision(repo),
        "org.opencontainers.image.created": _created(epoch),
        "org.opencontainers.image.licenses": "Apache-2.0",
        "org.opencontainers.image.base.name": f"debian:{rootfs.SUITE} (mmdebstrap, variant essential)",
    }


def _config(version: str, epoch: int, repo: Path) -> dict[str, object]:
    return {
        "architecture": rootfs.debian_arch(),
        "os": "linux",
        "created": _created(epoch),
        "config": {
            "User": f"{UID}:{GID}",
            "Entrypoint": list(ENTRYPOINT),
            "Env": list(ENV),
            "WorkingDir": WORKDIR,
            "Labels": _labels(version, epoch, repo),
        },
        "history": [
            {"created": _created(BASE_EPOCH), "created_by": f"mmdebstrap {rootfs.SUITE} + user {UID}:{GID}"},
            {"created": _created(BASE_EPOCH), "created_by": f"python3 -m venv {python.VENV} + pinned dependencies"},
            {"created": _created(epoch), "created_by": f"pip install vkprovider=={version}"},
        ],
    }


def _annotations(version: str, epoch: int, repo: Path, packages: str) -> dict[str, str]:
    """The labels, and the Debian packages' versions (an input the repository does not pin)."""
    debian = ",".join("=".join(line.split()[:2]) for line in packages.splitlines())
    return {**_labels(version, epoch, repo), "io.vkprovider.image.debian-packages": debian}
