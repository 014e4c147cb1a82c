"""Tuning configurations for generated kernels.

The search and its persistent Fast-Run database come with the intensive-operator work; what is
here now is the configuration type every emitter's tunables map onto, so kernels and the tuner
share one vocabulary.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, order=True)
class Config:
    """One point in a kernel's tunable space, hashable so it can key a results database."""

    values: tuple[tuple[str, Any], ...] = field(default=())

    @classmethod
    def of(cls, **values: Any) -> Config:
        return cls(tuple(sorted(values.items())))

    def as_options(self) -> dict[str, Any]:
        """Keyword options for ``FusedOp.emit``."""
        return dict(self.values)


def configs_from_metadata(metadata: dict[str, Any]) -> Config:
    """The configuration a kernel was generated with, read back from its metadata."""
    tunables = metadata.get("tunables", {})
    return Config.of(**{k: v for k, v in tunables.items() if k != "index_type"})
