"""Caches never stop the library (issue 23, probe section 5): an unusable cache directory, a
read-only or damaged Fast-Run database and stored entries that are valid SQLite but wrong each
give at most one ``CacheWarning`` naming KERNELGEN_CACHE_DIR, and kernels still build, run and
match NumPy. Tests run as root, which ignores mode bits: read-only files are simulated by
denying ``os.access`` or writes, and, where ``setpriv`` can drop root's override, by a real
read-only directory in a subprocess."""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pytest
from conftest import require

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends import Config
from kernelgen.backends.neon import runtime as neon_runtime
from kernelgen.compile.tuning import Stored
from kernelgen.fastrun import FastRunDB, algorithm_key, tuning_key
from kernelgen.options import CacheWarning
from kernelgen.tune import Measure, tune

RNG = np.random.default_rng(23)


def _matmul() -> tuple[kg.FusedOp, list[np.ndarray]]:
    fused = kg.fuse(kg.matmul(kg.tensor("a", (5, 7)), kg.tensor("b", (7, 3))))
    return fused, [RNG.standard_normal((5, 7)).astype("f4"),
                   RNG.standard_normal((7, 3)).astype("f4")]


def _emit_and_check(backend: str, fused: kg.FusedOp | None = None, **options) -> kg.Kernel:
    matmul, (a, b) = _matmul()
    fused = fused or matmul
    kernel = fused.emit(backend, **options)
    np.testing.assert_allclose(kernel(a, b), a.astype("f8") @ b.astype("f8"), rtol=1e-5,
                               atol=1e-5)
    return kernel


def _cache_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, CacheWarning)]


def _deny_writes_under(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    """What a read-only ``root`` looks like to a process that mode bits apply to: os.access
    says no, and creating a file there fails with EACCES."""
    real_access, real_open = os.access, os.open

    def under(path: object) -> bool:
        return Path(os.fspath(path)).absolute().is_relative_to(root)  # type: ignore[arg-type]

    def access(path, mode, *args, **kwargs):
        if mode & os.W_OK and under(path):
            return False
        return real_access(path, mode, *args, **kwargs)

    def open_(path, flags, *args, **kwargs):
        if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR) and under(path):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "access", access)
    monkeypatch.setattr(os, "open", open_)


@pytest.mark.parametrize("backend_name", ["opencl", "neon", "triton"])
def test_cache_dir_that_is_a_regular_file(backend_name: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The library works, with one warning naming the path and KERNELGEN_CACHE_DIR, and the
    file is left as it was."""
    require(backend_name)
    cache = tmp_path / "cachefile"
    cache.write_text("not a directory")
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(cache))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _emit_and_check(backend_name)
        _emit_and_check(backend_name)  # a second kernel: no second warning
    messages = _cache_warnings(record)
    assert len(messages) == 1, messages
    assert str(cache) in messages[0] and "KERNELGEN_CACHE_DIR" in messages[0]
    assert cache.read_text() == "not a directory"


@pytest.mark.parametrize("backend_name", ["opencl", "neon", "triton"])
def test_unwritable_cache_dir(backend_name: str, tmp_path: Path,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An existing directory that cannot be written: OpenCL needs no file, NEON builds and
    Triton writes its module in a private directory instead."""
    require(backend_name)
    cache = tmp_path / "ro"
    cache.mkdir()
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(cache))
    _deny_writes_under(monkeypatch, cache)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _emit_and_check(backend_name)
    messages = _cache_warnings(record)
    assert len(messages) == 1 and "KERNELGEN_CACHE_DIR" in messages[0], messages
    assert "not a writable directory" in messages[0]
    assert not list(cache.rglob("*.so")) and not list(cache.rglob("*.py"))
    assert not (cache / "fastrun.sqlite").exists()


_READ_ONLY_SCRIPT = textwrap.dedent("""
    import sys, warnings
    import numpy as np
    import kernelgen as kg
    warnings.simplefilter("always")
    a = np.arange(35, dtype="f4").reshape(5, 7) / 7
    b = np.arange(21, dtype="f4").reshape(7, 3) / 5
    for backend in sys.argv[1:]:
        k = kg.fuse(kg.matmul(kg.tensor("a", (5, 7)), kg.tensor("b", (7, 3)))).emit(backend)
        print(backend, np.allclose(k(a, b), a.astype("f8") @ b.astype("f8"), rtol=1e-5),
              k.metadata["tuning"]["options"])
""")


