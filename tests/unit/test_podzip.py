"""Packing pods (vkprovider.podzip): what goes in comes out, and packing stays off fresh pages
under the provider's fixed mmap threshold (vkprovider.heap)."""

from __future__ import annotations

from vkprovider import heap, podzip

POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "u-1", "labels": {"app": "x"}},
    "spec": {"nodeName": "vk", "containers": [{"name": "c", "image": "busybox", "resources": {}}]},
    "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
}


def test_a_pod_comes_back_as_it_went_in() -> None:
    raw = podzip.pack(POD)
    assert podzip.unpack(raw) == POD
    assert len(raw) < 400


def test_every_block_deflate_allocates_is_below_the_fixed_mmap_threshold() -> None:
    # A block at or above the threshold is mapped and unmapped on every pack. deflateInit2's
    # blocks (zlib's deflate.c): window, prev, head, pending buffer. The page faults this saves
    # are a machine's counter, measured by the benchmarks (bench.endtoend: minor faults per pod).
    window = 1 << abs(podzip.WBITS)
    blocks = [2 * window, 2 * window, 2 << (podzip.MEM_LEVEL + 7), 5 << (podzip.MEM_LEVEL + 6)]
    assert max(blocks) < heap.MMAP_THRESHOLD
