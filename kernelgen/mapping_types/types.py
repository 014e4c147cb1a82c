"""The five DNNFusion mapping types, as a closed enum."""
from __future__ import annotations

import enum
from dataclasses import dataclass


class MappingType(enum.Enum):
    """How each output element of an operator relates to the elements of one input.

    The paper folds many-to-one (reductions) into ``MANY_TO_MANY``.
    """

    ONE_TO_ONE = "One-to-One"      # each output reads exactly one input element, order kept
    ONE_TO_MANY = "One-to-Many"    # an input element feeds several outputs (broadcast, gather)
    MANY_TO_MANY = "Many-to-Many"  # each output reads many inputs (reductions, contractions)
    REORGANIZE = "Reorganize"      # a bijection that keeps row-major element order (reshape)
    SHUFFLE = "Shuffle"            # a bijection that permutes elements (transpose)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Opaque:
    """An ONNX operator that has no index-map description, with the reason in one line."""

    reason: str

    def __str__(self) -> str:
        return f"opaque ({self.reason})"
