"""What members can lend (pure: no I/O, no asyncio).

- quantities: Kubernetes quantities as integers (millicores, bytes), vector arithmetic;
- inventory: a member's nodes, pods and NUMA zones as compact records, kept from watch events;
- summary: a member's capacity models (requests headroom, colocation), windows and caps, as sums
  and shapes (`MemberCapacity`), computed incrementally (`Summarizer`);
- reservations: room our pods take before the member's summary counts them;
- nodes: the virtual nodes' status from their members' summaries, damped against noise.

May import: federation.labels, the runtime's types (vkprovider.objects, vkprovider.provider).
Must not import: any other federation package (members feed it, features read it), nor
anything that talks to an apiserver.
"""
