"""Packing pods (vkprovider.podzip): what goes in comes out, and packing stays off fresh pages
under the provider's fixed mmap threshold (vkprovider.heap)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
    # blocks (zlib's deflate.c): window, prev, head, pending buffer.
    window = 1 << abs(podzip.WBITS)
    blocks = [2 * window, 2 * window, 2 << (podzip.MEM_LEVEL + 7), 5 << (podzip.MEM_LEVEL + 6)]
    assert max(blocks) < heap.MMAP_THRESHOLD


def test_packing_under_the_fixed_threshold_takes_no_fresh_pages() -> None:
    """What the arithmetic above stands for, in a process of its own (the threshold is
    process-wide): 2,000 packs fault in a few pages at most, not two per pack."""
    probe = (
        "import resource\n"
        "from vkprovider import heap, podzip\n"
        "from tests.unit.test_podzip import POD\n"
        "assert heap.fix_mmap_threshold()\n"
        "podzip.pack(POD)\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "for _ in range(2000):\n"
        "    podzip.unpack(podzip.pack(POD))\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n"
    )
    root = Path(__file__).resolve().parents[2]  # the probe imports this module, wherever pytest runs
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60, cwd=root
    )
    assert int(out.stdout) < 200, f"{out.stdout.strip()} page faults in 2,000 packs"
