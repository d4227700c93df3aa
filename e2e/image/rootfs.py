"""The image's Debian: a minimal bookworm tree made by mmdebstrap from the Debian archive (no
registry base image, no daemon), with python3, ca-certificates and the image's user.

`essential` variant: only Essential packages and what python3, ca-certificates and libstdc++6
need (no apt: nothing is installed in a running image); merged /usr without the `usrmerge`
package (and its perl). Manual pages, docs (but their copyright files) and translations are
left out.
The standard library is recompiled to unchecked-hash bytecode, so that the interpreter never
looks at source timestamps (the layer clamps them) and never needs to write a .pyc.

Made as root (mmdebstrap's root mode, then chroot), cached by what determines it: the suite,
the package list, the options, the architecture. The archive moves on (security updates): the
cache keeps the first result until `--refresh` or a change here, and the packages' versions are
recorded beside it (and in the image, /opt/vkprovider/image/debian-packages.txt).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

SUITE = "bookworm"
#: libstdc++6: grpcio's extension links it (manylinux allows it; the essential set lacks it).
PACKAGES = ("python3", "ca-certificates", "libstdc++6")
#: merged /usr the way debootstrap makes it (symlinks, then `usr-is-merged`), not by `usrmerge`,
#: which would bring perl.
MERGED_USR_HOOKS = Path("/usr/share/mmdebstrap/hooks/merged-usr")
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
)
#: The image's user, also the chart's `runAsUser`/`runAsGroup`. Its home is the one writable place.
USER, UID, GID, HOME = "vkprovider", 65532, 65532, "/tmp"
#: Timestamp of the Debian tree and of the dependencies' layer (see e2e.image): a constant, so
#: that their digests depend on their contents only.
BASE_EPOCH = 1735689600  # 2025-01-01T00:00:00Z
#: Below these the layer keeps the directories but not their contents (a runtime mounts them).
SKIP_BELOW = frozenset({"dev", "proc", "sys"})
PYTHON = "python3.11"


class ImageError(RuntimeError):
    """The image cannot be built here, or a step of it failed."""


def log(message: str) -> None:
    print(f"[image] {message}", file=sys.stderr, flush=True)


def run(cmd: Sequence[str | Path], *, what: str, env: Mapping[str, str] | None = None) -> str:
    """Runs a build step; on failure, raises with the tail of its output."""
    result = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, check=False, env=dict(env) if env else None
    )
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-25:])
        raise ImageError(f"{what} failed (exit status {result.returncode}):\n{tail}")
    return result.stdout


def in_chroot(root: Path, argv: Sequence[str], *, what: str, env: Mapping[str, str] | None = None) -> str:
    """`argv` run inside the tree at `root` (as root, with a clean environment)."""
    base = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}
    assignments = [f"{k}={v}" for k, v in {**base, **(env or {})}.items()]
    return run(["chroot", root, "/usr/bin/env", "-i", *assignments, *argv], what=what)


def require_root() -> None:
    if os.geteuid() != 0:
        raise ImageError("building the image needs root (mmdebstrap's root mode and chroot)")


def ensure_mmdebstrap() -> None:
    """mmdebstrap from Debian's archive, installed with apt-get when missing."""
    if shutil.which("mmdebstrap"):
        return
    log("installing mmdebstrap with apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run(["apt-get", "update", "-qq"], what="apt-get update", env=env)
    run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "mmdebstrap"], what="apt-get install", env=env)


def debian_arch() -> str:
    return run(["dpkg", "--print-architecture"], what="dpkg --print-architecture").strip()


@dataclass(frozen=True)
class Base:
    """The cached Debian tree: `rootfs`, and its packages as `name version arch` lines."""

    key: str
    dir: Path

    @property
    def rootfs(self) -> Path:
        return self.dir / "rootfs"

    @property
    def packages(self) -> str:
        return (self.dir / "packages.txt").read_text()


