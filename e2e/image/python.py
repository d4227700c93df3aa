"""The image's Python side: the provider's wheel, its dependencies' wheels, and the virtualenv at
/opt/vkprovider that holds them, made by the image's own interpreter under chroot.

Dependencies are pinned to the versions installed in the virtualenv running this (the project's
`.venv`: those the tests run against), found by walking the provider's requirements; their
wheels are downloaded for the image's platform (CPython 3.11, glibc 2.36, never an sdist) into a
cached wheelhouse. pip itself runs from its wheel inside the chroot and is not installed.

The virtualenv is made in two steps so that the dependencies' layer is cached and shared by
every commit: first the dependencies (cached, keyed by the Debian tree and the pins), then, on
every build, the provider's wheel on top of a copy of it. Bytecode is compiled at build time as
unchecked-hash .pyc (PYTHONHASHSEED=0): a read-only root filesystem, nothing to write at start.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from e2e.image import rootfs
from e2e.image.rootfs import PYTHON, Base, ImageError, in_chroot, log

PROJECT = "vkprovider"
VENV = "/opt/vkprovider"
#: bookworm's glibc (2.36): wheels for it or older.
GLIBC_MINOR = 36
PYTHON_VERSION = "3.11"
COMPILE = ("-m", "compileall", "-q", "-j", "0", "--invalidation-mode", "unchecked-hash")


@dataclass(frozen=True, order=True)
class Pin:
    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}=={self.version}"


def project_version(repo: Path) -> str:
    with open(repo / "pyproject.toml", "rb") as f:
        return str(tomllib.load(f)["project"]["version"])


def _machine() -> str:
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(rootfs.debian_arch(), platform.machine())


def runtime_pins() -> list[Pin]:
    """The provider's runtime dependencies (no extras), closed over theirs, at the versions
    installed here, as the image's interpreter would choose them (markers for CPython 3.11 on
    Linux)."""
    try:
        top = importlib.metadata.distribution(PROJECT)
    except importlib.metadata.PackageNotFoundError:
        raise ImageError(f"{PROJECT} is not installed in {sys.prefix}: run this from the project's .venv") from None
    env = {k: str(v) for k, v in default_environment().items()}
    env.update(python_version=PYTHON_VERSION, sys_platform="linux", platform_system="Linux")
    env.update(platform_machine=_machine(), implementation_name="cpython", platform_python_implementation="CPython")
    pins: dict[str, Pin] = {}
    todo: list[tuple[Requirement, str]] = [(Requirement(r), "") for r in top.requires or ()]
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({**env, "extra": extra}):
            continue
        name = canonicalize_name(req.name)
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise ImageError(f"{name} (needed by the image) is not installed in {sys.prefix}") from None
        if name not in pins:
            pins[name] = Pin(name, dist.version)
            todo += [(Requirement(r), "") for r in dist.requires or ()]
        for wanted in req.extras:
            todo += [(Requirement(r), wanted) for r in dist.requires or () if "extra" in r]
    return sorted(pins.values())


def pip_pin() -> Pin:
    """pip, to run from its wheel inside the chroot: the version of the one here."""
    return Pin("pip", importlib.metadata.version("pip"))


def _pip(args: Sequence[str | Path], *, what: str) -> str:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", *map(str, args)]
    return rootfs.run(cmd, what=what)


def ensure_wheels(wheelhouse: Path, pins: Iterable[Pin]) -> dict[Pin, Path]:
    """Each pin's wheel for the image's platform, downloaded into `wheelhouse` when missing."""
    wheelhouse.mkdir(parents=True, exist_ok=True)
    pins = list(pins)
    found = _find_wheels(wheelhouse, pins)
    missing = [pin for pin in pins if pin not in found]
    if missing:
        log(f"downloading {len(missing)} wheels into {wheelhouse}")
        args: list[str | Path] = ["download", "--no-deps", "--only-binary=:all:", "-d", wheelhouse]
        args += [f"--platform={tag}" for tag in _platforms()] + [f"--python-version={PYTHON_VERSION}"]
        args += ["--implementation=cp", f"--abi=cp{PYTHON_VERSION.replace('.', '')}", *map(str, missing)]
        _pip(args, what="pip download")
        found = _find_wheels(wheelhouse, pins)
        if still := [str(pin) for pin in pins if pin not in found]:
            raise ImageError(f"no wheel for {', '.join(still)} in {wheelhouse}")
    return found


def _platforms() -> list[str]:
    """Every manylinux tag the image's glibc satisfies: pip expands only the legacy ones itself."""
    machine = _machine()
    tags = [f"manylinux_2_{minor}_{machine}" for minor in range(GLIBC_MINOR, 4, -1)]
    return tags + [f"manylinux{legacy}_{machine}" for legacy in ("2014", "2010", "1")]


