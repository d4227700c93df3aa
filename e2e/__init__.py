"""The lab: real Kubernetes control planes as plain processes, for tests and the demo.

One front-end (offline) cluster and N member (online) clusters, each with its own kube-apiserver,
kube-scheduler and kube-controller-manager over a shared etcd on tmpfs, simulated nodes driven by
KWOK, and an online load generator. Binaries are built from pinned Go modules into a per-user
cache (`e2e.binaries`). Entry points: `python -m e2e` (the lab CLI) and the pytest fixture in
`e2e.fixtures`.
"""
