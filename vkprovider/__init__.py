"""vkprovider: the virtual-kubelet runtime.

This package owns Kubernetes' node and pod contracts (node registration, lease, pod controller,
status ownership, deletion, the kubelet HTTP API) and nothing about member clusters; providers
plug in through small protocols. `vkprovider.kube` is the only package that talks to an apiserver.
"""
