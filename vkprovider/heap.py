"""Giving freed heap memory back to the operating system.

A burst of pods allocates and frees far more than the provider keeps: each watch event is
decoded (about 12 KB of objects for a pod), each request and answer buffered. Python returns
its own small-object arenas once they are empty, but what the C allocator (glibc malloc) served,
larger blocks such as pods kept as bytes and dict tables, stays in the process's resident set
as holes between live blocks. `malloc_trim(0)` hands those pages back. The trim runs only after
the heap has been busy (a Go runtime's scavenger does the same job), and not at all where the C
library is not glibc.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import sys
from collections.abc import Callable

#: Seconds between looks; a trim walks the heap (a few ms for 10,000 pods).
INTERVAL = 30.0


def _glibc_trim() -> Callable[[], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None  # not glibc (musl has no malloc_trim)
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return lambda: int(trim(0))


async def trim_periodically(
    busy: Callable[[], int], *, interval: float = INTERVAL, trim: Callable[[], int] | None = None
) -> None:
    """Trim (glibc's, unless `trim` is given) every `interval` seconds in which `busy()` (a
    counter of work done, such as pod syncs) moved; until cancelled."""
    trim = trim or _glibc_trim()
    if trim is None:
        return
    last = busy()
    while True:
        await asyncio.sleep(interval)
        now = busy()
        if now != last:
            last = now
            trim()
