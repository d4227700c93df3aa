"""Pure parts of the lab: port plans, command lines, node shapes, online load arithmetic."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from e2e import cli, components, nodes, online, ports, state
from e2e import lab as lab_mod
from e2e.lab import LabError, LabSpec
from e2e.state import ClusterState, LabState, ProcessState


def test_port_plan_is_a_dense_block() -> None:
    plan = ports.plan(30000, ["offline", "member-1"])
    used = [port for port, _ in plan.labelled()]
    assert sorted(used) == list(range(30000, 30000 + ports.block_size(2)))
    assert plan.clusters["member-1"].apiserver == 30007


def test_cluster_names_and_default_profiles() -> None:
    spec = LabSpec(members=4)
    assert spec.cluster_names() == ["offline", "member-1", "member-2", "member-3", "member-4"]
    assert [spec.profile_of(i) for i in range(1, 5)] == ["cpu", "gpu-v100", "gpu-t4", "cpu"]
    assert LabSpec(members=2, profiles=("gpu-t4",)).profile_of(2) == "gpu-t4"


def test_offline_cluster_has_no_nodes_by_default() -> None:
    spec = LabSpec()
    assert spec.offline_nodes == 0 and spec.offline_profile == "gpu-v100"
    spec.validate()
    LabSpec(offline_nodes=4, offline_profile="cpu").validate()


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (LabSpec(offline_nodes=-1), "--offline-nodes must not be negative"),
        (LabSpec(offline_nodes=2, offline_profile="gpu-a100"), "unknown node profile 'gpu-a100'"),
        (LabSpec(members=-1), "--members and --nodes-per-member must not be negative"),
        (LabSpec(profiles=("cpu", "tpu")), "unknown node profile 'tpu'"),
    ],
)
def test_spec_validation_names_the_bad_input(spec: LabSpec, message: str) -> None:
    with pytest.raises(LabError, match=message):
        spec.validate()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--offline-nodes", "-2"], "error: --offline-nodes must not be negative"),
        (["--offline-nodes", "3", "--offline-profile", "nope"], "error: unknown node profile 'nope'; known: cpu,"),
    ],
)
def test_up_refuses_bad_offline_flags_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    state = tmp_path / "lab"
    assert cli.main(["up", *flags, "--state", str(state)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(message), err
    assert not state.exists()  # refused before anything was written or started


def test_only_clusters_with_nodes_or_members_run_kwok() -> None:
    def cluster(role: str, count: int) -> ClusterState:
        return ClusterState(name=role, role=role, apiserver_port=1, nodes=count)

    assert not lab_mod._runs_kwok(cluster("offline", 0))  # the default lab stays as fast as before
    assert lab_mod._runs_kwok(cluster("offline", 4))
    assert lab_mod._runs_kwok(cluster("member", 0)) and lab_mod._runs_kwok(cluster("member", 20))


def test_apiserver_flags_enable_native_gang_and_loopback_advertise() -> None:
    files = components.ClusterFiles(dir=Path("/s/clusters/x"), kubeconfig=Path("/s/kubeconfig/x.yaml"))
    argv = components.apiserver_argv(binary=Path("/b/kube-apiserver"), files=files, cluster="x", port=1, etcd_port=2)
    assert "--feature-gates=GenericWorkload=true,TopologyAwareWorkloadScheduling=true" in argv
    assert any(a.startswith("--runtime-config=") and "scheduling.k8s.io/v1beta1=true" in a for a in argv)
    assert "--endpoint-reconciler-type=none" in argv and "--advertise-address=127.0.0.1" in argv
    assert "--etcd-prefix=/registry/x" in argv
    assert "GangScheduling" not in " ".join(argv)  # merged into GenericWorkload in 1.37; unknown gates fail


def test_scheduler_config_raises_client_qps() -> None:
    files = components.ClusterFiles(dir=Path("/s/c"), kubeconfig=Path("/s/k.yaml"))
    text = components.scheduler_config(files=files)
    assert "qps: 1000" in text and "leaderElect: false" in text


def test_node_shapes_of_profiles() -> None:
    capacity, allocatable = nodes.resources(nodes.PROFILES["gpu-v100"])
    assert capacity["nvidia.com/gpu"] == allocatable["nvidia.com/gpu"] == "8"
    assert allocatable["cpu"] == "79000m"
    cpu_capacity, _ = nodes.resources(nodes.PROFILES["cpu"])
    assert cpu_capacity["cpu"] == "96" and cpu_capacity["memory"] == "384Gi" and "nvidia.com/gpu" not in cpu_capacity


def test_nodes_share_network_pods_and_carry_gpu_labels() -> None:
    profile = nodes.PROFILES["gpu-t4"]
    built = [nodes.build_node(cluster="member-3", member_index=3, index=i, profile=profile) for i in range(10)]
    network_pods = [n["metadata"]["labels"][nodes.NETWORK_POD_LABEL] for n in built]
    assert network_pods == ["member-3-np0"] * 5 + ["member-3-np1"] * 5
    assert built[0]["metadata"]["labels"]["nvidia.com/gpu.product"] == "Tesla-T4"
    assert built[0]["metadata"]["annotations"][components.KWOK_NODE_ANNOTATION] == "fake"
    assert built[7]["status"]["addresses"][0] == {"type": "InternalIP", "address": "127.0.0.1"}


def test_offline_native_nodes_take_the_first_address_block_and_the_capacity_label() -> None:
    native = {nodes.CAPACITY_LABEL: nodes.NATIVE_CAPACITY}
    profile = nodes.PROFILES["gpu-v100"]
    built = [
        nodes.build_node(cluster="offline", member_index=0, index=i, profile=profile, extra_labels=native)
        for i in range(2)
    ]
    assert [n["metadata"]["name"] for n in built] == ["offline-node-000", "offline-node-001"]
    assert built[1]["status"]["addresses"][0]["address"] == "127.0.0.1"
    assert built[1]["spec"]["podCIDR"] == "10.100.1.0/24"
    labels = built[0]["metadata"]["labels"]
    assert labels["vkprovider.io/capacity"] == "native" and labels["type"] == "kwok"
    assert built[0]["metadata"]["annotations"][components.KWOK_NODE_ANNOTATION] == "fake"
    assert "taints" not in built[0]["spec"]
    member = nodes.build_node(cluster="member-1", member_index=1, index=0, profile=profile)
    assert nodes.CAPACITY_LABEL not in member["metadata"]["labels"]


def test_numa_topology_splits_the_node() -> None:
    topology = nodes.build_node_topology(node="n", profile=nodes.PROFILES["cpu"])
    cpus = [r["allocatable"] for z in topology["zones"] for r in z["resources"] if r["name"] == "cpu"]
    assert cpus == ["47500m", "47500m"]
    assert topology["zones"][0]["costs"] == [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 20}]


@pytest.mark.parametrize(("text", "value"), [("60%", 0.6), ("0.25", 0.25), ("0%", 0.0), ("100%", 1.0)])
def test_parse_share(text: str, value: float) -> None:
    assert online.parse_share(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["150%", "-1", "lots"])
def test_parse_share_refuses_nonsense(text: str) -> None:
    with pytest.raises(online.LoadError):
        online.parse_share(text)


def test_replicas_for_share() -> None:
    assert online.replicas_for(share=0.2, allocatable_cpu=1900, pod_cpu=4) == 95
    assert online.replicas_for(share=0.7, allocatable_cpu=1900, pod_cpu=4) == 333
    assert online.replicas_for(share=0, allocatable_cpu=1900, pod_cpu=4) == 0
    with pytest.raises(online.LoadError):
        online.replicas_for(share=0.5, allocatable_cpu=10, pod_cpu=0)


def test_schedulable_cpu_skips_cordoned_and_not_ready_nodes() -> None:
    ready = [{"type": "Ready", "status": "True"}]
    node_list: list[dict[str, Any]] = [
        {"status": {"allocatable": {"cpu": "95"}, "conditions": ready}},
        {"status": {"allocatable": {"cpu": "95500m"}, "conditions": ready}},
        {"spec": {"unschedulable": True}, "status": {"allocatable": {"cpu": "95"}, "conditions": ready}},
        {"status": {"allocatable": {"cpu": "95"}, "conditions": [{"type": "Ready", "status": "False"}]}},
    ]
    assert online.schedulable_cpu(node_list) == pytest.approx(190.5)


def test_a_labs_marker_does_not_match_a_lab_whose_directory_starts_the_same() -> None:
    from e2e.state import LabState

    lab = LabState(state_dir="/tmp/lab", lab_id="/tmp/lab", data_dir="/dev/shm/x", version="v1.37.2")
    assert lab.marker in "/bin/etcd --data-dir=/tmp/lab/etcd-data"
    assert lab.marker not in "/bin/etcd --data-dir=/tmp/lab-psa/etcd-data"  # another lab: not ours to stop


def test_two_clusters_restarted_at_once_keep_each_others_pids(tmp_path: Path) -> None:
    # Each restart loads the state on its own; one saving its whole copy put back the other's old
    # pids, and a later restart then started a second controller manager on a busy port.
    lab = LabState(state_dir=str(tmp_path), lab_id=str(tmp_path), data_dir=str(tmp_path / "data"), version="v")
    for name in ("member-1", "member-3"):
        proc = ProcessState(name=f"{name}-kcm", argv=[], log="", pid=100)
        lab.clusters[name] = ClusterState(name=name, role="member", apiserver_port=1, processes={"kcm": proc})
    lab.save()
    one, three = state.load(tmp_path), state.load(tmp_path)
    assert one is not None and three is not None
    one.clusters["member-1"].processes["kcm"].pid = 201
    one.record(one.clusters["member-1"].processes["kcm"])
    three.clusters["member-3"].processes["kcm"].pid = 303
    three.record(three.clusters["member-3"].processes["kcm"])
    after = state.load(tmp_path)
    assert after is not None
    assert {n: c.processes["kcm"].pid for n, c in after.clusters.items()} == {"member-1": 201, "member-3": 303}


def test_a_listen_port_is_below_the_ephemeral_range_and_free() -> None:
    """Ports for processes a test starts are not ones an outgoing connection may hold as its
    local port (the kernel's ephemeral range), and are free when handed out."""
    import socket

    from e2e import ports

    low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for _ in range(20):
        port = ports.listen_port()
        assert not low <= port <= high
        with socket.socket() as sock:
            sock.bind(("0.0.0.0", port))
