"""The release, on the ground floor so that every module may read it."""

__version__ = "0.1.0"
