"""Bringing the lab up and down: one shared etcd on tmpfs, then per cluster a kube-apiserver,
kube-scheduler, kube-controller-manager and KWOK with simulated nodes (every member; the offline
cluster only when it is given native nodes).

Every process is recorded in the state directory the moment it starts, so a failed `up` and a
later `down` stop exactly what was started and nothing else. Failures surface as `LabError`
with a one-line message naming the process and the tail of its log.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import shutil
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from e2e import binaries, components, kubeconfig, nodeaddress, nodes, pki, ports, procs, stacks, state, turns, volcano
from e2e.state import ClusterState, LabState, ProcessState
from vkprovider.kube import AlreadyExists, ApiError, KubeClient, NotFound, Unreachable, load_kubeconfig

CRD_DIR = Path(__file__).parent / "crds"
STAGES = Path(__file__).parent / "kwok" / "stages.yaml"
KWOK_METRICS = Path(__file__).parent / "kwok" / "metrics.yaml"
TMPFS = Path("/dev/shm")
START_TIMEOUT = 120.0
ONLINE_PRIORITY_CLASS = "online-high"


class LabError(RuntimeError):
    """A lab operation failed; the message is one line meant for a person."""


@dataclass(frozen=True, kw_only=True)
class LabSpec:
    members: int = 3
    nodes_per_member: int = 20
    profiles: tuple[str, ...] = ()  # per member; default cycles cpu, gpu-v100, gpu-t4
    offline_nodes: int = 0  # the offline cluster's own (native) nodes; 0 starts no KWOK there
    offline_profile: str = "gpu-v100"
    port_base: int | None = None
    bin_dir: Path | None = None
    #: Offline stacks run in the front end (e2e.stacks), in start order.
    stacks: tuple[str, ...] = ()

    def validate(self) -> None:
        """Refuse a spec `up` cannot start, with a message naming the flag."""
        if self.members < 0 or self.nodes_per_member < 0:
            raise LabError("--members and --nodes-per-member must not be negative")
        if self.offline_nodes < 0:
            raise LabError("--offline-nodes must not be negative")
        for profile in (*self.profiles, self.offline_profile):
            if profile not in nodes.PROFILES:
                raise LabError(f"unknown node profile {profile!r}; known: {', '.join(nodes.PROFILES)}")

    def cluster_names(self) -> list[str]:
        return ["offline"] + [f"member-{i}" for i in range(1, self.members + 1)]

    def profile_of(self, member_index: int) -> str:
        if self.profiles:
            return self.profiles[(member_index - 1) % len(self.profiles)]
        return nodes.member_profile(member_index)


def _say(message: str) -> None:
    print(f"[e2e] {message}", file=sys.stderr, flush=True)


def lab_id(state_dir: Path) -> str:
    return "vkprovider-lab-" + hashlib.sha256(str(state_dir).encode()).hexdigest()[:10]


def is_running(lab: LabState) -> bool:
    return any(procs.alive(p.pid, lab.marker) for p in lab.all_processes())


def _resolve_binaries(spec: LabSpec) -> dict[str, Path]:
    try:
        found = binaries.from_dir(spec.bin_dir) if spec.bin_dir else binaries.ensure_all()
    except binaries.BinaryError as exc:
        raise LabError(str(exc).splitlines()[0]) from exc
    if spec.bin_dir:
        builds = binaries.tool_builds()
        for name in spec.stacks:
            for binary in builds[name].packages:
                path = spec.bin_dir / binary
                if not path.is_file():
                    raise LabError(f"binary {binary} not found at {path} (asked for by --with {name})")
                found[binary] = path
    return found


# -- files ---------------------------------------------------------------------------------------


def kwok_log_file(root: Path, cluster: str) -> Path:
    """The log every simulated container of `cluster` has (KWOK reads it on each request, so a
    test appends lines to it; CRI format: `<RFC 3339 time> stdout F <text>`)."""
    return root / "clusters" / cluster / "containers.log"


def kwok_exec_dir(root: Path, cluster: str) -> Path:
    """Where the commands `kubectl exec` runs in a pod of `cluster` start (KWOK runs them on this
    machine): relative paths in the pod are relative to it."""
    return root / "clusters" / cluster / "exec"


def _write_kwok_debug(root: Path, cluster: str) -> Path:
    log = kwok_log_file(root, cluster)
    if not log.exists():
        log.write_text("".join(f"2026-01-01T00:00:0{i}.000000000Z stdout F {cluster} lab line {i}\n" for i in range(3)))
    workdir = kwok_exec_dir(root, cluster)
    workdir.mkdir(exist_ok=True)
    path = root / "clusters" / cluster / "kwok-debug.yaml"
    path.write_text(components.kwok_debug_config(log, workdir))
    return path


def _write_cluster_files(lab: LabState, cluster: ClusterState) -> components.ClusterFiles:
    files = components.ClusterFiles(dir=lab.root / "clusters" / cluster.name, kubeconfig=lab.kubeconfig(cluster.name))
    files.pki.mkdir(parents=True, exist_ok=True)
    (files.dir / "serving").mkdir(exist_ok=True)
    ca = pki.make_ca(f"{cluster.name}-ca")
    ca.write(files.pki, "ca")
    pki.issue(
        ca,
        "kube-apiserver",
        dns_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        ip_addresses=("127.0.0.1", "10.96.0.1"),
        server=True,
    ).write(files.pki, "apiserver")
    # The apiserver's identity towards kubelets (logs, exec): system:masters so a virtual
    # kubelet's SubjectAccessReview allows it, as kubeadm's cluster-admins group does.
    pki.issue(ca, "kube-apiserver-kubelet-client", organizations=("system:masters",), client=True).write(
        files.pki, "apiserver-kubelet-client"
    )
    # The aggregation layer's: the apiserver's identity towards extension apiservers, under a CA
    # of its own, as kubeadm makes them (a client certificate of the cluster CA would otherwise
    # be trusted to name any user in a header).
    front_proxy = pki.make_ca(f"{cluster.name}-front-proxy-ca")
    front_proxy.write(files.pki, "front-proxy-ca")
    pki.issue(front_proxy, components.FRONT_PROXY_CLIENT, client=True).write(files.pki, "front-proxy-client")
    (files.dir / "metrics-server").mkdir(exist_ok=True)
    admin = pki.issue(ca, "lab-admin", organizations=("system:masters",), client=True)
    admin.write(files.pki, "admin")
    pki.write_service_account_key(files.sa_key, files.sa_public)
    kubeconfig.write(
        files.kubeconfig,
        kubeconfig.render(
            cluster=cluster.name,
            server=cluster.server,
            ca_pem=ca.cert_pem,
            cert_pem=admin.cert_pem,
            key_pem=admin.key_pem,
            user="lab-admin",
        ),
    )
    (files.dir / "scheduler.yaml").write_text(components.scheduler_config(files=files))
    (files.dir / "audit-policy.yaml").write_text(components.audit_policy())
    return files


# -- processes -----------------------------------------------------------------------------------


def _start(lab: LabState, proc: ProcessState) -> ProcessState:
    proc.pid = procs.spawn(proc.argv, log_path=Path(proc.log))
    lab.record(proc)
    return proc


def _process(lab: LabState, name: str, argv: list[str]) -> ProcessState:
    return ProcessState(name=name, argv=argv, log=str(lab.root / "logs" / f"{name}.log"))


async def _wait(
    lab: LabState, proc: ProcessState, check: Callable[[], Awaitable[bool]], *, what: str, timeout: float
) -> None:
    """Poll `check` until true; fail fast if the process dies, and at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        if not procs.alive(proc.pid, lab.marker):
            code = procs.exit_code(proc.pid) if proc.pid else None
            detail = procs.log_tail(Path(proc.log), 2) or "no output"
            raise LabError(f"{proc.name} exited during start-up (code {code}): {detail} (log: {proc.log})")
        try:
            if await check():
                return
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError):
            pass
        if time.monotonic() > deadline:
            raise LabError(f"{what} not ready after {timeout:.0f}s (log: {proc.log})")
        await asyncio.sleep(0.2)


