"""Deprecated: moved to ``kernelgen.mapping_types``. This shim re-exports it for one release."""
import warnings

from kernelgen.mapping_types import *  # noqa: F401,F403
from kernelgen.mapping_types import __all__  # noqa: F401

warnings.warn("the top-level 'mapping_types' package moved to 'kernelgen.mapping_types'",
              DeprecationWarning, stacklevel=2)
