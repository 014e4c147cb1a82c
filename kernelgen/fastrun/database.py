"""The Fast-Run database: measured results that persist across runs (MegEngine's Fast-Run cache).

SQLite in WAL mode: every write is one transaction, so a crash mid-write leaves the previous
state and two processes tuning at once serialise on the file lock. Keys are canonical JSON of
arbitrary fields (operator signature, shapes, dtypes, layout, backend, device, compiler,
kernelgen version, ...), so the same store serves tile configurations, yellow fusion decisions
and, later, IOS stage latencies. A file that is not a valid database is moved aside and rebuilt;
it never stops a run.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..options import cache_dir

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,      -- sha256 of the canonical fields
    fields TEXT NOT NULL,      -- the canonical JSON, for people and for queries
    value TEXT NOT NULL,       -- JSON: what was decided (a config, fused or not, ...)
    ms REAL,                   -- the measured median, when there is one
    created REAL NOT NULL
);
"""


def default_path() -> Path:
    """``fastrun.sqlite`` in kernelgen's cache directory (``options.cache_dir``)."""
    return cache_dir("fastrun.sqlite")


def canonical(fields: Mapping[str, Any]) -> str:
    """Key fields as canonical JSON (sorted keys, no whitespace): order never matters."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)


class FastRunDB:
    """A persistent, crash-safe, multi-process store of measured results."""

    def __init__(self, path: str | Path | None = None, timeout_s: float = 60.0) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._open()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _open(self) -> None:
        """Open, check and, if the file is damaged, move it aside and start afresh."""
        try:
            conn = self._connect()
            ok = conn.execute("PRAGMA quick_check").fetchone()[0] == "ok"
            if ok:
                _init_schema(conn)
                version = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                ok = version is not None and int(version[0]) == SCHEMA_VERSION
            if not ok:
                conn.close()
                self._rebuild("failed its integrity or schema check")
                return
            self._local.conn = conn
        except sqlite3.DatabaseError as exc:  # "file is not a database", malformed pages, ...
            self._rebuild(str(exc))

    def _rebuild(self, why: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time() * 1e3)}")
        for suffix in ("", "-wal", "-shm"):
            p = Path(str(self.path) + suffix)
            if p.exists():
                os.replace(p, Path(str(aside) + suffix))
        warnings.warn(f"Fast-Run database {self.path} {why}; moved to {aside} and rebuilt",
                      RuntimeWarning, stacklevel=3)
        conn = self._connect()
        _init_schema(conn)
        self._local.conn = conn

    @property
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:  # another thread: its own connection
            conn = self._connect()
            self._local.conn = conn
        return conn

    @staticmethod
    def key(fields: Mapping[str, Any]) -> str:
        return hashlib.sha256(canonical(fields).encode()).hexdigest()

    def get(self, fields: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored ``{"value": ..., "ms": ...}`` for these fields, or None."""
        row = self._conn.execute("SELECT value, ms FROM results WHERE key = ?",
                                 (self.key(fields),)).fetchone()
        return None if row is None else {"value": json.loads(row[0]), "ms": row[1]}

    def put(self, fields: Mapping[str, Any], value: Any, ms: float | None = None) -> None:
        """Store (or replace) one result, atomically."""
        with _transaction(self._conn):
            self._conn.execute(
                "INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?)",
                (self.key(fields), canonical(fields), json.dumps(value), ms, time.time()))

    def __len__(self) -> int:
        return int(self._conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def entries(self) -> Iterator[tuple[dict[str, Any], Any, float | None]]:
        for fields, value, ms in self._conn.execute("SELECT fields, value, ms FROM results"):
            yield json.loads(fields), json.loads(value), ms

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def _init_schema(conn: sqlite3.Connection) -> None:
    with _transaction(conn):
        for statement in filter(str.strip, _SCHEMA.split(";")):
            conn.execute(statement)
        conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE takes the write lock up front, so concurrent writers queue, not fail."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