def base_key(arch: str) -> str:
    digest = hashlib.sha256()
    for part in (SUITE, arch, *PACKAGES, *DPKG_OPTIONS, USER, str(UID), str(GID), HOME, str(BASE_EPOCH), PYTHON):
        digest.update(part.encode() + b"\0")
    digest.update(Path(__file__).read_bytes())  # how the tree is made
    return f"{SUITE}-{arch}-{digest.hexdigest()[:12]}"


def ensure_base(cache: Path, *, refresh: bool = False) -> Base:
    """The Debian tree, made (about half a minute) unless cached."""
    arch = debian_arch()
    key = base_key(arch)
    base = Base(key=key, dir=cache / f"base-{key}")
    done = base.dir / "done"
    if done.exists() and not refresh:
        return base
    ensure_mmdebstrap()
    started = time.monotonic()
    tmp = cache / f".tmp-base-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    log(f"making Debian {SUITE} ({arch}) with {', '.join(PACKAGES)} from the Debian archive")
    cmd: list[str | Path] = ["mmdebstrap", "--mode=root", "--variant=essential", f"--architectures={arch}"]
    cmd += [f"--include={','.join(PACKAGES)}", *(f"--dpkgopt={opt}" for opt in DPKG_OPTIONS)]
    cmd += [f"--hook-dir={MERGED_USR_HOOKS}"]
    # mmdebstrap copies the host's; they would make the tree differ from host to host.
    cmd += ['--customize-hook=rm -f "$1/etc/resolv.conf" "$1/etc/hostname"']
    cmd += [SUITE, tmp / "rootfs"]
    run(cmd, what="mmdebstrap", env=dict(os.environ, SOURCE_DATE_EPOCH=str(BASE_EPOCH)))
    rootfs = tmp / "rootfs"
    # apt's empty cache and lists: no apt in the image, and their `partial` directories belong
    # to root or to _apt depending on whether _apt could reach the cache directory.
    for leftover in ("var/cache/apt", "var/lib/apt"):
        shutil.rmtree(rootfs / leftover)
    _add_user(rootfs)
    log("compiling the standard library to unchecked-hash bytecode")
    compile_cmd = ["python3", "-m", "compileall", "-q", "-f", "-j", "0", "--invalidation-mode", "unchecked-hash"]
    in_chroot(rootfs, [*compile_cmd, f"/usr/lib/{PYTHON}", "/usr/lib/python3/dist-packages"], what="compileall")
    packages = in_chroot(rootfs, ["dpkg-query", "-W", "-f=${Package} ${Version} ${Architecture}\n"], what="dpkg-query")
    (tmp / "packages.txt").write_text("".join(sorted(packages.splitlines(keepends=True))))
    (tmp / "done").write_text(key + "\n")
    with open(cache / ".lock-base", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(base.dir, ignore_errors=True)
        tmp.rename(base.dir)
    log(f"made the Debian tree in {time.monotonic() - started:.0f}s into {base.dir}")
    return base


def _add_user(rootfs: Path) -> None:
    """The image's user and group, as `useradd --system` would write them (bookworm's essential
    set has no `passwd` package, hence no useradd)."""
    etc = rootfs / "etc"
    with open(etc / "passwd", "a") as f:
        f.write(f"{USER}:x:{UID}:{GID}:{USER}:{HOME}:/usr/sbin/nologin\n")
    with open(etc / "group", "a") as f:
        f.write(f"{USER}:x:{GID}:\n")
    for name, line in (("shadow", f"{USER}:!:{BASE_EPOCH // 86400}::::::\n"), ("gshadow", f"{USER}:!::\n")):
        if (etc / name).exists():
            with open(etc / name, "a") as f:
                f.write(line)


def copy_tree(source: Path, dest: Path) -> None:
    """A full copy (owners, modes, links, times) for a chroot to work in."""
    run(["cp", "-a", "--reflink=auto", source, dest], what=f"copying {source}")
