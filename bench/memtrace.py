"""Hand profiling of memory: runs `vkprovider.cli` under tracemalloc; on SIGUSR2 writes the
largest allocation sites (by line, and by 6-frame traceback) to $BENCH_MEMTRACE.

Used by the benches' Provider when BENCH_MEMTRACE is set (bench.common); tracemalloc slows the
provider several times, so CPU figures from such a run mean nothing.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import tracemalloc
from types import FrameType

from vkprovider import cli


def _dump(signum: int, frame: FrameType | None) -> None:
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    total = sum(stat.size for stat in snapshot.statistics("filename"))
    lines = [f"total {total} bytes"]
    lines.append("== by line")
    lines += [str(stat) for stat in snapshot.statistics("lineno")[:40]]
    lines.append("== by traceback")
    for stat in snapshot.statistics("traceback")[:25]:
        lines.append(f"{stat.size / 1e6:.2f} MB in {stat.count} blocks")
        lines += ["    " + line for line in stat.traceback.format()]
    path = os.environ["BENCH_MEMTRACE"]
    with open(path + ".tmp", "w") as out:
        out.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)  # whole, for the bench that waits for it


def main() -> None:
    tracemalloc.start(6)
    signal.signal(signal.SIGUSR2, _dump)
    sys.argv[0] = "vkprovider"
    sys.exit(cli.main(sys.argv[1:]))


if __name__ == "__main__":
    main()
