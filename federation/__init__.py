"""federation: the provider that pools member clusters behind virtual nodes.

It owns member clusters, capacity summaries, placement (job pinning, gang, fit by shape), the
translation of pods into members and of their status back, reclaim and the capacity agent.
"""
