"""The lab's state directory: what runs where, written as it starts so that `down` (or a
failed `up`) can always find and stop every process it started.

Layout of DIR:
  state.json                 this file's data
  kubeconfig/<cluster>.yaml  admin kubeconfigs (the contract other tools rely on)
  clusters/<cluster>/        PKI and configuration of one cluster
  logs/<process>.log         every process's output
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"
LOCK_FILE = "state.lock"
FORMAT = 1


@dataclass(kw_only=True)
class ProcessState:
    name: str
    argv: list[str]
    log: str
    pid: int | None = None


@dataclass(kw_only=True)
class ClusterState:
    name: str
    role: str  # "offline" or "member"
    apiserver_port: int
    profile: str | None = None
    nodes: int = 0
    processes: dict[str, ProcessState] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"


@dataclass(kw_only=True)
class LabState:
    state_dir: str
    lab_id: str
    data_dir: str  # on tmpfs: etcd's data
    version: str
    etcd: ProcessState | None = None
    clusters: dict[str, ClusterState] = field(default_factory=dict)
    ready: bool = False
    #: An address of the lab's own the apiservers proxy to (e2e.nodeaddress); None without root.
    node_address: str | None = None
    format: int = FORMAT

    @property
    def root(self) -> Path:
        return Path(self.state_dir)

    @property
    def marker(self) -> str:
        """A string on the command line of every lab process (paths under the state or data dir).
        It ends with "/": the lab in /tmp/lab must not take /tmp/lab-2's processes for its own."""
        return self.lab_id.rstrip("/") + "/"

    def kubeconfig(self, cluster: str) -> Path:
        return self.root / "kubeconfig" / f"{cluster}.yaml"

    def all_processes(self) -> list[ProcessState]:
        procs = [p for c in self.clusters.values() for p in c.processes.values()]
        return procs + ([self.etcd] if self.etcd else [])

    def save(self) -> None:
        with _locked(self.root):
            self._write()

    def record(self, proc: ProcessState) -> None:
        """Write one process's pid into the state file as the file has it now, every other entry
        left alone: two clusters restarted at once (one test's member outage while another's runs)
        each load the state, and a whole save by one would put back the other's old pids."""
        with _locked(self.root):
            current = load(self.root)
            found = next((p for p in current.all_processes() if p.name == proc.name), None) if current else None
            if current is None or found is None:
                self._write()  # a process `up` is adding: this object is the only writer
                return
            found.pid = proc.pid
            current._write()

    def _write(self) -> None:
        path = self.root / STATE_FILE
        tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        os.replace(tmp, path)


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    """The state file's lock, across processes and threads (each call opens its own descriptor)."""
    with open(root / LOCK_FILE, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _process(data: dict[str, Any] | None) -> ProcessState | None:
    return ProcessState(**data) if data else None


def load(state_dir: Path) -> LabState | None:
    """The recorded state, or None when DIR holds no lab."""
    path = state_dir / STATE_FILE
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    clusters = {}
    for name, c in data.pop("clusters").items():
        procs = {k: ProcessState(**v) for k, v in c.pop("processes").items()}
        clusters[name] = ClusterState(**c, processes=procs)
    etcd = _process(data.pop("etcd"))
    return LabState(**data, etcd=etcd, clusters=clusters)
