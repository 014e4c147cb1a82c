"""Deprecated: the tuner is ``kernelgen.tune`` and its database ``kernelgen.fastrun``. This shim
re-exports them for one release."""
import warnings

from kernelgen.backends import Config
from kernelgen.fastrun import (FastRunDB, algorithm_key, canonical, config_from_metadata,
                               default_path, stored_algorithm, stored_options, tuning_key)
from kernelgen.tune import Candidate, Measure, TuneResult, tune, tune_algorithm

__all__ = ["Candidate", "Config", "FastRunDB", "Measure", "TuneResult", "algorithm_key",
           "canonical", "config_from_metadata", "default_path", "stored_algorithm",
           "stored_options", "tune", "tune_algorithm", "tuning_key"]

warnings.warn("the top-level 'autotune' package moved to 'kernelgen.tune' (search) and "
              "'kernelgen.fastrun' (database)", DeprecationWarning, stacklevel=2)