async def _http_ok(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.get(url, ssl=False, timeout=aiohttp.ClientTimeout(total=3)) as resp:
        return resp.status == 200


# -- bootstrap objects ---------------------------------------------------------------------------


#: How long a bootstrap call is tried again while the apiserver, ready a moment ago, cannot be
#: reached: once, a 5 s connect timed out on a loaded machine just after /readyz said ok.
BOOTSTRAP_RETRY = 60.0


async def _patiently(call: Callable[[], Awaitable[Any]], what: str) -> Any:
    deadline = time.monotonic() + BOOTSTRAP_RETRY
    while True:
        try:
            return await call()
        except Unreachable as exc:
            if time.monotonic() > deadline:
                raise
            _say(f"{what}: {exc}; trying again")
            await asyncio.sleep(1.0)


async def _create(client: KubeClient, path: str, body: dict[str, Any]) -> None:
    with contextlib.suppress(AlreadyExists):
        await _patiently(lambda: client.create(path, body), f"POST {path}")


async def _install_crds(client: KubeClient) -> None:
    names = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        names.append(crd["metadata"]["name"])
        await _create(client, "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
    for name in names:
        for _ in range(300):
            url = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
            crd = await _patiently(lambda: client.get(url), f"GET {url}")  # noqa: B023 (awaited at once)
            conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            if conditions.get("Established") == "True":
                break
            await asyncio.sleep(0.1)
        else:
            raise LabError(f"CRD {name} not established")


def _runs_kwok(cluster: ClusterState) -> bool:
    """Members always run KWOK; the offline cluster only when it has native nodes."""
    return cluster.role == "member" or cluster.nodes > 0


async def _create_nodes(client: KubeClient, cluster: ClusterState, member_index: int, kubelet_port: int) -> None:
    profile = nodes.PROFILES[cluster.profile or "cpu"]
    native = {nodes.CAPACITY_LABEL: nodes.NATIVE_CAPACITY} if cluster.role == "offline" else None
    limit = asyncio.Semaphore(16)

    async def one(index: int) -> None:
        async with limit:
            node = nodes.build_node(
                cluster=cluster.name,
                member_index=member_index,
                index=index,
                profile=profile,
                extra_labels=native,
                kubelet_port=kubelet_port,
            )
            await _create(client, "/api/v1/nodes", node)
            topology = nodes.build_node_topology(node=node["metadata"]["name"], profile=profile)
            await _create(client, "/apis/topology.node.k8s.io/v1alpha2/noderesourcetopologies", topology)

    await asyncio.gather(*(one(i) for i in range(cluster.nodes)))


async def _bootstrap(
    lab: LabState, cluster: ClusterState, member_index: int, cluster_ports: ports.ClusterPorts
) -> None:
    access = load_kubeconfig(lab.kubeconfig(cluster.name))
    async with KubeClient(access, user_agent="vkprovider-lab") as client:
        await _install_crds(client)
        for path, body in components.metrics_api_objects(cluster_ports.metrics_server):
            await _create(client, path, body)
        priority_class = {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": ONLINE_PRIORITY_CLASS},
            "value": 1000000,
            "description": "Online services of the lab's member clusters (the load generator).",
        }
        await _create(client, "/apis/scheduling.k8s.io/v1/priorityclasses", priority_class)
        if _runs_kwok(cluster):
            await _create_nodes(client, cluster, member_index, cluster_ports.kwok)


async def _cluster_ready(lab: LabState, cluster: ClusterState) -> bool:
    access = load_kubeconfig(lab.kubeconfig(cluster.name))
    async with KubeClient(access, user_agent="vkprovider-lab", request_timeout=5) as client:
        await client.get("/api/v1/namespaces/default/serviceaccounts/default")
        if not cluster.nodes:
            return True
        node_list = await client.list("/api/v1/nodes", params={"labelSelector": "type=kwok"})
        ready = sum(
            1
            for n in node_list["items"]
            if any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
        )
        return ready >= cluster.nodes


# -- up / down -----------------------------------------------------------------------------------


async def up(state_dir: Path, spec: LabSpec) -> LabState:
    """Start a lab in `state_dir` and return when every cluster is ready."""
    state_dir = state_dir.resolve()
    existing = state.load(state_dir) if (state_dir / state.STATE_FILE).exists() else None
    if existing and is_running(existing):
        raise LabError(f"a lab is already running in {state_dir}; run `python -m e2e down --state {state_dir}` first")
    spec.validate()
    bins = _resolve_binaries(spec)
    names = spec.cluster_names()
    try:
        base = spec.port_base or ports.find_base(len(names))
        plan = ports.plan(base, names)
        ports.check_free(plan)
    except ports.PortBusy as exc:
        raise LabError(str(exc)) from exc

    ident = lab_id(state_dir)
    for sub in ("clusters", "logs", "kubeconfig"):
        shutil.rmtree(state_dir / sub, ignore_errors=True)
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    data_dir = TMPFS / ident if TMPFS.is_dir() else state_dir / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    # etcd sees its data through a link in the state dir, so its command line names the lab too.
    data_link = state_dir / "etcd-data"
    data_link.unlink(missing_ok=True)
    data_link.symlink_to(data_dir)

    lab = LabState(state_dir=str(state_dir), lab_id=str(state_dir), data_dir=str(data_dir), version="v1.37.2")
    for index, name in enumerate(names):
        member = index > 0
        lab.clusters[name] = ClusterState(
            name=name,
            role="member" if member else "offline",
            apiserver_port=plan.clusters[name].apiserver,
            profile=spec.profile_of(index) if member else (spec.offline_profile if spec.offline_nodes else None),
            nodes=spec.nodes_per_member if member else spec.offline_nodes,
        )
    address = nodeaddress.for_port_base(base)
    refused = nodeaddress.claim(address)
    if refused is None:
        lab.node_address = address
    else:
        _say(f"no node address of the lab's own ({refused}): the apiservers' node proxy will not reach providers")
    lab.save()
    started = time.monotonic()
    try:
        await _bring_up(lab, plan, bins, spec.stacks)
    except BaseException as exc:
        teardown(lab)
        if isinstance(exc, LabError):
            raise
        if isinstance(exc, (ApiError, OSError)):
            raise LabError(f"lab start-up failed: {exc}") from exc
        raise
    lab.ready = True
    lab.save()
    _say(f"lab ready in {time.monotonic() - started:.1f}s: {', '.join(names)} (state {state_dir})")
    return lab


async def _bring_up(
    lab: LabState, plan: ports.PortPlan, bins: dict[str, Path], spec_stacks: tuple[str, ...] = ()
) -> None:
    etcd = _process(
        lab,
        "etcd",
        components.etcd_argv(
            binary=bins["etcd"],
            data_dir=lab.root / "etcd-data",
            client_port=plan.etcd_client,
            peer_port=plan.etcd_peer,
        ),
    )
    lab.etcd = etcd
    files = {name: _write_cluster_files(lab, cluster) for name, cluster in lab.clusters.items()}
    _start(lab, etcd)
    async with aiohttp.ClientSession() as session:
        await _wait(
            lab,
            etcd,
            lambda: _http_ok(session, f"http://127.0.0.1:{plan.etcd_client}/health"),
            what="etcd",
            timeout=30,
        )
        for name, cluster in lab.clusters.items():
            cluster.processes["kube-apiserver"] = _start(
                lab,
                _process(
                    lab,
                    f"{name}-kube-apiserver",
                    components.apiserver_argv(
                        binary=bins["kube-apiserver"],
                        files=files[name],
                        cluster=name,
                        port=cluster.apiserver_port,
                        etcd_port=plan.etcd_client,
                    ),
                ),
            )
        await asyncio.gather(*(_wait_apiserver(lab, cluster, START_TIMEOUT) for cluster in lab.clusters.values()))
        await asyncio.gather(
            *(
                _start_cluster_components(lab, cluster, index, files[name], plan.clusters[name], bins, session)
                for index, (name, cluster) in enumerate(lab.clusters.items())
            )
        )
    if spec_stacks:
        await _start_stacks(lab, spec_stacks, bins)


async def _start_stacks(lab: LabState, names: tuple[str, ...], bins: dict[str, Path]) -> None:
    offline = lab.clusters["offline"]

    def spawn(name: str, argv: list[str]) -> ProcessState:
        proc = _process(lab, name, argv)
        offline.processes[name.removeprefix("offline-")] = proc
        return _start(lab, proc)

    async def wait(proc: ProcessState, check: Callable[[], Awaitable[bool]], what: str) -> None:
        await _wait(lab, proc, check, what=what, timeout=START_TIMEOUT)

    async with KubeClient(load_kubeconfig(lab.kubeconfig("offline"))) as client:
        try:
            await stacks.bring_up(lab, names, client=client, bins=bins, spawn=spawn, wait=wait)
            if "volcano" in names:
                await volcano.bring_up(lab, client=client, bins=bins, spawn=spawn, wait=wait)
        except stacks.StackError as exc:
            raise LabError(str(exc)) from exc


async def add_stacks(state_dir: Path, names: tuple[str, ...]) -> tuple[str, ...]:
    """Start the named offline stacks in a running lab, those not running yet (one caller at a
    time: test workers sharing the lab may ask together); the names started."""
    with turns.exclusive(state_dir / "stacks.lock"):
        lab = load_running(state_dir)
        offline = lab.clusters["offline"]
        missing = tuple(
            n
            for n in names
            if not all(
                key in offline.processes and procs.alive(offline.processes[key].pid, lab.marker)
                for key in stacks.PROCESSES[n]
            )
        )
        if not missing:
            return ()
        try:
            builds = binaries.tool_builds()  # only what is asked for
            bins = {binary: binaries.ensure_built(builds[n]) / binary for n in missing for binary in builds[n].packages}
        except binaries.BinaryError as exc:
            raise LabError(str(exc).splitlines()[0]) from exc
        try:
            await _start_stacks(lab, missing, bins)
        except BaseException:
            # Nothing half-started stays behind (`up` tears the whole lab down instead).
            started = [offline.processes[k] for n in missing for k in stacks.PROCESSES[n] if k in offline.processes]
            procs.terminate([p.pid for p in started if p.pid], lab.marker)
            raise
        return missing


async def _wait_apiserver(lab: LabState, cluster: ClusterState, timeout: float) -> None:
    async with KubeClient(load_kubeconfig(lab.kubeconfig(cluster.name)), request_timeout=5) as client:

        async def ready() -> bool:
            await client.get("/readyz")
            return True

        await _wait(
            lab, cluster.processes["kube-apiserver"], ready, what=f"{cluster.name} kube-apiserver", timeout=timeout
        )


async def _start_cluster_components(
    lab: LabState,
    cluster: ClusterState,
    member_index: int,
    files: components.ClusterFiles,
    cluster_ports: ports.ClusterPorts,
    bins: dict[str, Path],
    session: aiohttp.ClientSession,
) -> None:
    name = cluster.name
    scheduler = _start(
        lab,
        _process(
            lab,
            f"{name}-kube-scheduler",
            components.scheduler_argv(binary=bins["kube-scheduler"], files=files, port=cluster_ports.scheduler),
        ),
    )
    kcm = _start(
        lab,
        _process(
            lab,
            f"{name}-kube-controller-manager",
            components.controller_manager_argv(
                binary=bins["kube-controller-manager"], files=files, port=cluster_ports.controller_manager
            ),
        ),
    )
    cluster.processes["kube-scheduler"] = scheduler
    cluster.processes["kube-controller-manager"] = kcm
    lab.save()
    await _bootstrap(lab, cluster, member_index, cluster_ports)
    metrics_server = _start(
        lab,
        _process(
            lab,
            f"{name}-metrics-server",
            components.metrics_server_argv(
                binary=bins["metrics-server"],
                files=files,
                port=cluster_ports.metrics_server,
                member=cluster.role == "member",
            ),
        ),
    )
    cluster.processes["metrics-server"] = metrics_server
    if _runs_kwok(cluster):
        cluster.processes["kwok"] = _start(
            lab,
            _process(
                lab,
                f"{name}-kwok",
                components.kwok_argv(
                    binary=bins["kwok"],
                    files=files,
                    stages=STAGES,
                    pod_cidr=f"10.{100 + member_index}.0.0/16",
                    port=cluster_ports.kwok,
                    debug=_write_kwok_debug(lab.root, name),
                    metrics=KWOK_METRICS,
                ),
            ),
        )
    # The metrics-server is waited for live, not ready: it is ready once it has scraped (a
    # resolution later); `kubectl top` waits for that, not the lab.
    for process, port, path, what in (
        (scheduler, cluster_ports.scheduler, "/healthz", "kube-scheduler"),
        (kcm, cluster_ports.controller_manager, "/healthz", "kube-controller-manager"),
        (metrics_server, cluster_ports.metrics_server, "/livez", "metrics-server"),
    ):
        await _wait(
            lab,
            process,
            functools.partial(_http_ok, session, f"https://127.0.0.1:{port}{path}"),
            what=f"{name} {what}",
            timeout=START_TIMEOUT,
        )
    watched = cluster.processes.get("kwok", kcm)
    await _wait(
        lab, watched, lambda: _cluster_ready(lab, cluster), what=f"{name} nodes and accounts", timeout=START_TIMEOUT
    )


def teardown(lab: LabState) -> list[str]:
    """Stop every recorded process (controllers first, etcd last) and drop etcd's tmpfs data."""
    stopped: list[str] = []
    order = (
        *(k for n in stacks.KNOWN for k in stacks.PROCESSES[n]),
        "metrics-server",
        "kwok",
        "kube-controller-manager",
        "kube-scheduler",
        "kube-apiserver",
    )
    for kind in order:
        group = [c.processes[kind] for c in lab.clusters.values() if kind in c.processes]
        ended = procs.terminate([p.pid for p in group if p.pid], lab.marker)
        stopped += [p.name for p in group if p.pid in ended]
    if lab.etcd and lab.etcd.pid and procs.terminate([lab.etcd.pid], lab.marker):
        stopped.append("etcd")
    # Processes the state does not name (a restart recorded by another process, a crash
    # between spawn and save) still carry the lab's paths on their command line.
    stray = procs.find(lab.marker)
    if stray:
        stopped += [f"pid {pid}" for pid in procs.terminate(stray, lab.marker)]
    for proc in lab.all_processes():
        proc.pid = None
    lab.ready = False
    if lab.node_address:
        nodeaddress.release(lab.node_address)
    shutil.rmtree(lab.data_dir, ignore_errors=True)
    if Path(lab.state_dir).is_dir():
        lab.save()
    return stopped


def load_running(state_dir: Path) -> LabState:
    lab = state.load(state_dir.resolve())
    if lab is None:
        raise LabError(f"no lab in {state_dir} (no {state.STATE_FILE}); start one with `python -m e2e up`")
    return lab


def down(state_dir: Path) -> list[str]:
    return teardown(load_running(state_dir))


def cluster_of(lab: LabState, name: str) -> ClusterState:
    if name not in lab.clusters:
        raise LabError(f"no cluster {name!r} in this lab; clusters: {', '.join(lab.clusters)}")
    return lab.clusters[name]


#: Seconds a stopped kube-apiserver gets to exit before SIGKILL (stop_cluster).
STOP_GRACE = 2.0


def stop_cluster(state_dir: Path, name: str) -> None:
    """Stop one cluster's kube-apiserver (an outage); its other processes keep running."""
    lab = load_running(state_dir)
    proc = cluster_of(lab, name).processes["kube-apiserver"]
    if not procs.alive(proc.pid, lab.marker):
        raise LabError(f"{name} kube-apiserver is not running")
    # It refuses connections at once on SIGTERM, then lingers until killed (10 s by default):
    # the outage has begun either way, and a test waiting on the stop need not wait for that.
    procs.terminate([proc.pid] if proc.pid else [], lab.marker, grace=STOP_GRACE)
    proc.pid = None
    lab.record(proc)


async def start_cluster(state_dir: Path, name: str, *, fresh_components: bool = True) -> None:
    """Restart one cluster's kube-apiserver with its original flags and wait until it is ready.

    With `fresh_components` its scheduler, controller manager and KWOK are restarted too, as a
    control plane comes back together: left running, they reconnect with backoff (their watches
    wait up to a minute), and whatever the next test asks of that cluster waits with them (the
    pod-security test after the outage tests: 76 s instead of 12). The scheduler and controller
    manager are stopped before the apiserver starts: with leader election (the default, which
    the lab turns off) they exit within their 10 s renew deadline of an outage. One that lived
    through it reconnects with health data older than the node grace (40 s) and marks every node
    Unknown and its pods not ready, which a real one never does (CI saw it as a second status
    write of ours, putting Ready back like a kubelet)."""
    lab = load_running(state_dir)
    cluster = cluster_of(lab, name)
    proc = cluster.processes["kube-apiserver"]
    if procs.alive(proc.pid, lab.marker):
        raise LabError(f"{name} kube-apiserver is already running")
    if not lab.etcd or not procs.alive(lab.etcd.pid, lab.marker):
        raise LabError("the lab's etcd is not running; bring the lab up again")
    if not ports.is_free(cluster.apiserver_port):
        raise LabError(f"port {cluster.apiserver_port} is in use; cannot restart {name} kube-apiserver")
    if fresh_components:
        elected = [p for n, p in cluster.processes.items() if n in ("kube-scheduler", "kube-controller-manager")]
        await asyncio.to_thread(procs.terminate, [p.pid for p in elected if p.pid], lab.marker)
    _start(lab, proc)
    try:
        await _wait_apiserver(lab, cluster, START_TIMEOUT)
    except LabError:
        procs.terminate([proc.pid] if proc.pid else [], lab.marker)
        proc.pid = None
        lab.record(proc)
        raise
    if fresh_components:
        await _restart_components(lab, cluster)


async def restart_components(state_dir: Path, name: str) -> None:
    """Restart one cluster's scheduler, controller manager and KWOK; its apiserver keeps running."""
    lab = load_running(state_dir)
    await _restart_components(lab, cluster_of(lab, name))


async def _restart_components(lab: LabState, cluster: ClusterState) -> None:
    names = [n for n in ("kube-scheduler", "kube-controller-manager", "kwok") if n in cluster.processes]
    running = [cluster.processes[n] for n in names]
    await asyncio.to_thread(procs.terminate, [p.pid for p in running if p.pid], lab.marker)
    if "kwok" in names:
        await _release_node_leases(lab, cluster)
    async with aiohttp.ClientSession() as session:
        for proc in running:
            _start(lab, proc)
        for proc in running:
            port = next((a.partition("=")[2] for a in proc.argv if a.startswith("--secure-port=")), None)
            if port:
                healthz = functools.partial(_http_ok, session, f"https://127.0.0.1:{port}/healthz")
                await _wait(lab, proc, healthz, what=proc.name, timeout=START_TIMEOUT)
        await _wait(
            lab, running[-1], lambda: _cluster_ready(lab, cluster), what=f"{cluster.name} ready", timeout=START_TIMEOUT
        )


async def _release_node_leases(lab: LabState, cluster: ClusterState) -> None:
    """Delete the node leases a stopped KWOK held. KWOK names itself anew at each start, so a new
    one would leave its nodes (and their pods' stages) alone until the old leases expired, 40 s
    later; a restarted kubelet renews its node's lease at once, and so does KWOK once the lease
    is gone."""
    access = load_kubeconfig(lab.kubeconfig(cluster.name))
    async with KubeClient(access, user_agent="vkprovider-lab", request_timeout=10) as client:
        listed = await client.list("/api/v1/nodes", params={"labelSelector": "type=kwok"})
        for node in listed["items"]:
            with contextlib.suppress(NotFound):
                await client.delete(
                    f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node['metadata']['name']}"
                )


def provider_config(lab: LabState, provider: str, *, node: str = "vk-lab", port: int = 10250) -> str:
    """Settings for `vkprovider run --config` against this lab's front end (`offline`)."""
    config: dict[str, Any] = {
        "kube": {"kubeconfig": str(lab.kubeconfig("offline"))},
        "node": {"name": node, "provider_id": provider},
        "http": {"port": port, "bind": "127.0.0.1"},
        "provider": {"type": provider},
    }
    if lab.node_address:
        # Advertised and listened on, so the apiserver's node proxy reaches it (e2e.nodeaddress).
        config["node"]["address"] = lab.node_address
        config["http"]["bind"] = lab.node_address
    if provider == "federation":
        config["provider"]["federation"] = {
            "members": [
                {"name": name, "kubeconfig": str(lab.kubeconfig(name))}
                for name, cluster in lab.clusters.items()
                if cluster.role == "member"
            ]
        }
    return yaml.safe_dump(config, sort_keys=False)
