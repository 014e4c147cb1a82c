"""The Fast-Run database (MegEngine's name): measured results that persist across runs, and
what they are keyed on."""
from .database import FastRunDB, canonical, default_path
from .keys import (algorithm_key, config_from_metadata, fusion_key, stored_algorithm,
                   stored_config, stored_options, stored_verdict, tuning_key)

__all__ = ["FastRunDB", "algorithm_key", "canonical", "config_from_metadata", "default_path",
           "fusion_key", "stored_algorithm", "stored_config", "stored_options",
           "stored_verdict", "tuning_key"]