def _setpriv() -> list[str]:
    """A command prefix that runs as root without the right to ignore mode bits."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to make a directory read-only to this user")
    prefix = ["setpriv", "--inh-caps=-all", "--bounding-set=-dac_override,-dac_read_search",
              "--"]
    if subprocess.run([*prefix, "true"], capture_output=True).returncode:
        pytest.skip("setpriv cannot drop capabilities here")
    return prefix


def _run_read_only(cache: Path, backends_: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KERNELGEN_CACHE_DIR": str(cache)}
    return subprocess.run([*_setpriv(), sys.executable, "-c", _READ_ONLY_SCRIPT, *backends_],
                          capture_output=True, text=True, env=env, timeout=300)


def test_real_read_only_cache_dir(tmp_path: Path) -> None:
    """Mode 555, mode bits enforced (root without CAP_DAC_OVERRIDE): the probe's case."""
    require("opencl")
    require("neon")
    cache = tmp_path / "ro"
    cache.mkdir()
    cache.chmod(0o555)
    try:
        result = _run_read_only(cache, ["opencl", "neon"])
    finally:
        cache.chmod(0o755)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["opencl True {}", "neon True {}"]
    assert result.stderr.count("CacheWarning") == 1 and "KERNELGEN_CACHE_DIR" in result.stderr
    assert not any(cache.iterdir())


def _store(db: FastRunDB, fields: dict, value: object) -> None:
    db.put(fields, value, 1.0)


@pytest.mark.parametrize("dir_mode", [0o555, 0o755], ids=["chmod -R a-w", "file 444"])
def test_real_read_only_database_is_read(dir_mode: int, tmp_path: Path) -> None:
    """A cache filled while writable, then made read-only (``chmod -R a-w``), or only its
    database made read-only (mode 444, D10): the stored tile is used, the file is neither
    moved nor changed, and there is no warning (nothing needed writing)."""
    require("opencl")
    cache = tmp_path / "filled"
    fused, _ = _matmul()
    path = cache / "fastrun.sqlite"
    db = FastRunDB(path)
    _store(db, tuning_key(fused.lower(), "opencl"), {"tile": [4, 4], "pack": False})
    db.close()
    before = path.read_bytes()
    path.chmod(0o444)
    cache.chmod(dir_mode)
    try:
        result = _run_read_only(cache, ["opencl"])
    finally:
        cache.chmod(0o755)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["opencl True {'pack': False, 'tile': (4, 4)}"]
    assert "CacheWarning" not in result.stderr
    assert path.read_bytes() == before and not list(cache.glob("*.corrupt-*"))


def test_read_only_valid_database_is_read_and_never_moved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Mode 444 in a writable directory (D10): lookups use the tuned entry, a write is skipped
    with one warning, and the file keeps its name and contents."""
    require("opencl")
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    fused, _ = _matmul()
    path = tmp_path / "fastrun.sqlite"
    db = FastRunDB(path)
    _store(db, tuning_key(fused.lower(), "opencl"), {"tile": [4, 4], "pack": False})
    db.close()
    before = path.read_bytes()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: False
                        if mode & os.W_OK and Path(p) == path else real_access(p, mode, *a, **k))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        kernel = _emit_and_check("opencl")
        assert kernel.metadata["tuning"]["options"] == {"pack": False, "tile": (4, 4)}
        ro = FastRunDB(path)
        assert ro.readonly and len(ro) == 1
        ro.put({"k": 1}, {"local_size": 64})
        ro.put({"k": 2}, {"local_size": 64})
    messages = _cache_warnings(record)
    assert len(messages) == 1 and "read-only" in messages[0], messages
    assert ro.get({"k": 1}) is None and len(ro) == 1
    assert path.read_bytes() == before
    assert not list(tmp_path.glob("*.corrupt-*"))


def test_damaged_database_that_cannot_be_moved_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file that is not a database in a directory where it cannot be renamed: the warning
    does not claim a move, the file is untouched and emit still works (D10)."""
    require("opencl")
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    path = tmp_path / "fastrun.sqlite"
    path.write_bytes(b"this is not a database" * 100)

    real_replace = os.replace

    def replace(src, dst, *args, **kwargs):
        if Path(os.fspath(src)).is_relative_to(tmp_path):
            raise PermissionError(13, "Permission denied", os.fspath(src))
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _emit_and_check("opencl")
    messages = _cache_warnings(record)
    assert len(messages) == 1, messages
    assert "could not be moved aside" in messages[0] and "moved to" not in messages[0]
    assert path.read_bytes() == b"this is not a database" * 100


