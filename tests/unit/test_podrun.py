"""Pure parts of e2e.podrun (a pod's container run from the image as a kubelet would): the
command line, `$(VAR)` references, quantities, who the container runs as, the downward API, and
where a mount point lands in the image's tree. No processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e import podrun
from e2e.image.rootfs import ImageError
from e2e.image.unpack import inside

IMAGE = {"Entrypoint": ["vkprovider"], "Cmd": ["--help"], "User": "65532:65532", "WorkingDir": "/tmp"}


@pytest.mark.parametrize(
    ("container", "expected"),
    [
        ({}, ["vkprovider", "--help"]),
        ({"args": ["run", "--config", "/etc/s.yaml"]}, ["vkprovider", "run", "--config", "/etc/s.yaml"]),
        ({"command": ["python", "-c", "pass"]}, ["python", "-c", "pass"]),  # the image's Cmd dropped too
        ({"command": ["sh"], "args": ["-c", "true"]}, ["sh", "-c", "true"]),
    ],
)
def test_command_and_args_replace_entrypoint_and_cmd_as_kubernetes_defines(
    container: dict[str, Any], expected: list[str]
) -> None:
    assert podrun.argv(IMAGE, container, {}) == expected


def test_no_command_anywhere_is_refused() -> None:
    with pytest.raises(podrun.PodRunError):
        podrun.argv({}, {}, {})


def test_references_expand_from_the_environment() -> None:
    env = {"NODE": "vk-pool", "PORT": "10250"}
    assert podrun.expand("$(NODE):$(PORT)", env) == "vk-pool:10250"
    assert podrun.expand("$(MISSING) stays", env) == "$(MISSING) stays"
    assert podrun.expand("$$(NODE) is escaped, $$ too", env) == "$(NODE) is escaped, $ too"
    assert podrun.argv(IMAGE, {"args": ["--node", "$(NODE)"]}, env) == ["vkprovider", "--node", "vk-pool"]


@pytest.mark.parametrize(("quantity", "size"), [("16Mi", 16 * 2**20), ("1G", 10**9), ("512", 512), (1024, 1024)])
def test_quantities_in_bytes(quantity: str | int, size: int) -> None:
    assert podrun.quantity_bytes(quantity) == size


def test_the_container_context_wins_over_the_pods_over_the_images() -> None:
    pod = {"spec": {"securityContext": {"runAsUser": 1000, "fsGroup": 2000, "supplementalGroups": [3000, 2000]}}}
    container = {
        "securityContext": {"runAsGroup": 1001, "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False}
    }
    who = podrun.identity(pod, container, IMAGE)
    assert (who.uid, who.gid, who.groups) == (1000, 1001, (2000, 3000))
    assert who.read_only_root and who.no_new_privileges
    plain = podrun.identity({"spec": {}}, {}, IMAGE)
    assert (plain.uid, plain.gid, plain.groups, plain.read_only_root, plain.no_new_privileges) == (
        65532, 65532, (), False, False,
    )  # fmt: skip


def test_run_as_non_root_refuses_uid_0_and_names_are_not_run() -> None:
    pod = {"spec": {"securityContext": {"runAsNonRoot": True}}}
    with pytest.raises(podrun.PodRunError, match="runAsNonRoot"):
        podrun.identity(pod, {}, {"User": "0"})
    with pytest.raises(podrun.PodRunError, match="numeric"):
        podrun.identity({"spec": {}}, {}, {"User": "nobody"})


def test_the_downward_api_as_a_kubelet_resolves_it() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1", "labels": {"app": "x"}, "annotations": {"a/b": "c"}},
        "spec": {"serviceAccountName": "vk"},
    }
    host = podrun.Host(service_host="127.0.0.1", service_port=6443, pod_ip="127.0.0.1")
    assert podrun.field_value(pod, "metadata.name", host) == "p"
    assert podrun.field_value(pod, "metadata.namespace", host) == "ns"
    assert podrun.field_value(pod, "status.podIP", host) == "127.0.0.1"
    assert podrun.field_value(pod, "spec.serviceAccountName", host) == "vk"
    assert podrun.field_value(pod, "metadata.labels['app']", host) == "x"
    assert podrun.field_value(pod, "metadata.annotations['a/b']", host) == "c"
    with pytest.raises(podrun.PodRunError):
        podrun.field_value(pod, "spec.containers", host)


def test_the_host_of_an_apiserver_url() -> None:
    assert podrun.Host.for_server("https://127.0.0.1:27257") == podrun.Host(
        service_host="127.0.0.1", service_port=27257
    )
    assert podrun.Host.for_server("https://[::1]:6443").service_host == "::1"


def test_the_service_account_volume_is_the_admission_plugins() -> None:
    volume, mount = podrun.service_account_volume()
    assert mount == {"name": volume["name"], "mountPath": podrun.SERVICE_ACCOUNT_PATH, "readOnly": True}
    paths = [
        item["path"]
        for source in volume["projected"]["sources"]
        for item in (source.get("configMap") or source.get("downwardAPI") or {}).get("items", [])
    ]
    assert paths == ["ca.crt", "namespace"]


def test_mount_points_resolve_inside_the_tree_whatever_the_links_say(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    (root / "var").mkdir()
    (root / "var" / "run").symlink_to("/run")  # absolute: the container's /run, not the host's
    (root / "up").symlink_to("../../..")
    assert inside(root, "/var/run/secrets/x") == root / "run" / "secrets" / "x"
    assert inside(root, "/up/etc/passwd") == root / "etc" / "passwd"
    assert inside(root, "/../../etc") == root / "etc"
    (root / "loop").symlink_to("loop")
    with pytest.raises(ImageError, match="symbolic links"):
        inside(root, "/loop/x")
