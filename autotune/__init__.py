"""Autotuning: a search over each kernel's tunables that keeps only candidates whose output
matches the reference, and a persistent, crash-safe Fast-Run database of the results."""
from .config import Config, config_from_metadata
from .database import FastRunDB, canonical, default_path
from .tune import (Candidate, TuneResult, algorithm_key, search_space, stored_algorithm,
                   stored_options, tune, tune_algorithm, tuning_key)

__all__ = ["Candidate", "Config", "FastRunDB", "TuneResult", "algorithm_key", "canonical",
           "config_from_metadata", "default_path", "search_space", "stored_algorithm",
           "stored_options", "tune", "tune_algorithm", "tuning_key"]
