"""Control-plane binaries and metrics-server (and helm, promtool and Prometheus, for the chart
tests; JobSet, Kueue and Volcano, for the offline stacks the lab runs on request), built from the pinned
Go tools modules under `e2e/tools/` into a per-user cache keyed by what determines the build,
so they are rebuilt only when a pin changes.

Never written inside the repository. The cache root is `$VKPROVIDER_CACHE_DIR`, else
`$XDG_CACHE_HOME/vkprovider`, else `~/.cache/vkprovider`.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TOOLS_DIR = Path(__file__).parent / "tools"

#: Every binary the lab builds, and the tools module that builds it.
BINARIES = {
    "etcd": "etcd",
    "kube-apiserver": "k8s",
    "kube-scheduler": "k8s",
    "kube-controller-manager": "k8s",
    "kubectl": "k8s",
    "kwok": "kwok",
    "metrics-server": "metrics-server",
    "helm": "helm",
    "promtool": "promtool",
    "prometheus": "promtool",
    "dashboardcheck": "grafana",
    "jobset": "jobset",
    "kueue": "kueue",
    "volcano-scheduler": "volcano",
    "volcano-controller-manager": "volcano",
    "volcano-webhook-manager": "volcano",
}

#: Built like the others for the tests (the chart tests' client), but never run by the lab, so a
#: `--bin-dir` need not hold them.
NOT_RUN_BY_LAB = frozenset({"helm", "promtool", "prometheus", "dashboardcheck"})
#: Run by the lab only when asked (`up --with`, e2e.stacks): a `--bin-dir` need not hold them either.
STACKS = frozenset({"jobset", "kueue", "volcano-scheduler", "volcano-controller-manager", "volcano-webhook-manager"})


class BinaryError(RuntimeError):
    """A binary is missing, broken, or could not be built."""


@dataclass(frozen=True, kw_only=True)
class ToolBuild:
    """How one tools module is built: which packages, named how, with which link flags."""

    module: str
    main_module: str  # the required module whose version names the build
    packages: dict[str, str]  # output binary name -> Go package path
    ldflags: tuple[str, ...] = ()

    @property
    def module_dir(self) -> Path:
        return TOOLS_DIR / self.module

    def version(self) -> str:
        return self.required_version(self.main_module)

    def required_version(self, module: str) -> str:
        """The version of `module` that this tools module's go.mod requires."""
        gomod = (self.module_dir / "go.mod").read_text()
        match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", gomod, re.MULTILINE)
        if not match:
            raise BinaryError(f"{self.module_dir}/go.mod does not require {module}")
        return match.group(1)


def _k8s_ldflags(version: str) -> tuple[str, ...]:
    major, minor = version.lstrip("v").split(".")[:2]
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [f"-X {pkg}.gitVersion={version}", f"-X {pkg}.gitMajor={major}", f"-X {pkg}.gitMinor={minor}"]
        flags += [f"-X {pkg}.gitTreeState=clean"]
    return tuple(flags)


def _helm_ldflags(version: str, client_go: str) -> tuple[str, ...]:
    """As helm's own release build: its version, and the Kubernetes version `helm template` and
    `helm lint` assume without a cluster, that of its client-go (v0.N.x is Kubernetes 1.N)."""
    client_major, client_minor = client_go.lstrip("v").split(".")[:2]
    k8s_major = str(int(client_major) + 1)
    flags = ["-s", "-w"]
    flags += [f"-X helm.sh/helm/v3/internal/version.version={version}", "-X helm.sh/helm/v3/internal/version.metadata="]
    flags += ["-X helm.sh/helm/v3/internal/version.gitTreeState=clean"]
    for pkg in ("helm.sh/helm/v3/pkg/lint/rules", "helm.sh/helm/v3/pkg/chartutil"):
        flags += [f"-X {pkg}.k8sVersionMajor={k8s_major}", f"-X {pkg}.k8sVersionMinor={client_minor}"]
    return tuple(flags)


