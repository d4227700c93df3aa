"""Hand profiling of memory: runs `vkprovider.cli`; on SIGUSR2 writes where its memory is to
$BENCH_MEMTRACE.

Two modes:
  - traced (the default): under tracemalloc, the largest allocation sites by line and by
    6-frame traceback. tracemalloc slows the provider several times and its own tables sit in
    the C heap, so CPU and RSS figures from such a run mean nothing.
  - `BENCH_MEMTRACE_MODE=stats`: no tracemalloc, only the allocators' own books: Python's
    small-object arenas (blocks in use, free blocks inside arenas) and glibc's heap (in use,
    free inside it, mmapped), next to the RSS. What separates live bytes from RSS is
    fragmentation, and only this mode shows it undistorted.
Either way the file's first line is `total N bytes`: the bytes traced, or in stats mode the
bytes live in both allocators.

Used by the benches' Provider when BENCH_MEMTRACE is set (bench.common).
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import signal
import sys
import tempfile
import tracemalloc
from types import FrameType

from vkprovider import cli


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ["arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks"]
    ]


def _glibc() -> dict[str, int]:
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    mallinfo2.restype = _Mallinfo2
    info = mallinfo2()
    return {"heap": info.arena, "in use": info.uordblks, "free": info.fordblks, "mmapped": info.hblkhd}


def _pymalloc() -> dict[str, int]:
    """sys._debugmallocstats's arena summary (empty under tracemalloc, which it does not report
    through); it writes to the C stderr, read back through a file."""
    with tempfile.TemporaryFile("w+") as out:
        saved = os.dup(2)
        os.dup2(out.fileno(), 2)
        try:
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()
    wanted = {
        "arenas allocated current": "arenas",
        "bytes in allocated blocks": "in use",
        "bytes in available blocks": "free in pools",
    }
    stats = {}
    for line in text.splitlines():
        match = re.match(r"# (.+?)\s+=\s+([\d,]+)", line)
        if match and match[1] in wanted:
            stats[wanted[match[1]]] = int(match[2].replace(",", ""))
    return stats


def _rss() -> list[str]:
    with open(f"/proc/{os.getpid()}/status") as status:
        return [" ".join(line.split()) for line in status if line.startswith(("VmRSS", "VmHWM", "RssAnon"))]


def _stats_lines() -> tuple[int, list[str]]:
    glibc, pymalloc = _glibc(), _pymalloc()
    live = glibc.get("in use", 0) + glibc.get("mmapped", 0) + pymalloc.get("in use", 0)
    lines = [*_rss(), f"glibc {glibc}", f"pymalloc {pymalloc} (arenas of 1 MiB)"]
    return live, lines


def _traced_lines() -> tuple[int, list[str]]:
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    total = sum(stat.size for stat in snapshot.statistics("filename"))
    current, peak = tracemalloc.get_traced_memory()
    lines = [*_rss(), f"glibc {_glibc()}", f"tracemalloc current {current} peak since the last dump {peak}"]
    lines.append("== by line")
    lines += [str(stat) for stat in snapshot.statistics("lineno")[:40]]
    lines.append("== by traceback")
    for stat in snapshot.statistics("traceback")[:25]:
        lines.append(f"{stat.size / 1e6:.2f} MB in {stat.count} blocks")
        lines += ["    " + line for line in stat.traceback.format()]
    return total, lines


def _dump(signum: int, frame: FrameType | None) -> None:
    gc.collect()
    total, lines = _traced_lines() if tracemalloc.is_tracing() else _stats_lines()
    path = os.environ["BENCH_MEMTRACE"]
    with open(path + ".tmp", "w") as out:
        out.write("\n".join([f"total {total} bytes", *lines]) + "\n")
    os.replace(path + ".tmp", path)  # whole, for the bench that waits for it
    if tracemalloc.is_tracing():
        tracemalloc.reset_peak()


def main() -> None:
    if os.environ.get("BENCH_MEMTRACE_MODE") != "stats":
        tracemalloc.start(6)
    signal.signal(signal.SIGUSR2, _dump)
    sys.argv[0] = "vkprovider"
    sys.exit(cli.main(sys.argv[1:]))


if __name__ == "__main__":
    main()
