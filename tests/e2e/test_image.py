"""The image `make image` builds (e2e.image), run the way a container runtime would run it: its
layers unpacked in order, its entry point run as its user, in its working directory, with its
environment, on a read-only root filesystem with a writable /tmp (the chart's pod); and built
again from the same inputs, the same digest.

Why unshare and chroot rather than a container runtime: CI machines (and the one this was
written on) have no container daemon, and a runtime cannot set up the cgroups it wants there.
Namespaces, a read-only bind mount of the unpacked tree and `chroot --userspec` (e2e.image.sandbox,
the layers unpacked by e2e.image.unpack) need only root, and exercise what matters here: the
layers, the user, the entry point, the environment, nothing written outside /tmp.

Needs no lab, so it runs beside the lab's start. Time (2 cores): a cold build (an empty
~/.cache/vkprovider/image) takes about 50 s (the Debian tree about 25 s, the dependencies'
virtualenv and the layers' compression the rest); a warm one about 5 s (only the provider's own
layer is remade), twice here: about 20 s for the module when warm, 70 s when cold.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from e2e.image import build as image_build
from e2e.image import sandbox
from e2e.image.unpack import Unpacked, unpack


@dataclass(frozen=True)
class Image:
    archive: Path
    unpacked: Unpacked

    @property
    def root(self) -> Path:
        return self.unpacked.root

    @property
    def config(self) -> dict[str, Any]:
        return self.unpacked.config


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    if os.geteuid() != 0:
        pytest.fail("building and running the image needs root (mmdebstrap, chroot, mount namespaces)")
    built = image_build.build()
    unpacked = unpack(built.path, tmp_path_factory.mktemp("image") / "root")
    assert unpacked.digest == built.digest
    return Image(archive=built.path, unpacked=unpacked)


def _run_in_image(image: Image, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`argv` run in the image as its configuration says (user, environment, working
    directory), on a read-only root with a tmpfs at /tmp (the chart's emptyDir)."""
    config = image.config
    container = sandbox.Container(
        root=image.root,
        argv=argv,
        env=config["Env"],
        workdir=config["WorkingDir"],
        user=config["User"],
        mounts=[sandbox.Mount(target="/tmp", size="16m")],
        read_only_root=True,
    )
    return sandbox.run(container, timeout=60)


def test_config_names_the_user_entry_point_and_environment(image: Image) -> None:
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


def test_entry_point_runs_as_its_user_on_a_read_only_root(image: Image) -> None:
    result = _run_in_image(image, [*image.config["Entrypoint"], "--help"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: vkprovider")
    assert "run the virtual kubelet" in result.stdout
    assert result.stderr == ""


def test_dependencies_load_and_only_tmp_is_writable(image: Image) -> None:
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


def test_bytecode_is_compiled_at_build_time(image: Image) -> None:
    """Every module of the provider and of the standard library has unchecked-hash bytecode
    beside it: nothing to compile (or write) at start, and no source timestamps to check."""
    site = image.root / "opt/vkprovider/lib/python3.11/site-packages"
    sources = [*(site / "vkprovider").rglob("*.py"), *(image.root / "usr/lib/python3.11").glob("*.py")]
    assert len(sources) > 100
    for source in sources:
        cached = source.parent / "__pycache__" / f"{source.stem}.cpython-311.pyc"
        header = cached.read_bytes()[:8]
        assert int.from_bytes(header[4:8], "little") == 0b01, f"{cached}: not unchecked-hash bytecode"


def test_same_inputs_give_the_same_digest(image: Image) -> None:
    """Built again (the Debian tree and the dependencies from the cache, the provider's wheel,
    its layer and the layout remade), the archive is the same to the byte."""
    before = hashlib.sha256(image.archive.read_bytes()).hexdigest()
    again = image_build.build()
    assert again.digest == image.unpacked.digest
    assert hashlib.sha256(again.path.read_bytes()).hexdigest() == before
