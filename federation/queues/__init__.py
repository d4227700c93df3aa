"""Queues in front of the virtual node: Kueue's quota for the virtual node's ResourceFlavor kept
equal to what the node offers now, so Kueue admits no more than the tide can hold and preempts
by its own rules when the tide goes out (beyond what MultiKueue does: it sends whole workloads
to clusters, and never learns that a cluster's spare capacity shrank).

- quota: the ClusterQueue's resource groups with the flavor's nominalQuota set (pure);
- kueue: reads the ClusterQueue and writes it when the quota changed (I/O).

May import: federation.config, federation.capacity (quantities).
Must not import: members, dispatch, reclaim, tenancy, streams, usage, view or agent.
"""
