"""DNNFusion's fusion table (Table 3, as reconstructed in docs/algorithms.md), as data."""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

from .types import MappingType

OTO, OTM, MTM = MappingType.ONE_TO_ONE, MappingType.ONE_TO_MANY, MappingType.MANY_TO_MANY
REORG, SHUF = MappingType.REORGANIZE, MappingType.SHUFFLE


class Colour(enum.Enum):
    """Whether fusing a (first -> second) pair pays off."""

    GREEN = "green"    # always fuse
    YELLOW = "yellow"  # fuse only where a measurement says it is faster
    RED = "red"        # never fuse

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class FusionRule:
    """One cell of the table: fusing ``first`` (the producer) into ``second`` (the consumer)."""

    first: MappingType
    second: MappingType
    fused: MappingType | None  # None for red cells: there is no fused operator
    colour: Colour
    reason: str

    def __str__(self) -> str:
        fused = self.fused.value if self.fused else "not fused"
        return f"{self.first} -> {self.second}: {self.colour} ({fused}): {self.reason}"


_OTO_IDENTITY = "One-to-One is the identity of fusion: the pair takes the other operator's type"
_RECOMPUTE = ("the producer's values are needed by several consumer windows, so fusing recomputes "
              "or reloads them")
_REORG_CHEAP = "a pure index remap folds into the other operator's index arithmetic for free"
_LAYOUT = ("the remap changes which elements a many-to-many or one-to-many loop touches "
           "together; whether locality survives must be measured")

# (first, second) -> (fused type, colour, reason). Rows are producers, columns consumers.
_TABLE: dict[tuple[MappingType, MappingType], tuple[MappingType | None, Colour, str]] = {
    (OTO, OTO): (OTO, Colour.GREEN, _OTO_IDENTITY),
    (OTO, OTM): (OTM, Colour.GREEN, _OTO_IDENTITY),
    (OTO, MTM): (MTM, Colour.GREEN, _OTO_IDENTITY),
    (OTO, REORG): (REORG, Colour.GREEN, _OTO_IDENTITY),
    (OTO, SHUF): (SHUF, Colour.GREEN, _OTO_IDENTITY),
    (OTM, OTO): (OTM, Colour.GREEN, _OTO_IDENTITY),
    (OTM, OTM): (OTM, Colour.YELLOW, "two expansions compose, but the index arithmetic may cost "
                 "more than the intermediate tensor saves"),
    (OTM, MTM): (None, Colour.RED, "the expanded values would be recomputed or reloaded "
                 "inside every reduction window"),
    (OTM, REORG): (OTM, Colour.YELLOW, _LAYOUT),
    (OTM, SHUF): (OTM, Colour.YELLOW, _LAYOUT),
    (MTM, OTO): (MTM, Colour.GREEN, _OTO_IDENTITY),
    (MTM, OTM): (MTM, Colour.YELLOW, "each reduced value feeds several outputs; fusing recomputes "
                 "the reduction per output unless the schedule hoists it"),
    (MTM, MTM): (None, Colour.RED, "two reductions/contractions: " + _RECOMPUTE
                 + " (AGO's intensive fusion relaxes this cell under its tiling constraint)"),
    (MTM, REORG): (MTM, Colour.YELLOW, _LAYOUT),
    (MTM, SHUF): (MTM, Colour.YELLOW, _LAYOUT),
    (REORG, OTO): (REORG, Colour.GREEN, _OTO_IDENTITY),
    (REORG, OTM): (OTM, Colour.YELLOW, _LAYOUT),
    (REORG, MTM): (MTM, Colour.YELLOW, _LAYOUT),
    (REORG, REORG): (REORG, Colour.GREEN, _REORG_CHEAP),
    (REORG, SHUF): (REORG, Colour.GREEN, _REORG_CHEAP),
    (SHUF, OTO): (SHUF, Colour.GREEN, _OTO_IDENTITY),
    (SHUF, OTM): (OTM, Colour.YELLOW, _LAYOUT),
    (SHUF, MTM): (MTM, Colour.YELLOW, _LAYOUT),
    (SHUF, REORG): (REORG, Colour.GREEN, _REORG_CHEAP),
    (SHUF, SHUF): (SHUF, Colour.GREEN, _REORG_CHEAP),
}

