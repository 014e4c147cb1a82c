"""The backends, found by name through one registry. Each is a folder beside this file."""
from __future__ import annotations

from ..errors import UnsupportedError
from .base import Backend, Capabilities, Config, Runtime, Schedule, Source
from .neon import BACKEND as NEON
from .opencl import BACKEND as OPENCL
from .triton import BACKEND as TRITON

REGISTRY: dict[str, Backend] = {b.name: b for b in (OPENCL, NEON, TRITON)}
DEFAULT = OPENCL.name  # what ``emit()`` and ``compile()`` use when no backend is named


def get(backend: str | Backend) -> Backend:
    """The backend named ``backend``, bound to the device it generates for (``bound``); a
    ``Backend`` passes through bound (one generating for a declared device, say)."""
    if isinstance(backend, Backend):
        return backend.bound()
    if backend not in REGISTRY:
        raise UnsupportedError(str(backend), "a backend", f"kernelgen (backends: "
                               f"{', '.join(REGISTRY)})")
    return REGISTRY[backend].bound()


def names() -> list[str]:
    return list(REGISTRY)


__all__ = ["DEFAULT", "REGISTRY", "Backend", "Capabilities", "Config", "Runtime", "Schedule",
           "Source", "get", "names"]
