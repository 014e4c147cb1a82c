"""Tuning configurations: one point in a kernel's tunable space, hashable so it can key a
results database and be passed back to ``emit`` as options."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, order=True)
class Config:
    """Emitter options, sorted by name (``Config.of(local_size=64)``)."""

    values: tuple[tuple[str, Any], ...] = field(default=())

    @classmethod
    def of(cls, **values: Any) -> Config:
        return cls(tuple(sorted(values.items())))

    def as_options(self) -> dict[str, Any]:
        """Keyword options for ``FusedOp.emit`` / ``kernelgen.kernel.emit``."""
        return dict(self.values)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{k}={v}" for k, v in self.values) + "}" if self.values \
            else "{default}"


def config_from_metadata(metadata: dict[str, Any]) -> Config:
    """The configuration a kernel was generated with, read back from its metadata."""
    tunables = metadata.get("tunables", {})
    return Config.of(**{k: v for k, v in tunables.items() if k != "index_type"})