def _find_wheels(wheelhouse: Path, pins: list[Pin]) -> dict[Pin, Path]:
    wanted = {(canonicalize_name(p.name), Version(p.version)): p for p in pins}
    found: dict[Pin, Path] = {}
    for path in sorted(wheelhouse.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        if (pin := wanted.get((name, version))) is not None:
            found.setdefault(pin, path)
    return found


def build_wheel(repo: Path, out: Path, *, epoch: int) -> Path:
    """The provider's wheel, built from a copy of the working tree (files git tracks or would
    track), so that the build leaves nothing in the repository."""
    files = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        capture_output=True,
        check=True,
    ).stdout.decode()
    source = out / "source"
    for name in filter(None, files.split("\0")):
        path = repo / name
        if path.is_file() or path.is_symlink():  # a deleted, not yet staged file is listed too
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, source / name, follow_symlinks=False)
    wheels = out / "wheel"
    env = dict(os.environ, SOURCE_DATE_EPOCH=str(epoch), PYTHONHASHSEED="0")
    cmd: list[str | Path] = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "-q",
        "--no-deps",
        "--no-build-isolation",
        "-w",
        wheels,
        source,
    ]
    rootfs.run(cmd, what="building the provider's wheel", env=env)
    (wheel,) = wheels.glob(f"{PROJECT}-*.whl")
    return wheel


def _stage(work: Path, wheels: Iterable[Path]) -> Path:
    """`/tmp/wheels` inside the chroot tree, holding these wheels."""
    staged = work / "tmp" / "wheels"
    staged.mkdir(parents=True)
    for wheel in wheels:
        shutil.copy2(wheel, staged / wheel.name)
    return staged


def _pip_in_chroot(work: Path, pip_wheel: Path, args: Sequence[str], *, what: str, epoch: int) -> None:
    pip = ["/opt/vkprovider/bin/python", f"/tmp/wheels/{pip_wheel.name}/pip", "--disable-pip-version-check"]
    options = ["install", "--no-index", "--find-links=/tmp/wheels", "--no-compile", "--no-cache-dir"]
    env = {"SOURCE_DATE_EPOCH": str(epoch), "PYTHONDONTWRITEBYTECODE": "1"}
    in_chroot(work, [*pip, *options, "--no-warn-script-location", *args], what=what, env=env)


def deps_key(base: Base, pins: Sequence[Pin], pip: Pin) -> str:
    digest = hashlib.sha256(base.key.encode())
    for pin in (*pins, pip):
        digest.update(f"{pin}\0".encode())
    digest.update(Path(__file__).read_bytes())  # how the virtualenv is made
    return digest.hexdigest()[:16]


def install_deps(base: Base, wheels: dict[Pin, Path], pip: Pin, work: Path, *, epoch: int) -> Path:
    """A virtualenv at /opt/vkprovider holding the pinned dependencies, made in a copy of the
    Debian tree at `work`; returns the virtualenv's directory (inside `work`)."""
    rootfs.copy_tree(base.rootfs, work)
    pins = sorted(pin for pin in wheels if pin != pip)
    staged = _stage(work, wheels.values())
    (staged / "requirements.txt").write_text("".join(f"{pin}\n" for pin in pins))
    in_chroot(work, ["python3", "-m", "venv", "--without-pip", VENV], what="python3 -m venv")
    _pip_in_chroot(work, wheels[pip], ["-r", "/tmp/wheels/requirements.txt"], what="pip install", epoch=epoch)
    in_chroot(work, [f"{VENV}/bin/python", *COMPILE, f"{VENV}/lib"], what="compileall")
    shutil.rmtree(staged)
    venv = work / VENV.lstrip("/")
    record = venv / "image"
    record.mkdir()
    (record / "python-packages.txt").write_text("".join(f"{pin}\n" for pin in pins))
    (record / "debian-packages.txt").write_text(base.packages)
    os.chmod(record / "python-packages.txt", 0o644)
    os.chmod(record / "debian-packages.txt", 0o644)
    return venv


def install_project(
    base: Base, deps_venv: Path, wheel: Path, pip_wheel: Path, work: Path, *, epoch: int
) -> tuple[Path, list[str]]:
    """The provider's wheel installed on top of a copy of the dependencies' virtualenv, in a copy
    of the Debian tree at `work`. Returns the virtualenv's directory and what the install added
    (paths relative to it)."""
    rootfs.copy_tree(base.rootfs, work)
    venv = work / VENV.lstrip("/")
    rootfs.copy_tree(deps_venv, venv)
    before = set(_relative(venv))
    staged = _stage(work, (wheel, pip_wheel))
    version = parse_wheel_filename(wheel.name)[1]
    args = ["--no-deps", f"{PROJECT}=={version}"]
    _pip_in_chroot(work, pip_wheel, args, what=f"pip install {PROJECT}", epoch=epoch)
    shutil.rmtree(staged)
    site = f"lib/{PYTHON}/site-packages"
    new_packages = sorted(
        {p.split("/")[3] for p in set(_relative(venv)) - before if p.startswith(site + "/") and p.count("/") >= 3}
    )
    targets = [f"{VENV}/{site}/{name}" for name in new_packages if (venv / site / name).is_dir()]
    in_chroot(work, [f"{VENV}/bin/python", *COMPILE, *targets], what="compileall")
    return venv, sorted(set(_relative(venv)) - before)


def _relative(root: Path) -> Iterable[str]:
    for directory, dirs, files in os.walk(root):
        rel = os.path.relpath(directory, root)
        for name in dirs + files:
            yield name if rel == "." else f"{rel}/{name}"
