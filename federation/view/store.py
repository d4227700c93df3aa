"""The view kept across restarts: the capacity history and the reclaims kept, in one JSON file
(`provider.federation.history.file`), read when the provider starts, written every
`save_interval` seconds and when it stops. A new file replaces the old one whole (written beside
it, then renamed), so a crash mid-write leaves the previous one.

Without it both live in memory only, and a restarted provider (or a standby that becomes
leader) starts them empty. A file that cannot be read is logged and left alone; the provider
starts empty and overwrites it at its first save.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from federation.view.history import History
from federation.view.reclaims import ReclaimLog
from vkprovider import logs

VERSION = 1


class ViewStore:
    def __init__(self, path: str, history: History, reclaims: ReclaimLog, *, interval: float) -> None:
        self.path = Path(path) if path else None  # None: memory only (every call does nothing)
        self.history = history
        self.reclaims = reclaims
        self.interval = interval
        self._log = logs.get("view-store", path=path)

    def load(self) -> bool:
        """Take over the file's history and reclaims, if it holds a readable one."""
        if self.path is None:
            return False
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("version") != VERSION:
                raise ValueError(f"not a version {VERSION} view file")
            self.history.load(data.get("history") or {})
            self.reclaims.load(data.get("reclaims") or [])
        except FileNotFoundError:
            return False
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self._log.warning("view file not read; starting empty", error=str(exc))
            return False
        self._log.info("view read", series=len(self.history.keys()), reclaims=len(self.reclaims))
        return True

    def dump(self) -> bytes:
        body = {"version": VERSION, "history": self.history.dump(), "reclaims": self.reclaims.dump()}
        return json.dumps(body, separators=(",", ":")).encode()

    async def save(self) -> None:
        """Write the file anew (the dump taken on the loop, the write in a thread)."""
        if self.path is None:
            return
        data = self.dump()
        try:
            await asyncio.to_thread(self._write, data)
        except OSError as exc:
            self._log.warning("view file not written", error=str(exc))

    def _write(self, data: bytes) -> None:
        assert self.path is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        temporary.write_bytes(data)
        os.replace(temporary, self.path)

    async def run(self) -> None:
        """Save every `interval` seconds until cancelled (the provider saves once more when it stops)."""
        while True:
            await asyncio.sleep(self.interval)
            await self.save()
