"""Front-end pods to member clusters, whole jobs at a time, and their status back.

Pure: forge (front-end pod -> member pod, gang object, status back), placement (which members
can host a gang, best first), hybrid (how much of a gang's minimum leaves for a member),
jobstate (a job's state and what each pod reports), reflect (what a copied ConfigMap, Secret
or Service holds), routing (where a pod of a routed job may run).
I/O: dispatcher (the job state machine), gang (the gang gate, its timer and rollback), pins
(the durable pin), reports (what the runtime reads), writes (member pods and gang objects),
reflector (copies and their garbage collection), nativepods (the front end's native pods),
webhook (the routing admission webhook).

May import: federation.members, federation.config, federation.capacity and the shared modules.
Must not import: reclaim, tenancy, streams, view or agent. What it needs of them is declared
here as a Protocol and handed in by the provider: `writes.NamespaceFence`
(federation.tenancy.namespaces provides it).
"""
