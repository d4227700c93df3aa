"""Usage of our pods for the kubelet's stats endpoints (`/stats/summary`, `/metrics/resource`).

- reader: the members' Metrics API (PodMetrics of our pods), at most once per member per
  `usage_interval` (I/O);
- summary: the samples as the kubelet's Summary, CPU rates integrated into counters (pure);
- stats: the members of a virtual node and our pods there, read through `PodIndex` (dispatch's
  reports, handed in by the provider).

May import: federation.members (for the types it reads), federation.capacity (quantities).
Must not import: dispatch, reclaim, tenancy, streams, view or agent.
"""
