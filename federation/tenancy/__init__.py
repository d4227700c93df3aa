"""A tenant's place in a member cluster: what its credential may do, and the namespaces our
pods run in.

Pure: policy (the objects onboarding creates in a member: namespaces, account, roles,
admission policy, quota, NetworkPolicy, and the fence they enforce). I/O: namespaces (a member
namespace made ready for our pods: Pod Security labels, service account, a tenant's RoleBinding,
quota and NetworkPolicy; dispatch reaches it as its NamespaceFence), onboard (`vkprovider
onboard` and `offboard`).

May import: federation.members, federation.config, federation.capacity and the shared modules
(pod security levels are federation.podsecurity, shared with the settings and dispatch).
Must not import: dispatch, reclaim, streams, view or agent.
"""
