"""What measuring a yellow block decided: whether its one fused kernel or its split alternative
(``split.split_parts``) ran faster on a backend, with both medians. Stored in the Fast-Run
database (``fastrun.stored_verdict`` reads it back) and shown in ``FusedOp.report``."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class FusionVerdict:
    """The measured choice for one block on one backend and device."""

    backend: str
    fused: bool                          # True: the one kernel won (a tie goes to it)
    fused_ms: float                      # medians, timed round-robin in one run
    split_ms: float
    parts: tuple[tuple[str, ...], ...]   # the split alternative: each kernel's operators
    edges: tuple[str, ...] = ()          # the cut edges, with their table cells
    clear: bool = False                  # the winner's p80 below the loser's p20
    # how often the fused kernel's tiles compute each element of a producer fused into them
    # (AGO's intensive fusion: a conv inside a 1x1 conv's operand; 1.0 where there is none)
    redundancy: float = 1.0
    from_cache: bool = False             # read from the database, not measured now

    @property
    def winner(self) -> str:
        return "fused" if self.fused else "split"

    @property
    def speedup(self) -> float:
        """How many times faster the winner ran than the other."""
        fast, slow = sorted((self.fused_ms, self.split_ms))
        return slow / fast if fast > 0 else 1.0

    def __str__(self) -> str:
        kernels = f"{len(self.parts)} kernel{'s' if len(self.parts) != 1 else ''}"
        source = ", stored" if self.from_cache else ""
        margin = "" if self.clear else ", within the runs' spread"
        return (f"measured on {self.backend}{source}: fused {self.fused_ms:.3f} ms, split "
                f"({kernels}) {self.split_ms:.3f} ms: {self.winner} wins by "
                f"{self.speedup:.2f}x{margin}")

    def as_value(self) -> dict[str, Any]:
        """What the database stores (everything but where it was read from)."""
        value = asdict(self)
        value.pop("from_cache")
        value["parts"] = [list(p) for p in self.parts]
        value["edges"] = list(self.edges)
        return value

    @classmethod
    def from_value(cls, value: Any) -> FusionVerdict | None:
        """A stored value as a verdict; None when it is not one (a damaged row reads as
        missing)."""
        try:
            parts = tuple(tuple(str(n) for n in p) for p in value["parts"])
            verdict = cls(str(value["backend"]), value["fused"], float(value["fused_ms"]),
                          float(value["split_ms"]), parts,
                          tuple(str(e) for e in value.get("edges", ())),
                          value.get("clear") is True,
                          float(value.get("redundancy", 1.0)), from_cache=True)
        except (TypeError, KeyError, ValueError, AttributeError):
            return None
        return verdict if isinstance(verdict.fused, bool) else None


__all__ = ["FusionVerdict"]
