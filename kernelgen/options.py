"""Settings read from the environment, in one place, and what happens when the cache directory
they name cannot be used: a cache never stops the library. An unusable directory (read-only, a
regular file, on a read-only filesystem) gives one ``CacheWarning`` naming
``KERNELGEN_CACHE_DIR``, and files that must exist to run a kernel go to a private temporary
directory for this process instead."""
from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import warnings
from pathlib import Path

_lock = threading.Lock()
_usable: dict[Path, Path] = {}   # a directory asked for -> where its files go in this process
_warned: set[str] = set()


class CacheWarning(RuntimeWarning):
    """kernelgen's cache could not be used as it is; the library goes on without it."""


def cache_dir(*parts: str) -> Path:
    """kernelgen's cache directory joined with ``parts``: ``$KERNELGEN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/kernelgen``, else ``~/.cache/kernelgen``. Not created here."""
    root = os.environ.get("KERNELGEN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"), "kernelgen")
    return Path(root, *parts)


def warn_cache(message: str) -> None:
    """Warn once per process about a cache problem; the message says what was done instead."""
    with _lock:
        if message in _warned:
            return
        _warned.add(message)
    warnings.warn(f"{message} (KERNELGEN_CACHE_DIR sets kernelgen's cache directory)",
                  CacheWarning, stacklevel=3)


def warn_unwritable(directory: Path) -> None:
    """The one warning for a cache directory that cannot be written: it names the cache
    directory itself when that is the problem, so the database and each backend's files say it
    once between them."""
    root = cache_dir()
    if directory.is_relative_to(root) and not (root.is_dir() and os.access(root, os.W_OK)):
        directory = root
    warn_cache(f"the cache directory {directory} is not a writable directory: nothing is "
               "cached across runs; kernels are built in a private temporary directory")


def writable_cache_dir(*parts: str) -> Path:
    """``cache_dir(*parts)``, created, when files can be written there; else (with one
    ``CacheWarning``) a private temporary directory removed when the process exits."""
    wanted = cache_dir(*parts)
    with _lock:
        known = _usable.get(wanted)
    if known is not None and known.is_dir():
        return known
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        # os.access says yes to root and to a read-only mount: write to be sure
        fd, probe = tempfile.mkstemp(dir=wanted, prefix=".probe-")
        os.close(fd)
        os.unlink(probe)
        usable = wanted
    except OSError:
        usable = Path(tempfile.mkdtemp(prefix="kernelgen-"))
        atexit.register(shutil.rmtree, usable, ignore_errors=True)
        warn_unwritable(wanted)
    with _lock:
        _usable[wanted] = usable
    return usable
