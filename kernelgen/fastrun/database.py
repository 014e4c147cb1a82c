"""The Fast-Run database: measured results that persist across runs (MegEngine's Fast-Run cache).

SQLite in WAL mode: every write is one transaction, so a crash mid-write leaves the previous
state and two processes tuning at once serialise on the file lock. Keys are canonical JSON of
arbitrary fields (operator signature, shapes, dtypes, layout, backend, device, compiler,
kernelgen version, ...), so the same store serves tile configurations, yellow fusion decisions
and, later, IOS stage latencies.

The database never stops a run. A file that is not a database (or a damaged one) is moved aside
and rebuilt; a valid one is never moved: read-only, it is only read; with another schema, or in a
directory that cannot be written, it is not used. A stored value that is not JSON reads as
missing. Each of these gives one ``CacheWarning`` that says what was done.
"""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..options import cache_dir, warn_cache, warn_unwritable

SCHEMA_VERSION = 1
_COLUMNS = {"meta": ["key", "value"], "results": ["key", "fields", "value", "ms", "created"]}
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
# how a connection opens the file: read-write, read-only, and read-only where SQLite cannot
# create the WAL index beside the file (a read-only directory; nobody can write there anyway)
_READ_WRITE, _READ_ONLY, _IMMUTABLE = "rwc", "ro", "ro&immutable=1"


def default_path() -> Path:
    """``fastrun.sqlite`` in kernelgen's cache directory (``options.cache_dir``)."""
    return cache_dir("fastrun.sqlite")


def canonical(fields: Mapping[str, Any]) -> str:
    """Key fields as canonical JSON (sorted keys, no whitespace): order never matters."""
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)


