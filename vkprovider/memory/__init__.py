"""The in-memory reference provider: pods "run" in this process, following their clock.

- provider: the provider contract (lifecycle, notifications, node) over records;
- timeline (pure): each pod's status derived from its timestamps;
- statefile: the optional SQLite file that outlives the process (restart tests);
- containers: exec, attach, logs and stats of the simulated containers.
"""

from vkprovider.memory.provider import MemoryProvider
from vkprovider.memory.timeline import MemorySettings

__all__ = ["MemoryProvider", "MemorySettings"]
