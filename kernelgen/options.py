"""Settings read from the environment, in one place."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """kernelgen's cache directory joined with ``parts``: ``$KERNELGEN_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/kernelgen``, else ``~/.cache/kernelgen``. Not created here."""
    root = os.environ.get("KERNELGEN_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache"), "kernelgen")
    return Path(root, *parts)
