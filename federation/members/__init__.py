"""A member as the provider holds it (I/O).

- fleet: the set of members, added, reconfigured, drained and removed at run time;
- member: one member, its capacity source (direct watches, or nothing while its kubeconfig
  cannot be used) and where it stands;
- watch: direct mode, one member's nodes, pods and NodeResourceTopologies into an inventory;
- pods: our pods there, indexed by the front-end pod they run, their job and their notices;
- scope: for a tenant, the namespaces its pods may be in (its registry), each listed and watched;
- tokens: a tenant's short-lived token, renewed and watched for revocation;
- objects: MemberCluster objects in the front end, and their status;
- outages (pure): the two clocks of a member that stopped answering, and what its pods show;
- disruption (pure): why a member pod went away, and the front end's terminal status for it;
- orphans: member pods whose front-end pods are gone, deleted;
- announcer: jobs told that their member stopped answering.

May import: federation.config, federation.capacity, the shared modules (labels, bands, jobs,
podsecurity) and the runtime. Must not import: the features (dispatch, reclaim, tenancy,
streams, view, agent), which stand on it.
"""
