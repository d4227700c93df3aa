"""`kubectl logs`, `exec`, `attach` and `port-forward` on pods of the virtual node, relayed to
their member pods (I/O).

- locate: the member pod of a front-end pod, through `MemberPodIndex` (dispatch's reports,
  handed in by the provider), and the member's refusals as errors that say which side failed;
- logs: the member's `pods/log`, relayed as it arrives;
- exec: `pods/exec` and `pods/attach` over a WebSocket (v5.channel.k8s.io, else v4);
- forward: one `pods/portforward` WebSocket per forwarded connection;
- session: the channel messages and the idle and total limits every stream shares.

May import: federation.members (for the types it reads) and the runtime's provider contract.
Must not import: dispatch, reclaim, tenancy, view or agent.
"""
