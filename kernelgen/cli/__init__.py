"""The ``kernelgen`` command (``python -m kernelgen``)."""
from .main import main

__all__ = ["main"]
