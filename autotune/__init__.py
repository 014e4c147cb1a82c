"""Autotuning: a search over each kernel's tunables that keeps only candidates whose output
matches the reference, and a persistent, crash-safe Fast-Run database of the results."""
from .config import Config, config_from_metadata
from .database import FastRunDB, canonical, default_path
from .tune import Candidate, TuneResult, search_space, tune, tuning_key

__all__ = ["Candidate", "Config", "FastRunDB", "TuneResult", "canonical", "config_from_metadata",
           "default_path", "search_space", "tune", "tuning_key"]
