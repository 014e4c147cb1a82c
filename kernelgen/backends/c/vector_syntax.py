"""How a backend writes float32 vector code (``VectorSyntax``): one table per backend
(``opencl/language.py``, ``neon/language.py``), read by the vector printer
(``vector.py``) and the dot products (``dots.py``)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class VectorSyntax:
    """How a backend writes ``width``-lane float32 code. Formats take ``{0}``, ``{1}`` operands;
    ``functions`` maps primitives to vector expressions (absent: no vector form)."""

    width: int
    vtype: str                      # float8, float32x4_t
    mtype: str                      # the mask type comparisons return
    load: str                       # {ptr}, {off}
    store: str                      # {ptr}, {off}, {v}
    broadcast: str                  # scalar float -> vector
    broadcast_mask: str             # scalar bool -> mask
    select: str                     # {0} mask, {1} if true, {2} if false
    functions: Mapping[str, str]
    combine: Mapping[str, str]      # reduction kind -> vector combine of {a}, {b}
    horizontal: Mapping[str, str]   # reduction kind -> scalar from vector {v} ('' = halving)
    iota: str = ""                  # the lane numbers as an int mask-type vector ('' = none)
    # Where vectors take no C operators (NEON intrinsics), lane masks are built by call:
    # ``lane_ints`` the int vector {first} + lane * {step}, ``sign_masks`` a mask of an int
    # vector {0} against 0 by relation ('>=', '>', '<=', '<'), ``mask_and`` two masks' lanes
    # joined, ``mask_load`` a mask from a C int array of -1 and 0
    lane_ints: str = ""
    # a select between masks (booleans), where ``select`` takes float vectors only ('' = it)
    select_mask: str = ""
    sign_masks: Mapping[str, str] = field(default_factory=dict)
    mask_and: str = "({0}) & ({1})"
    mask_load: str = ""
    # every second element from {ptr} + {off} ('' = none): a stride-2 window's run (NEON's
    # deinterleaving vld2q_f32); it reads ``stride2_past`` elements past its last lane's (the
    # odd one after it, which may lie past the buffer: such a read is tested at run time)
    load_stride2: str = ""
    stride2_past: int = 1
    # integer and boolean lanes read as float32 vectors, by the stored dtype's name: a
    # contiguous load of {ptr} + {off} converted (an attention mask's int64 in an epilogue);
    # a dtype absent here keeps its cast lane by lane
    load_convert: Mapping[str, str] = field(default_factory=dict)
    fma: str = ""                   # {0} * {1} + {2} fused ('' = none)
    lane: str = ""                  # lane {j} (an int) of vector {v} ('' = none)
    compose: str = ""               # a vector from comma-separated lane values {0} ('' = none)
    # a square of ``width`` vectors {0} (comma-separated) transposed at once, as a value of
    # ``transposed_type`` whose ``.val[c]`` is column c ('' = columns composed from lanes)
    transpose: str = ""
    transposed_type: str = ""
    # Sums of neighbouring lanes, for dot products along a reduction ('' = none): ``pair_sum``
    # the vector of {0}'s pair sums, then {1}'s; ``half_sum`` {0}'s pair sums as a vector of
    # ``half_type``; ``join`` two such halves as one vector
    pair_sum: str = ""
    half_sum: str = ""
    half_type: str = ""
    join: str = ""

    @property
    def lane_masks(self) -> bool:
        """Whether the backend builds masks from lane numbers (a guard linear in the axis)."""
        return bool(self.iota or self.lane_ints)
