"""The tuner and its Fast-Run database: correctness gating, caching, constraints, budget, and a
store that survives concurrent writers, a crash mid-write and a corrupt file."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import require

import kernelgen as kg
from kernelgen.backends import Config
from kernelgen.fastrun import FastRunDB, canonical
from kernelgen.tune import tune


def test_put_get_and_canonical_keys(tmp_path: Path) -> None:
    db = FastRunDB(tmp_path / "db.sqlite")
    db.put({"kernel": "abc", "backend": "opencl", "shape": [3, 5]}, {"local_size": 64}, 1.5)
    got = db.get({"shape": [3, 5], "backend": "opencl", "kernel": "abc"})  # any field order
    assert got == {"value": {"local_size": 64}, "ms": 1.5}
    assert db.get({"kernel": "abc", "backend": "neon", "shape": [3, 5]}) is None
    assert canonical({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    db.put({"kernel": "abc", "backend": "opencl", "shape": [3, 5]}, {"local_size": 256}, 1.0)
    assert len(db) == 1 and db.get({"kernel": "abc", "backend": "opencl",
                                    "shape": [3, 5]})["value"] == {"local_size": 256}


_WRITER = textwrap.dedent("""
    import sys
    from autotune import FastRunDB
    db = FastRunDB(sys.argv[1])
    for i in range(200):
        db.put({"writer": sys.argv[2], "i": i}, {"i": i}, float(i))
""")


def test_two_processes_writing_at_once(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    FastRunDB(path).close()
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), w]) for w in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    db = FastRunDB(path)
    assert len(db) == 400
    assert db.get({"writer": "b", "i": 199}) == {"value": {"i": 199}, "ms": 199.0}
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


_CRASHER = textwrap.dedent("""
    import os, sys
    from autotune import FastRunDB
    db = FastRunDB(sys.argv[1])
    db.put({"k": "committed"}, 1)
    conn = db._conn
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO results VALUES ('x', '{}', '2', NULL, 0)")
    os._exit(9)  # dies inside the transaction, before COMMIT
""")


def test_crash_mid_write_leaves_a_valid_database(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    assert subprocess.run([sys.executable, "-c", _CRASHER, str(path)]).returncode == 9
    db = FastRunDB(path)
    assert db.get({"k": "committed"}) == {"value": 1, "ms": None}
    assert len(db) == 1  # the uncommitted row is gone
    db.put({"k": "after"}, 2)  # and the file takes writes again


def test_corrupt_file_is_moved_aside_and_rebuilt(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.warns(RuntimeWarning, match="moved to"):
        db = FastRunDB(path)
    db.put({"k": 1}, {"ok": True})
    assert db.get({"k": 1})["value"] == {"ok": True}
    assert list(tmp_path.glob("db.sqlite.corrupt-*"))


def _softmax_loop() -> object:
    return kg.fuse(kg.softmax(kg.tensor("x", (8, 300)), 1)).lower()


def test_tuner_rejects_a_wrong_candidate(tmp_path: Path) -> None:
    """A deliberately wrong kernel is discarded even though it would be the fastest."""
    require("opencl")
    loop = _softmax_loop()
    wrong = kg.fuse(kg.exp(kg.tensor("x", (8, 300)))).emit("opencl")  # same signature, no max
    configs = [Config.of(local_size=64), Config.of(local_size=0xBAD)]

    def build(config: Config):
        if config.as_options()["local_size"] == 0xBAD:
            return wrong
        return kg.compile_loop(loop, "opencl", **config.as_options())

    result = tune(loop, "opencl", configs=configs, build=build, db=FastRunDB(tmp_path / "db"),
                  repeat=3)
    status = {c.config.as_options()["local_size"]: c.status for c in result.candidates}
    assert status == {64: "ok", 0xBAD: "wrong"}
    assert result.best == Config.of(local_size=64)


def test_tuner_caches_and_respects_constraints_and_budget(tmp_path: Path) -> None:
    require("opencl")
    loop = _softmax_loop()
    db = FastRunDB(tmp_path / "db")
    space = [Config.of(local_size=ls) for ls in (64, 128, 256)]
    first = tune(loop, "opencl", configs=space, db=db, repeat=3,
                 constraint=lambda c: "too small" if c.as_options()["local_size"] < 100 else None)
    assert [c.status for c in first.candidates][0] == "rejected: too small"
    assert first.best.as_options()["local_size"] in (128, 256) and not first.from_cache
    again = tune(loop, "opencl", configs=space, db=db)
    assert again.from_cache and again.best == first.best and again.candidates == []
    budgeted = tune(loop, "opencl", configs=space, db=db, use_cache=False, budget_s=0.0,
                    repeat=3)
    assert [c.status for c in budgeted.candidates][1:] == ["skipped: budget"] * 2
    inputs = [np.random.default_rng(1).standard_normal((8, 300)).astype(np.float32)]
    explicit = tune(loop, "opencl", inputs, configs=space[:1], db=db, use_cache=False, repeat=3)
    assert explicit.candidates[0].status == "ok"


def test_no_correct_candidate_is_an_error(tmp_path: Path) -> None:
    require("opencl")
    loop = _softmax_loop()
    wrong = kg.fuse(kg.exp(kg.tensor("x", (8, 300)))).emit("opencl")
    with pytest.raises(RuntimeError, match="no correct candidate"):
        tune(loop, "opencl", configs=[Config.of()], build=lambda c: wrong,
             db=FastRunDB(tmp_path / "db"))
    assert os.path.exists(tmp_path / "db")


def test_emit_tuned_uses_the_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require("opencl")
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    fused = kg.fuse(kg.matmul(kg.tensor("a", (20, 12)), kg.tensor("b", (12, 9))))
    first = fused.emit("opencl", tuning="measure")
    db = FastRunDB(tmp_path / "fastrun.sqlite")
    assert len(db) == 1
    (_, value, _), = db.entries()
    # the stored tunables are what the emitted kernel was built with (tiles may clamp to the shape)
    assert first.source == fused.emit("opencl", tuning="none", **value).source
    second = fused.emit("opencl", tuning="measure")  # from the database, no new entry
    assert second.source == first.source and len(db) == 1
