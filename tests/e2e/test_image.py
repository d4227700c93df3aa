"""The image `make image` builds (e2e.image), run the way a container runtime would run it: its
layers unpacked in order, its entry point run as its user, in its working directory, with its
environment, on a read-only root filesystem with a writable /tmp (the chart's pod); and built
again from the same inputs, the same digest.

Why unshare and chroot rather than a container runtime: CI machines (and the one this was
written on) have no container daemon, and a runtime cannot set up the cgroups it wants there.
A mount namespace (`unshare --mount --pid --fork`), a read-only bind mount of the unpacked tree
and `chroot --userspec` need only root and Linux namespaces, and exercise what matters here:
the layers, the user, the entry point, the environment, nothing written outside /tmp.

Needs no lab, so it runs beside the lab's start. Time (2 cores): a cold build (an empty
~/.cache/vkprovider/image) takes about 50 s (the Debian tree about 25 s, the dependencies'
virtualenv and the layers' compression the rest); a warm one about 5 s (only the provider's own
layer is remade), twice here: about 20 s for the module when warm, 70 s when cold.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.image import build as image_build


@dataclass(frozen=True)
class Unpacked:
    archive: Path
    digest: str
    root: Path
    config: dict[str, Any]


def _blob(archive: tarfile.TarFile, digest: str) -> bytes:
    member = archive.extractfile("blobs/sha256/" + digest.removeprefix("sha256:"))
    assert member is not None, digest
    data = member.read()
    assert "sha256:" + hashlib.sha256(data).hexdigest() == digest
    return data


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Unpacked:
    if os.geteuid() != 0:
        pytest.fail("building and running the image needs root (mmdebstrap, chroot, mount namespaces)")
    built = image_build.build()
    root = tmp_path_factory.mktemp("image") / "root"
    root.mkdir()
    layers = tmp_path_factory.mktemp("layers")
    with tarfile.open(built.path) as archive:
        assert json.loads(_blob_named(archive, "oci-layout")) == {"imageLayoutVersion": "1.0.0"}
        (entry,) = json.loads(_blob_named(archive, "index.json"))["manifests"]
        assert entry["digest"] == built.digest
        manifest = json.loads(_blob(archive, entry["digest"]))
        config = json.loads(_blob(archive, manifest["config"]["digest"]))
        assert [layer["mediaType"] for layer in manifest["layers"]] == [
            "application/vnd.oci.image.layer.v1.tar+gzip"
        ] * len(config["rootfs"]["diff_ids"])
        for layer in manifest["layers"]:  # in order, each over the ones below
            path = layers / layer["digest"].removeprefix("sha256:")
            path.write_bytes(_blob(archive, layer["digest"]))
            subprocess.run(["tar", "-xzf", path, "--numeric-owner", "-C", root], check=True)
    return Unpacked(archive=built.path, digest=built.digest, root=root, config=config["config"])


def _blob_named(archive: tarfile.TarFile, name: str) -> bytes:
    member = archive.extractfile(name)
    assert member is not None, name
    return member.read()


# Mounts the unpacked tree read-only on itself, a tmpfs at /tmp (the chart's emptyDir), /proc and
# the few devices a runtime provides, then runs the rest of the arguments.
_SANDBOX = """
set -eu
root=$1; shift
mount --bind "$root" "$root"
mount -o remount,bind,ro "$root"
mount -t tmpfs -o mode=1777,size=16m tmpfs "$root/tmp"
mount -t proc proc "$root/proc"
mount -t tmpfs -o mode=755,size=1m tmpfs "$root/dev"
for dev in null zero random urandom; do
  touch "$root/dev/$dev"
  mount --bind "/dev/$dev" "$root/dev/$dev"
done
exec "$@"
"""


def _run_in_image(image: Unpacked, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`argv` run in the image as its configuration says: user, environment, working directory."""
    config = image.config
    inside = ["/usr/bin/env", "-i", "-C", config["WorkingDir"], *config["Env"], *argv]
    chroot = ["chroot", f"--userspec={config['User']}", str(image.root), *inside]
    cmd = ["unshare", "--mount", "--pid", "--fork", "sh", "-c", _SANDBOX, "sandbox", str(image.root), *chroot]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)


def test_config_names_the_user_entry_point_and_environment(image: Unpacked) -> None:
    config = image.config
    assert config["User"] == "65532:65532"  # the chart's runAsUser and runAsGroup
    assert config["Entrypoint"] == ["vkprovider"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["PATH"].startswith("/opt/vkprovider/bin:")
    assert env["HOME"] == config["WorkingDir"] == "/tmp"
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"
    passwd = (image.root / "etc/passwd").read_text().splitlines()
    assert "vkprovider:x:65532:65532:vkprovider:/tmp:/usr/sbin/nologin" in passwd
    packages = (image.root / "opt/vkprovider/image/debian-packages.txt").read_text()
    assert any(line.startswith("python3.11 3.11.") for line in packages.splitlines())


def test_entry_point_runs_as_its_user_on_a_read_only_root(image: Unpacked) -> None:
    result = _run_in_image(image, [*image.config["Entrypoint"], "--help"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: vkprovider")
    assert "run the virtual kubelet" in result.stdout
    assert result.stderr == ""


def test_dependencies_load_and_only_tmp_is_writable(image: Unpacked) -> None:
    """The native extensions load with the image's libraries (not the host's), and the process
    is the image's user: the root filesystem refuses writes, /tmp takes them."""
    probe = (
        "import errno, os, sys, tempfile\n"
        "import aiohttp, cryptography.x509, grpc, kubernetes_asyncio, orjson, pydantic_core, yaml\n"
        "import federation.provider, vkprovider.runtime\n"
        "try:\n"
        "    open('/opt/vkprovider/probe', 'w')\n"
        "except OSError as exc:\n"
        "    refused = exc.errno\n"
        "with tempfile.NamedTemporaryFile() as f:\n"
        "    written = f.name.startswith('/tmp/')\n"
        "print(os.getuid(), os.getgid(), refused, written, sys.flags.dont_write_bytecode, os.getcwd())\n"
    )
    result = _run_in_image(image, ["python", "-c", probe])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["65532", "65532", str(errno.EROFS), "True", "1", "/tmp"]


def test_bytecode_is_compiled_at_build_time(image: Unpacked) -> None:
    """Every module of the provider and of the standard library has unchecked-hash bytecode
    beside it: nothing to compile (or write) at start, and no source timestamps to check."""
    site = image.root / "opt/vkprovider/lib/python3.11/site-packages"
    sources = [*(site / "vkprovider").rglob("*.py"), *(image.root / "usr/lib/python3.11").glob("*.py")]
    assert len(sources) > 100
    for source in sources:
        cached = source.parent / "__pycache__" / f"{source.stem}.cpython-311.pyc"
        header = cached.read_bytes()[:8]
        assert int.from_bytes(header[4:8], "little") == 0b01, f"{cached}: not unchecked-hash bytecode"


def test_same_inputs_give_the_same_digest(image: Unpacked) -> None:
    """Built again (the Debian tree and the dependencies from the cache, the provider's wheel,
    its layer and the layout remade), the archive is the same to the byte."""
    before = hashlib.sha256(image.archive.read_bytes()).hexdigest()
    again = image_build.build()
    assert again.digest == image.digest
    assert hashlib.sha256(again.path.read_bytes()).hexdigest() == before