_CONSERVATIVE_REASON = ("conservative switch: a One-to-One producer inlined into a heavy consumer "
                        "is recomputed once per window (cheap for Relu, not for Exp/Erf), "
                        "so measure")


def fusion_rule(first: MappingType, second: MappingType, *,
                conservative_oto_into_heavy: bool = False) -> FusionRule:
    """The rule for fusing a ``first``-type producer into a ``second``-type consumer.

    With ``conservative_oto_into_heavy`` the two contested cells One-to-One -> One-to-Many and
    One-to-One -> Many-to-Many become yellow (the kkkeevvvin/tvm port's reading of the paper).
    """
    fused, colour, reason = _TABLE[(first, second)]
    if conservative_oto_into_heavy and first is OTO and second in (OTM, MTM):
        colour, reason = Colour.YELLOW, _CONSERVATIVE_REASON
    return FusionRule(first, second, fused, colour, reason)


Cell = tuple[MappingType, MappingType]


_FREE_RESHAPE = ("a reshape whose index arithmetic folds back to the flat offset moves no element "
                 "and changes no loop's locality, so it fuses as One-to-One does")


def reshape_rule(first: MappingType, second: MappingType, *, free_first: bool,
                 free_second: bool) -> FusionRule | None:
    """The green rule for an edge with a free reshape on a side that would otherwise be a
    Reorganize cell of ``_LAYOUT``'s (``free_first``/``free_second``: that side is such a
    reshape, ``classify.folds_to_flat``); None when the table's own rule stands."""
    as_first = OTO if free_first and first is REORG else first
    as_second = OTO if free_second and second is REORG else second
    if _TABLE[(first, second)][1] is Colour.GREEN or (as_first, as_second) == (first, second):
        return None
    fused, colour, _ = _TABLE[(as_first, as_second)]
    return FusionRule(first, second, fused, colour, _FREE_RESHAPE) \
        if colour is Colour.GREEN else None


_KEPT_RUNS = ("the remap moves whole runs of the producer's innermost axis (its stride there 1, "
              "runs of a multiple of 16 elements), so the producer's loop still writes "
              "contiguous vectors, only to other places: the remap becomes its epilogue's store "
              "offset")
_REDUCED_RUNS = ("the consumer reads the remapped operand in whole runs along its reduction (its "
                 "stride there 1, runs of a multiple of 16 elements), as an NT product reads "
                 "transpose(K): its tiles pack those runs into panels")


def run_rule(first: MappingType, second: MappingType, *, keeps_runs: bool = False,
             reads_runs: bool = False) -> FusionRule | None:
    """The green rule for a remap next to a Many-to-Many operator that keeps contiguous runs,
    cells the table leaves to measurement for remaps in general: the producer's innermost runs
    moved whole (``keeps_runs``: ``classify.keeps_runs`` of the consumer's index map), or a
    remapped operand the consumer reduces along its runs (``reads_runs``:
    ``classify.reads_runs_along_reduction`` of the composed map). None when the table's own
    rule stands."""
    if keeps_runs and first is MTM and second in (REORG, SHUF):
        return FusionRule(first, second, MTM, Colour.GREEN, _KEPT_RUNS)
    if reads_runs and first in (REORG, SHUF) and second is MTM:
        return FusionRule(first, second, MTM, Colour.GREEN, _REDUCED_RUNS)
    return None


def fusion_table(*, conservative_oto_into_heavy: bool = False) -> dict[Cell, FusionRule]:
    """All 25 cells."""
    return {(a, b): fusion_rule(a, b, conservative_oto_into_heavy=conservative_oto_into_heavy)
            for a, b in itertools.product(MappingType, MappingType)}
