"""Running generated code: a ``Kernel`` (one launch, maybe with a packing launch before it) and
a ``Program`` (several kernels wired by buffer name), called alike (``Executable``)."""
from .kernel import Executable, Kernel, metadata
from .program import Program

__all__ = ["Executable", "Kernel", "Program", "metadata"]