class FastRunDB:
    """A persistent, crash-safe, multi-process store of measured results. ``readonly``: results
    are read but not stored; ``usable``: False when no file could be used (every lookup
    misses)."""

    def __init__(self, path: str | Path | None = None, timeout_s: float = 60.0) -> None:
        self.path = Path(path) if path is not None else default_path()
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._mode: str | None = None  # how every thread connects; None: no file in use
        self._open()

    @property
    def usable(self) -> bool:
        return self._mode is not None

    @property
    def readonly(self) -> bool:
        return self._mode != _READ_WRITE

    def _connect(self, checked: bool = True) -> sqlite3.Connection:
        """A connection in ``self._mode``; WAL mode (a write to the header) only once the file
        is ``checked`` to be ours."""
        assert self._mode is not None
        uri = f"{self.path.resolve().as_uri()}?mode={self._mode}"
        conn = sqlite3.connect(uri, uri=True, timeout=self.timeout_s, isolation_level=None)
        if checked and self._mode == _READ_WRITE:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
        return conn

    def _open(self) -> None:
        """Open read-write if the file and its directory can be written, else read-only; move
        a file that is not a database aside; else leave the database unused."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError:
            return self._unused(None)
        exists = self.path.exists()
        writable = os.access(self.path.parent, os.W_OK | os.X_OK) and (
            not exists or os.access(self.path, os.W_OK))
        if not exists and not writable:
            return self._unused(None)
        problem = "it cannot be written"
        for mode in ([_READ_WRITE] if writable else []) + [_READ_ONLY, _IMMUTABLE]:
            try:
                return self._use(mode)
            except sqlite3.DatabaseError as exc:
                # immutable reads skip locking: a page torn by a writer is no proof of damage
                if _not_a_database(exc) and mode != _IMMUTABLE:
                    return self._rebuild(str(exc))
                problem = str(exc)
                if not exists:
                    break
        self._unused(problem)

    def _use(self, mode: str) -> None:
        """Connect in ``mode`` and check the file; raises sqlite3.DatabaseError if it cannot."""
        self._mode = mode
        try:
            conn = self._connect(checked=False)
            try:
                if conn.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                    raise sqlite3.DatabaseError("database disk image is malformed "
                                                "(quick_check failed)")
                foreign = _schema_problem(conn)
                if foreign is None and mode == _READ_WRITE:
                    conn.close()
                    conn = self._connect()
                    _init_schema(conn)
            except BaseException:
                conn.close()
                raise
        except BaseException:
            self._mode = None
            raise
        if foreign is not None:  # valid SQLite but not our tables: leave it as it is
            conn.close()
            self._mode = None
            self._unused(foreign)
            return
        self._local.conn = conn

    def _unused(self, why: str | None) -> None:
        """Go on without a file; ``why`` None: its directory cannot be written."""
        self._mode = None
        if why is None:
            return warn_unwritable(self.path.parent)
        warn_cache(f"Fast-Run database {self.path} is not used: {why}; stored tunables are "
                   "not read and new results are not stored")

    def _rebuild(self, why: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.corrupt-{int(time.time() * 1e3)}")
        try:
            for suffix in ("", "-wal", "-shm"):
                p = Path(str(self.path) + suffix)
                if p.exists():
                    os.replace(p, Path(str(aside) + suffix))
        except OSError as exc:
            return self._unused(f"{why}, and it could not be moved aside "
                                f"({exc.strerror or exc})")
        try:
            self._use(_READ_WRITE)
        except sqlite3.DatabaseError as exc:
            return self._unused(f"{why}; it was moved to {aside}, but a new one could not be "
                                f"created ({exc})")
        warn_cache(f"Fast-Run database {self.path} {why}; moved to {aside} and rebuilt")

    @property
    def _conn(self) -> sqlite3.Connection | None:
        if self._mode is None:
            return None
        conn = getattr(self._local, "conn", None)
        if conn is None:  # another thread: its own connection
            conn = self._connect()
            self._local.conn = conn
        return conn

    @staticmethod
    def key(fields: Mapping[str, Any]) -> str:
        return hashlib.sha256(canonical(fields).encode()).hexdigest()

    def get(self, fields: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored ``{"value": ..., "ms": ...}`` for these fields, or None (also when the
        database cannot be read or the stored value is not JSON)."""
        try:
            conn = self._conn
            row = None if conn is None else conn.execute(
                "SELECT value, ms FROM results WHERE key = ?", (self.key(fields),)).fetchone()
        except sqlite3.Error as exc:
            warn_cache(f"Fast-Run database {self.path} could not be read ({exc}); "
                       "stored tunables are not used")
            return None
        if row is None:
            return None
        value = _json(row[0])
        if value is _INVALID:
            return None
        return {"value": value, "ms": row[1] if isinstance(row[1], (int, float)) else None}

    def put(self, fields: Mapping[str, Any], value: Any, ms: float | None = None) -> None:
        """Store (or replace) one result, atomically; skipped when the database is read-only
        (with one warning) or not in use."""
        row = (self.key(fields), canonical(fields), json.dumps(value), ms, time.time())
        if self._mode is None:  # opening it warned already
            return
        if self.readonly:
            warn_cache(f"Fast-Run database {self.path} is read-only; new results are not stored")
            return
        try:
            conn = self._conn
            assert conn is not None
            with _transaction(conn):
                conn.execute("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?)", row)
        except sqlite3.Error as exc:
            warn_cache(f"Fast-Run database {self.path} could not be written ({exc}); "
                       "new results are not stored")

    def __len__(self) -> int:
        conn = self._conn
        return 0 if conn is None else int(
            conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])

    def entries(self) -> Iterator[tuple[dict[str, Any], Any, float | None]]:
        """Every stored (fields, value, ms); rows that are not JSON are left out."""
        conn = self._conn
        if conn is None:
            return
        for fields, value, ms in conn.execute("SELECT fields, value, ms FROM results"):
            fields, value = _json(fields), _json(value)
            if isinstance(fields, dict) and value is not _INVALID:
                yield fields, value, ms

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


_INVALID = object()


def _json(text: Any) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError):
        return _INVALID


def _not_a_database(exc: sqlite3.DatabaseError) -> bool:
    """Damage, as opposed to a file that cannot be opened or written."""
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)
    return any(s in str(exc) for s in ("not a database", "malformed"))


def _schema_problem(conn: sqlite3.Connection) -> str | None:
    """Why a valid SQLite file is not a Fast-Run database of this schema, or None (also for
    an empty file, which ``_init_schema`` fills)."""
    tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE "
                                                "type = 'table'")}
    for table, columns in _COLUMNS.items():
        if table in tables:
            have = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
            if have != columns:
                return f"its table '{table}' has columns {have}, expected {columns}"
    if "meta" in tables:
        row = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is not None and str(row[0]) != str(SCHEMA_VERSION):
            return (f"it has schema version {row[0]!r}, this kernelgen reads version "
                    f"{SCHEMA_VERSION} (delete it to start afresh)")
    elif "results" in tables:
        return "it has a 'results' table but no 'meta' table"
    return None


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
