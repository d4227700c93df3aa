"""A process run in an unpacked image (e2e.image.unpack) the way a container runtime would run it,
with Linux namespaces and chroot instead of a runtime.

Why not a runtime: podman and crun cannot start a container on these machines (the cgroup setup
they want is refused), and CI machines have no container daemon. What a container is made of
needs only root and namespaces: `unshare` gives the process its own mount, PID, UTS and IPC
namespaces (the host's network: the lab's apiservers listen on its loopback); inside, the tree is
bind-mounted on itself (read-only if asked), the volumes are mounted at their paths, /proc and a
small /dev are provided, and `chroot --userspec` starts the command as the container's user,
with its environment, in its working directory. Not done: cgroups (no limits), seccomp, and
capabilities beyond what changing to a non-root user drops.

The command is the namespace's first process (PID 1), as in a container: a signal it has no
handler for does nothing, and when it ends the kernel kills everything else in the namespace.
`unshare --kill-child` kills it if `unshare` dies first, so no process outlives its sandbox.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from e2e.image.unpack import inside

#: Runs as the namespace's first process, before the command: mounts, hostname, then exec.
#: Arguments: root, ro|rw, hostname, then `kind source mountpoint options` for each mount (kind
#: bind or tmpfs; mountpoint already resolved inside root), then `--` and the command.
_SETUP = """
set -eu
root=$1 rootmode=$2 name=$3; shift 3
mount --bind "$root" "$root"
if [ "$rootmode" = ro ]; then mount -o remount,bind,ro "$root"; fi
while [ "$1" != -- ]; do
  kind=$1 source=$2 point=$3 options=$4; shift 4
  if [ "$kind" = tmpfs ]; then
    mount -t tmpfs -o "$options" tmpfs "$point"
  else
    mount --bind "$source" "$point"
    if [ -n "$options" ]; then mount -o "remount,bind,$options" "$point"; fi
  fi
done
shift
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount -t tmpfs -o nosuid,mode=755,size=1m tmpfs "$root/dev"
for dev in null zero full random urandom tty; do
  touch "$root/dev/$dev"
  mount --bind "/dev/$dev" "$root/dev/$dev"
done
ln -s /proc/self/fd "$root/dev/fd"
ln -s /proc/self/fd/0 "$root/dev/stdin"
ln -s /proc/self/fd/1 "$root/dev/stdout"
ln -s /proc/self/fd/2 "$root/dev/stderr"
if [ -n "$name" ]; then hostname "$name"; fi
exec "$@"
"""


@dataclass(frozen=True, kw_only=True)
class Mount:
    """A host file or directory bound at `target` (in the container), or a tmpfs there."""

    target: str
    source: Path | None = None  # None: a tmpfs
    read_only: bool = False
    size: str = "16m"  # of a tmpfs, as `mount -t tmpfs -o size=` takes it
    mode: str = "1777"  # of a tmpfs's root directory
    gid: int | None = None  # of a tmpfs's root directory (a pod's fsGroup)


@dataclass(frozen=True, kw_only=True)
class Container:
    """What to run, and how: the image's tree, the command (argv[0] looked up in the PATH of
    `env`), the whole environment as NAME=VALUE, the user as UID:GID."""

    root: Path
    argv: Sequence[str]
    env: Sequence[str]
    workdir: str = "/"
    user: str = "0:0"
    groups: Sequence[int] = ()
    mounts: Sequence[Mount] = ()
    read_only_root: bool = False
    hostname: str = ""
    no_new_privileges: bool = False


def command(container: Container) -> list[str]:
    """The host command that runs `container`; makes its mount points in the tree first (a
    read-only root cannot take them later), as a runtime does."""
    specs: list[str] = []
    for mount in sorted(container.mounts, key=lambda m: len(m.target.rstrip("/").split("/"))):
        point = inside(container.root, mount.target)
        if mount.source is not None and not mount.source.is_dir():
            point.parent.mkdir(parents=True, exist_ok=True)
            point.touch(exist_ok=True)
        else:
            point.mkdir(parents=True, exist_ok=True)
        if mount.source is None:
            options = f"nosuid,nodev,mode={mount.mode},size={mount.size}"
            options += f",gid={mount.gid}" if mount.gid is not None else ""
            options += ",ro" if mount.read_only else ""
            specs += ["tmpfs", "-", str(point), options]
        else:
            specs += ["bind", str(mount.source), str(point), "ro" if mount.read_only else ""]
    chroot = _as_user(container, container.argv)
    rootmode = "ro" if container.read_only_root else "rw"
    setup = ["sh", "-c", _SETUP, "sandbox", str(container.root), rootmode, container.hostname, *specs, "--"]
    return ["unshare", "--mount", "--pid", "--uts", "--ipc", "--fork", "--kill-child", *setup, *chroot]


def _as_user(container: Container, argv: Sequence[str]) -> list[str]:
    """`argv` run in the tree as the container's user, with its environment and working
    directory (the image's own `env` does the last two, and finds argv[0] in the new PATH)."""
    inner = ["/usr/bin/env", "-i", "-C", container.workdir, *container.env, *argv]
    chroot = ["chroot", f"--userspec={container.user}"]
    if container.groups:
        chroot.append("--groups=" + ",".join(str(g) for g in container.groups))
    chroot += [str(container.root), *inner]
    return ["setpriv", "--no-new-privs", *chroot] if container.no_new_privileges else chroot


def exec_command(container: Container, first_pid: int, argv: Sequence[str]) -> list[str]:
    """The host command that runs `argv` inside the running `container` whose first process is
    `first_pid` (its namespaces entered), as `kubectl exec` or an exec probe does."""
    return ["nsenter", f"--target={first_pid}", "--mount", "--pid", "--uts", "--ipc", *_as_user(container, argv)]


def run(container: Container, *, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs `container` to its end; its output captured."""
    return subprocess.run(command(container), capture_output=True, text=True, timeout=timeout, check=False)


def start(container: Container, *, log: Path) -> subprocess.Popen[bytes]:
    """Starts `container`, its output (and the sandbox's own errors) appended to `log`. The
    caller stops it: signal `first_process`, then wait for the returned `unshare`."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            command(container), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def first_process(sandbox: subprocess.Popen[bytes]) -> int | None:
    """The host PID of the container's first process (the child of `unshare`), None once it
    has ended. Signals for the container go to it: `unshare` only waits for it."""
    try:
        children = Path(f"/proc/{sandbox.pid}/task/{sandbox.pid}/children").read_text().split()
    except OSError:
        return None
    return int(children[0]) if children else None