def test_damaged_database_is_moved_aside_and_emit_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Random bytes or a truncated file: moved aside (the warning says where), rebuilt."""
    require("opencl")
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    fused, _ = _matmul()
    path = tmp_path / "fastrun.sqlite"
    db = FastRunDB(path)
    _store(db, tuning_key(fused.lower(), "opencl"), {"tile": [4, 4], "pack": False})
    db.close()
    path.write_bytes(path.read_bytes()[:100])  # a header and nothing else
    with pytest.warns(CacheWarning, match="moved to .*corrupt.* and rebuilt"):
        kernel = _emit_and_check("opencl")
    assert kernel.metadata["tuning"]["options"] == {}
    assert list(tmp_path.glob("fastrun.sqlite.corrupt-*"))
    assert len(FastRunDB(path)) == 0


def _foreign_database(path: Path, results: str) -> bytes:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO meta VALUES ('schema', '1')")
    conn.execute(f"CREATE TABLE results ({results})")
    conn.commit()
    conn.close()
    return path.read_bytes()


def test_wrong_schema_is_ignored_not_raised_and_not_moved(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Valid SQLite whose tables are not ours (D14): emit and tuning work, the file is
    neither moved nor changed, and one warning says why it is not used."""
    require("opencl")
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    path = tmp_path / "fastrun.sqlite"
    before = _foreign_database(path, "x")
    relu = kg.fuse(kg.relu(kg.tensor("x", (3, 7))))
    x = RNG.standard_normal((3, 7)).astype("f4")
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        _emit_and_check("opencl")
        measured = relu.emit("opencl", tuning="measure")
        np.testing.assert_array_equal(measured(x), np.maximum(x, 0))
    messages = _cache_warnings(record)
    assert len(messages) == 1 and "'results' has columns ['x']" in messages[0], messages
    assert path.read_bytes() == before and not list(tmp_path.glob("*.corrupt-*"))


def test_newer_schema_version_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "db.sqlite"
    FastRunDB(path).put({"k": 1}, {"v": 1})
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema'")
    conn.commit()
    conn.close()
    with pytest.warns(CacheWarning, match="schema version '99'"):
        db = FastRunDB(path)
    assert not db.usable and db.get({"k": 1}) is None and len(db) == 0
    db.put({"k": 2}, {"v": 2})  # skipped, not raised
    assert sqlite3.connect(path).execute("SELECT COUNT(*) FROM results").fetchone()[0] == 1


def _corrupt_value(path: Path, fields: dict, text: object) -> None:
    conn = sqlite3.connect(path)
    conn.execute("UPDATE results SET value = ? WHERE key = ?", (text, FastRunDB.key(fields)))
    conn.commit()
    conn.close()


def test_value_that_is_not_json_reads_as_missing_and_is_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require("opencl")
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    relu = kg.fuse(kg.relu(kg.tensor("x", (3, 7))))
    key = tuning_key(relu.lower(), "opencl")
    path = tmp_path / "fastrun.sqlite"
    db = FastRunDB(path)
    _store(db, key, {"local_size": 64})
    _corrupt_value(path, key, "{not json")
    assert db.get(key) is None and list(db.entries()) == []
    x = RNG.standard_normal((3, 7)).astype("f4")
    kernel = relu.emit("opencl")
    assert kernel.metadata["tuning"]["options"] == {}
    np.testing.assert_array_equal(kernel(x), np.maximum(x, 0))
    measured = relu.emit("opencl", tuning="measure")  # measured again and stored over it
    np.testing.assert_array_equal(measured(x), np.maximum(x, 0))
    hit = FastRunDB(path).get(key)
    assert hit is not None and set(hit["value"]) == {"local_size"}


BAD_CONFIGS = [{"tile": [-3, 0]}, {"tile": [0]}, {"bogus": 1}, {"tile": [4.5, 8]},
               {"local_size": "x"}, [1, 2], "tile", 7, None]


