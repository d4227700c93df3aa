"""The memory provider's optional state file (SQLite): the pods it runs, and every create call
per provider run. It stands in for a remote backend that outlives the runtime, so restart tests
can check that a pod is never created twice."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

from vkprovider.memory.timeline import Record


class StateFile:
    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS pods (key TEXT PRIMARY KEY, body TEXT, created REAL,"
            " action TEXT, action_at REAL, deleting_at REAL)"
        )
        self._db.execute("CREATE TABLE IF NOT EXISTS creates (uid TEXT, at REAL)")
        # Every create call, whatever its outcome, per provider run: a second call for a pod
        # the backend already has is accepted silently (idempotence), so only this table shows
        # a runtime that asks twice.
        self._db.execute("CREATE TABLE IF NOT EXISTS create_calls (uid TEXT, run INTEGER, outcome TEXT, at REAL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS runs (run INTEGER PRIMARY KEY AUTOINCREMENT, at REAL)")
        #: This process's run of the backend.
        self.run = int(self._db.execute("INSERT INTO runs (at) VALUES (?)", (self._clock(),)).lastrowid or 0)

    def records(self) -> dict[str, Record]:
        """The pods as the last run left them, by key."""
        out = {}
        for key, body, created, action, action_at, deleting_at in self._db.execute("SELECT * FROM pods"):
            out[key] = Record(json.loads(body), created, action, action_at, deleting_at)
        return out

    def save(self, record: Record) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO pods VALUES (?, ?, ?, ?, ?, ?)",
            (record.key, json.dumps(record.pod), record.created, record.action, record.action_at, record.deleting_at),
        )

    def created(self, record: Record) -> None:
        """A new pod: it and the record of its creation land together or not at all, so a crash
        in between can neither hide a create nor allow a second one."""
        with self._db:
            self._db.execute("BEGIN")
            self.save(record)
            self._db.execute("INSERT INTO creates VALUES (?, ?)", (record.uid, record.created))
            self.called(record.uid, "created")

    def drop(self, key: str) -> None:
        self._db.execute("DELETE FROM pods WHERE key = ?", (key,))

    def called(self, uid: str, outcome: str) -> None:
        """A create call and its outcome (created, repeated, refused)."""
        self._db.execute("INSERT INTO create_calls VALUES (?, ?, ?, ?)", (uid, self.run, outcome, self._clock()))

    def create_count(self, uid: str) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM creates WHERE uid = ?", (uid,)).fetchone()[0])

    def close(self) -> None:
        self._db.close()
