"""helm, built from its pinned tools module like the lab's control-plane binaries for the chart
tests: the built binary runs, reports the pinned version and renders a chart offline with the
Kubernetes version it was linked with."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from e2e import binaries

pytestmark = pytest.mark.e2e


def _helm(tmp_path: Path, *args: str | Path) -> subprocess.CompletedProcess[str]:
    helm = binaries.ensure_all()["helm"]
    homes = {f"HELM_{kind}_HOME": str(tmp_path / "helm" / kind.lower()) for kind in ("CACHE", "CONFIG", "DATA")}
    return subprocess.run(
        [helm, *map(str, args)], env=dict(os.environ, **homes), capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.shares_lab
def test_built_helm_reports_the_pinned_version(tmp_path: Path) -> None:
    result = _helm(tmp_path, "version", "--short")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == binaries.tool_builds()["helm"].version()


@pytest.mark.shares_lab
def test_built_helm_renders_a_chart(tmp_path: Path) -> None:
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}\n"
        "data:\n  kube: {{ .Capabilities.KubeVersion.Version | quote }}\n"
    )
    result = _helm(tmp_path, "template", "rel", chart)
    assert result.returncode == 0, result.stderr
    assert "name: rel" in result.stdout
    # Without a cluster helm assumes the Kubernetes version of its client-go (set at link time).
    client_go = binaries.tool_builds()["helm"].required_version("k8s.io/client-go")
    assert f'kube: "v1.{client_go.split(".")[1]}.0"' in result.stdout