def tool_builds() -> dict[str, ToolBuild]:
    k8s = ToolBuild(
        module="k8s",
        main_module="k8s.io/kubernetes",
        packages={name: f"k8s.io/kubernetes/cmd/{name}" for name, mod in BINARIES.items() if mod == "k8s"},
    )
    k8s = ToolBuild(
        module=k8s.module, main_module=k8s.main_module, packages=k8s.packages, ldflags=_k8s_ldflags(k8s.version())
    )
    helm = ToolBuild(module="helm", main_module="helm.sh/helm/v3", packages={"helm": "helm.sh/helm/v3/cmd/helm"})
    metrics = ToolBuild(
        module="metrics-server",
        main_module="sigs.k8s.io/metrics-server",
        packages={"metrics-server": "sigs.k8s.io/metrics-server/cmd/metrics-server"},
    )
    return {
        "k8s": k8s,
        "etcd": ToolBuild(
            module="etcd",
            main_module="go.etcd.io/etcd/server/v3",
            packages={"etcd": "go.etcd.io/etcd/server/v3"},
            ldflags=("-s", "-w"),
        ),
        "kwok": ToolBuild(
            module="kwok",
            main_module="sigs.k8s.io/kwok",
            packages={"kwok": "sigs.k8s.io/kwok/cmd/kwok"},
            ldflags=("-s", "-w"),
        ),
        "helm": ToolBuild(
            module="helm",
            main_module=helm.main_module,
            packages=helm.packages,
            ldflags=_helm_ldflags(helm.version(), helm.required_version("k8s.io/client-go")),
        ),
        # Every cluster's Metrics API (`kubectl top`), unmodified, as its release builds it.
        "metrics-server": ToolBuild(
            module="metrics-server",
            main_module=metrics.main_module,
            packages=metrics.packages,
            # Its release build names its version in client-go's version package.
            ldflags=("-s", "-w", f"-X k8s.io/client-go/pkg/version.gitVersion={metrics.version()}"),
        ),
        # The chart's alert rules are checked and unit-tested by Prometheus's own tool, and its
        # ServiceMonitors scraped by Prometheus itself (built without its web UI's assets).
        "promtool": ToolBuild(
            module="promtool",
            main_module="github.com/prometheus/prometheus",
            packages={
                "promtool": "github.com/prometheus/prometheus/cmd/promtool",
                "prometheus": "github.com/prometheus/prometheus/cmd/prometheus",
            },
            ldflags=("-s", "-w"),
        ),
        # The chart's Grafana dashboard is checked against Grafana's own dashboard schema, by the
        # strict decoding of the schema-generated types of grafana-foundation-sdk (a command line
        # of ours over that library: no upstream command does it).
        "grafana": ToolBuild(
            module="grafana",
            main_module="github.com/grafana/grafana-foundation-sdk/go",
            packages={"dashboardcheck": "vkprovider.local/e2e/tools/grafana/dashboardcheck"},
            ldflags=("-s", "-w"),
        ),
        # The offline stacks the lab runs on request (e2e.stacks), unmodified, as their releases build them.
        "jobset": ToolBuild(
            module="jobset",
            main_module="sigs.k8s.io/jobset",
            packages={"jobset": "sigs.k8s.io/jobset"},
            ldflags=("-s", "-w"),
        ),
        "kueue": ToolBuild(
            module="kueue",
            main_module="sigs.k8s.io/kueue",
            packages={"kueue": "sigs.k8s.io/kueue/cmd/kueue"},
            ldflags=("-s", "-w"),
        ),
        "volcano": ToolBuild(
            module="volcano",
            main_module="volcano.sh/volcano",
            packages={
                f"volcano-{name}": f"volcano.sh/volcano/cmd/{name}"
                for name in ("scheduler", "controller-manager", "webhook-manager")
            },
            ldflags=("-s", "-w"),
        ),
    }


def cache_root() -> Path:
    if os.environ.get("VKPROVIDER_CACHE_DIR"):
        return Path(os.environ["VKPROVIDER_CACHE_DIR"])
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "vkprovider"


def _go_version() -> str:
    try:
        return subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BinaryError(f"the Go toolchain is needed to build the lab's binaries: {exc}") from exc


def build_key(build: ToolBuild, go_version: str) -> str:
    """What determines a build: the pins (go.mod, go.sum), any Go source of the tools module's
    own (a command line over an upstream library), the link flags and the Go version."""
    digest = hashlib.sha256()
    for name in ("go.mod", "go.sum"):
        digest.update((build.module_dir / name).read_bytes())
    for source in sorted(build.module_dir.rglob("*.go")):
        digest.update(source.relative_to(build.module_dir).as_posix().encode() + b"\0" + source.read_bytes())
    digest.update("\0".join(build.ldflags).encode())
    digest.update(go_version.encode())
    return f"{build.module}-{build.version()}-{digest.hexdigest()[:12]}"


def _log(message: str) -> None:
    print(f"[e2e] {message}", file=sys.stderr, flush=True)


def ensure_built(build: ToolBuild, *, go_version: str | None = None) -> Path:
    """The directory holding this tools module's binaries, building it first if needed."""
    go_version = go_version or _go_version()
    root = cache_root() / "bin"
    root.mkdir(parents=True, exist_ok=True)
    target = root / build_key(build, go_version)
    if all((target / name).is_file() for name in build.packages):
        return target
    with open(root / f".lock-{build.module}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a waiter finds the result
        if all((target / name).is_file() for name in build.packages):
            return target
        tmp = root / f".tmp-{target.name}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly -buildvcs=false")
        started = time.monotonic()
        _log(
            f"building {', '.join(build.packages)} ({build.main_module} {build.version()}); a cold build takes minutes"
        )
        for name, package in build.packages.items():
            cmd = ["go", "build", "-trimpath", "-o", str(tmp / name), "-ldflags", " ".join(build.ldflags), package]
            result = subprocess.run(cmd, cwd=build.module_dir, env=env, capture_output=True, text=True, check=False)
            if result.returncode != 0:
                shutil.rmtree(tmp, ignore_errors=True)
                tail = "\n".join(result.stderr.strip().splitlines()[-20:])
                raise BinaryError(f"go build {package} failed:\n{tail}")
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        _log(f"built {build.module} in {time.monotonic() - started:.0f}s into {target}")
        return target


def ensure_all() -> dict[str, Path]:
    """Paths of every binary the lab builds (`BINARIES`), building what is missing."""
    go_version = _go_version()
    dirs = {module: ensure_built(build, go_version=go_version) for module, build in tool_builds().items()}
    return {name: dirs[module] / name for name, module in BINARIES.items()}


def from_dir(bin_dir: Path) -> dict[str, Path]:
    """The lab's binaries taken from one directory (`--bin-dir`), checked to exist and be executable."""
    paths = {name: bin_dir / name for name in BINARIES if name not in NOT_RUN_BY_LAB | STACKS}
    for name, path in paths.items():
        if not path.is_file():
            raise BinaryError(f"binary {name} not found at {path}")
        if not os.access(path, os.X_OK):
            raise BinaryError(f"binary {name} at {path} is not executable")
    return paths


def link_dir(paths: dict[str, Path], into: Path) -> Path:
    """A directory of symlinks to the given binaries: one place to point at, e.g. for PATH."""
    into.mkdir(parents=True, exist_ok=True)
    for name, path in paths.items():
        link = into / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(path)
    return into
