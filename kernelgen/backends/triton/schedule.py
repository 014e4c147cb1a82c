"""Triton schedules, chosen here (``choose``) and printed by ``emit.py``:

- ``elementwise``: each program handles ``block`` consecutive domain points (masked at the
  ragged end); domain indices come from the flat position by ``//`` and ``%``.
- ``row``: one program per group point; each hoisted reduction runs over its extent in blocks of
  ``block_r`` lanes (masked lanes hold the combiner's identity) and finishes with ``tl.sum`` or
  ``tl.reduce`` (NaN-propagating max and min, products); then the group's elements go out in
  blocks of ``block_e``. A single-kernel softmax is one such program per row. A staged producer row
  (``lower/staging.py``: attention's score row) is one block of the program, the row padded to
  a power of two; every reduction over it reads the block whole, and one computed per element
  (the output's sum over the keys) runs as a ``[row, block_e]`` tile reduced along the row.
- ``tiled``: a contraction as ``tl.dot`` tiles of ``tile`` = (rows, columns, reduction); with
  ``pack``, each program first gathers its block of rows of the left operand (prologue applied:
  a conv's patches) into a contiguous panel of a scratch buffer, then sweeps every column block
  over it.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ...ir.expr import Expr, Load, Reduce, extent, walk
from ...ir.loop import LoopKernel, inline_staged
from ...lower.contraction import Contraction, contraction, operand_buffers, operand_has_reduction
from ...lower.staging import unstage
from ...shapes import prod
from ..printer import shape_of
from ..base import (PRIVATE, Capabilities, Config, Schedule, check_derived, check_options,
                    option_names)

KINDS = ("elementwise", "row", "tiled")
DEFAULT_BLOCK = 1024
MAX_ROW_BLOCK = 1024
DEFAULT_TILE = (32, 32, 32)
# A per-element reduction over a staged row is a [row, block_e] tile: by default at most this
# many elements (32 KiB of float32 per program), and never past Triton's limit on a tensor.
STAGED_TILE = 1 << 13
MAX_TENSOR = 1 << 20


@dataclass(frozen=True)
class TritonSchedule(Schedule):
    block: int | None = None    # 'elementwise': domain points a program handles
    block_r: int | None = None  # 'row': lanes a hoisted reduction runs in
    block_e: int | None = None  # 'row': a group's elements stored at a time
    contraction: Contraction | None = field(default=None, repr=False, compare=False,
                                            metadata=PRIVATE)

    def facts(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.pack and self.contraction is not None:  # the left operand's panels
            out["packed_operand_reads"] = operand_buffers(self.contraction.left)
        if self.loop.staged:  # each staged producer row once per program (lower/staging.py)
            out.update(staged_rows=[st.buffer.name for st in self.loop.staged],
                       producer_redundancy=1.0)
        return out


OPTIONS = option_names(TritonSchedule)
DERIVED = ("index_type",)


def choose(loop: LoopKernel, options: Mapping[str, Any], caps: Capabilities) -> TritonSchedule:
    """The schedule of ``loop``: the options given, checked, and defaults for the rest."""
    check_options("Triton", options, OPTIONS, TritonSchedule)
    caps.check(loop)
    requested = options.get("schedule")
    if requested is not None and requested not in KINDS:
        raise ValueError(f"kernel '{loop.name}': Triton schedule must be one of {KINDS}, got "
                         f"{requested!r}")
    for name in ("block", "block_r", "block_e"):
        if options.get(name) is not None:
            pow2(options[name], name)
    for name in ("group_rows", "row_vectors"):  # a program's block holds its rows' points
        if options.get(name) not in (None, 1):
            raise ValueError(f"kernel '{loop.name}': {name} applies to the OpenCL and NEON "
                             f"'row' schedules; a Triton program computes one group point, its "
                             f"lanes set by 'block_r' and 'block_e'")
    tile = tuple(pow2(b, "tile") for b in options.get("tile") or DEFAULT_TILE)
    if len(tile) != 3 or min(tile) < 16:
        raise ValueError(f"kernel '{loop.name}': tl.dot needs tile=(rows, columns, reduction), "
                         f"each a power of two of at least 16, got {tile}")
    if not staged_as_blocks(loop) or staged_sum_recomputed(loop):
        loop = unstage(loop)
    index_type = "tl.int64" if loop.needs_long_index else "tl.int32"
    c = contraction(loop) if requested in (None, "tiled") else None
    if requested == "tiled" and c is None:
        raise ValueError("schedule 'tiled' needs a contraction (one sum of a product of "
                         "operands on disjoint output axes)")
    if c is not None:
        pack = bool(options.get("pack"))
        if pack and (operand_has_reduction(c.left) or operand_has_reduction(c.right)):
            raise ValueError(f"kernel '{loop.name}': pack needs a contraction of plain "
                             f"operands; this one computes a fused producer (AGO) in its "
                             f"tiles, which a pack would materialise")
        sched = TritonSchedule("tiled", index_type, loop, tile=tile, pack=pack, contraction=c)
    elif loop.grouped:
        sched = _row(TritonSchedule("row", index_type, loop), options.get("block_r"),
                     options.get("block_e"))
    else:
        block = min(options.get("block") or DEFAULT_BLOCK, next_pow2(loop.numel))
        sched = TritonSchedule("elementwise", index_type, loop, block=block)
    if requested is not None and requested != sched.kind:
        raise ValueError(f"kernel '{loop.name}' runs the '{sched.kind}' schedule on Triton, "
                         f"not {requested!r}")
    check_derived(sched, options, DERIVED)
    return sched


def _row(base: TritonSchedule, block_r: int | None, block_e: int | None) -> TritonSchedule:
    k = base.loop
    longest = max((extent(r) for r in k.hoisted), default=1)
    count = prod(k.domain[e][1] for e in k.element_axes)
    row = staged_block(k)
    if block_e is None:  # a per-element sum over a staged row is a [row, block_e] tile
        block_e = max(1, min(next_pow2(count), MAX_ROW_BLOCK, STAGED_TILE // row))
        pow2(block_e, "block_e")
    if row * block_e > MAX_TENSOR:
        raise ValueError(f"kernel '{k.name}': block_e {block_e} makes a [{row}, {block_e}] "
                         f"tile over its staged row, past Triton's {MAX_TENSOR} elements")
    return replace(base, block_r=block_r or min(next_pow2(longest), MAX_ROW_BLOCK),
                   block_e=block_e)


def pow2(n: int, name: str) -> int:
    if n < 1 or n & (n - 1):
        raise ValueError(f"Triton block size '{name}' must be a power of two, got {n}")
    return n


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def staged_block(kernel: LoopKernel) -> int:
    """The block a staged row takes in a program: its longest row padded to a power of two
    (1 without staged rows)."""
    return max((next_pow2(st.buffer.numel) for st in kernel.staged), default=1)


def staged_as_blocks(kernel: LoopKernel) -> bool:
    """Whether every read of a staged row is along a one-axis reduction over the whole row (its
    axis symbol, the row's extent), so the row can live in one block of the program (a block
    cannot be indexed at run time), and no such reduction computed per element holds another
    (a tile inside a tile); ``lower/staging.py`` stages only such reads."""
    extents = {st.buffer.name: st.buffer.numel for st in kernel.staged}
    domain = {s for s, _ in kernel.domain}  # a row read at the element point is not a block

    def reads_row(node: Expr) -> bool:
        return isinstance(node, Reduce) and node not in kernel.hoisted and any(
            isinstance(n, Load) and n.buffer in extents for n in walk(node.body))

    for root in kernel.roots():
        for node in walk(root):
            if isinstance(node, Reduce) and reads_row(node) and (len(node.axes) != 1 or any(
                    m is not node and reads_row(m) for m in walk(node))):
                return False
            if isinstance(node, Load) and node.buffer in extents and not (
                    node.offset.is_Symbol and node.offset not in domain
                    and kernel.ranges.get(node.offset) == extents[node.buffer]):
                return False
    return True


def search_space(loop: LoopKernel) -> list[Config]:
    """The tunables worth measuring for ``loop``, the default first."""
    if contraction(loop) is not None:  # tl.dot tiles
        return [Config.of(tile=t) for t in ((32, 32, 32), (64, 64, 32), (16, 64, 32),
                                            (64, 16, 32), (128, 64, 32), (64, 128, 32))]
    if loop.staged:  # a per-element sum over a staged row is a [row, block_e] tile
        # tiles up to 4x the default
        return [Config.of()] + [Config.of(block_e=e) for e in (4, 16, 64, 256)
                                if e * staged_block(loop) <= 4 * STAGED_TILE]
    if loop.grouped:
        return [Config.of(block_r=r, block_e=e) for r in (256, 64, 1024) for e in (256, 1024)]
    return [Config.of(block=b) for b in (1024, 256, 4096)]


def staged_sum_recomputed(kernel: LoopKernel) -> bool:
    """Whether staging rewrote a reduction (now read off a staged row and summed as one block,
    in tl.sum's tree order) of which the kernel also computes copies serially: a fused
    contraction whose producer is staged for the output point's own row but recomputed for
    the other points of a softmax's max and exp-sum. The output point's value and its copies
    then differ by an ulp (a log-softmax gave -0.0059336 for -0.0059297 on an H100), so such
    a kernel runs unstaged, every copy in one order (``printer.recomputed_inside``)."""
    if not kernel.staged:
        return False
    computed = [n for root in (*(st.value for st in kernel.stores), *kernel.hoisted)
                for n in walk(root) if isinstance(n, Reduce)]
    present = set(computed)
    copies = {shape_of(n) for n in computed}
    return any(isinstance(n, Reduce) and n not in present and shape_of(n) in copies
               for st in inline_staged(kernel).stores for n in walk(st.value))