@pytest.mark.parametrize("backend_name", ["opencl", "neon", "triton"])
@pytest.mark.parametrize("value", BAD_CONFIGS, ids=[repr(v) for v in BAD_CONFIGS])
def test_invalid_stored_config_is_ignored(backend_name: str, value: object, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A stored config the backend refuses (D14): the defaults, the same source as
    tuning='none', and a correct result."""
    require(backend_name)
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(tmp_path))
    fused, _ = _matmul()
    _store(FastRunDB(tmp_path / "fastrun.sqlite"), tuning_key(fused.lower(), backend_name),
           value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        kernel = _emit_and_check(backend_name, fused)
    assert kernel.source == fused.emit(backend_name, tuning="none").source


def test_invalid_stored_config_is_measured_again_and_replaced(tmp_path: Path) -> None:
    require("opencl")
    relu = kg.fuse(kg.relu(kg.tensor("x", (3, 7))))
    loop, be = relu.lower(), backends.get("opencl")
    db = FastRunDB(tmp_path / "db.sqlite")
    key = tuning_key(loop, be)
    _store(db, key, {"local_size": 0, "bogus": 1})
    with pytest.warns(CacheWarning, match="bogus.*measuring again"):
        options = Measure(db).options(loop, be)
    assert set(options) == {"local_size"} and options["local_size"] in (64, 256, 1024)
    assert db.get(key)["value"] == options
    again = tune(loop, be, db=db)
    assert again.from_cache and again.best.as_options() == options
    # with an explicit search space, a stored config outside it is measured again
    _store(db, key, {"local_size": 64})
    fresh = tune(loop, be, configs=[Config.of(local_size=256)], db=db, repeat=2)
    assert not fresh.from_cache and db.get(key)["value"] == {"local_size": 256}


@pytest.mark.parametrize("value", [{"algorithm": "bogus"}, {"algorithm": 3}, ["direct"]])
def test_invalid_stored_conv_algorithm_is_ignored(value: object, tmp_path: Path) -> None:
    require("opencl")
    x, w = kg.tensor("x", (1, 2, 6, 5)), kg.tensor("w", (3, 2, 3, 3))
    fused = kg.fuse(kg.conv(x, w))
    db = FastRunDB(tmp_path / "db.sqlite")
    _store(db, algorithm_key(fused, "opencl"), value)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        assert Stored(db).algorithm(fused, backends.get("opencl")) is None
    xv = RNG.standard_normal((1, 2, 6, 5)).astype("f4")
    wv = RNG.standard_normal((3, 2, 3, 3)).astype("f4")
    got = fused.emit("opencl", tuning=Stored(db))(xv, wv)
    want = np.zeros((1, 3, 4, 3))
    for i in range(4):
        for j in range(3):
            want[0, :, i, j] = np.tensordot(wv.astype("f8"), xv[0, :, i:i + 3, j:j + 3],
                                            axes=([1, 2, 3], [0, 1, 2]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_the_test_suite_removes_its_cache(tmp_path: Path) -> None:
    """conftest's ``kernelgen-test-*`` directory is gone after the session; a
    KERNELGEN_TEST_CACHE given to it is kept."""
    env = {k: v for k, v in os.environ.items() if k != "KERNELGEN_TEST_CACHE"}
    env["TMPDIR"] = str(tmp_path)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--collect-only", str(Path(__file__).parent / "test_cli.py")]
    tests = Path(__file__).parents[1]
    assert subprocess.run(command, env=env, cwd=tests, capture_output=True).returncode == 0
    assert not list(tmp_path.glob("kernelgen-test-*"))
    kept = tmp_path / "given"
    kept.mkdir()
    env["KERNELGEN_TEST_CACHE"] = str(kept)
    assert subprocess.run(command, env=env, cwd=tests, capture_output=True).returncode == 0
    assert kept.is_dir()


def test_damaged_library_in_a_read_only_neon_cache(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A truncated ``.so`` in a cache that cannot be written: it can be neither loaded nor
    removed, so a fresh copy is built in the private directory and the kernel runs."""
    require("neon")
    cache = tmp_path / "ro"
    fused = kg.fuse(kg.matmul(kg.tensor("a", (5, 7)), kg.tensor("b", (7, 3))))
    neon = backends.get("neon")
    code = neon.render(neon.choose(fused.lower(), {})).code
    damaged = cache / "neon" / f"{neon_runtime.library_key(code)}.so"
    damaged.parent.mkdir(parents=True)
    damaged.write_bytes(b"\x7fELF truncated")
    monkeypatch.setenv("KERNELGEN_CACHE_DIR", str(cache))
    _deny_writes_under(monkeypatch, cache)
    real_unlink = Path.unlink

    def unlink(self: Path, missing_ok: bool = False) -> None:
        if self.is_relative_to(cache):
            raise PermissionError(13, "Permission denied", str(self))
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        _emit_and_check("neon", fused, tuning="none")
    assert damaged.read_bytes() == b"\x7fELF truncated"
    assert damaged in neon_runtime._damaged  # it was tried, and passed over
