"""The kubelet HTTP API of the virtual node (HTTPS, port 10250): logs, pods, stats and health,
authenticated and authorized the way a kubelet does it (client certificates, TokenReview,
SubjectAccessReview on nodes/<name>)."""
