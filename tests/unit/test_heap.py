"""vkprovider.heap: the trim runs after busy intervals only, and glibc's is found here."""

from __future__ import annotations

import asyncio
import contextlib

from vkprovider import heap


def test_glibc_trim_is_found_on_this_machine_and_runs() -> None:
    trim = heap._glibc_trim()
    assert trim is not None
    assert trim() in (0, 1)


async def test_the_heap_is_trimmed_after_an_interval_with_work_and_not_after_an_idle_one() -> None:
    work = [0]
    trims: list[int] = []
    interval = 0.05

    def trim() -> int:
        trims.append(work[0])
        return 1

    task = asyncio.create_task(heap.trim_periodically(lambda: work[0], interval=interval, trim=trim), name="trim")
    try:
        await asyncio.sleep(interval * 2.5)  # two idle intervals
        assert trims == []
        work[0] = 5
        await asyncio.sleep(interval * 1.2)
        assert trims == [5]
        await asyncio.sleep(interval * 2)  # idle again
        assert trims == [5]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_the_mmap_threshold_is_fixed_on_glibc() -> None:
    assert heap.fix_mmap_threshold()
