"""The 'item' and 'row' schedules of a staged kernel (``lower/staging.py``, attention's score
rows): the group points (queries) a work-item computes together, the width of the 'row'
schedule's vectors and how many of them a step of a staged row computes, and whether its keys
come from a transposed panel (``panel.py``)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...ir.loop import LoopKernel
from ...lower import unroll
from ...lower.staging import shared_terms_only
from ..base import Capabilities
from . import panel
from .columns import few_registers

# A staged 'row' in float16 vectors with fma: 1.4-1.6x float8 (hand-written, attention); the
# widest the device builds, up to this
STAGED_ROW_WIDTH = 16


def decisions(loop: LoopKernel, kind: str, options: Mapping[str, Any], caps: Capabilities
              ) -> dict[str, Any]:
    """The schedule fields of an 'item' or 'row' ``kind``: the queries a work-item computes
    (``group_rows``), and for 'row' its vector width and key panel (the loop it prints then
    reads the panel), as ``options`` ask or by default."""
    rows = unroll.choose_group_rows(loop, options.get("group_rows"), share=kind == "row")
    fields: dict[str, Any] = {"group_rows": rows if loop.staged else None}
    if kind != "row":
        return fields
    widest = staged_row_width(loop, caps)  # the explicit vector loops' width
    width = max((w for w in caps.vector_widths if w <= widest), default=caps.vector_widths[-1])
    fields["vector_width"] = width if loop.staged else caps.vector_width
    found = panel.key_read(loop)
    keys = panel.choose(loop, found, caps, rows, width, options.get("panel"),
                        options.get("panel_rows"))
    if keys is not None:
        fields.update(loop=panel.rewrite(loop, keys), plan=keys, panel=True,
                      panel_rows=keys.item_rows)
    elif found is not None:
        fields["panel"] = False
    requested = options.get("row_vectors")  # or the panel's, where a panel serves the keys
    fields["row_vectors"] = keys.vectors if keys is not None and requested is None else \
        unroll.choose_row_vectors(loop, requested, not few_registers(caps))
    return fields


def staged_row_width(loop: LoopKernel, caps: Capabilities) -> int:
    """The widest vector of a staged 'row' kernel: ``STAGED_ROW_WIDTH``, or one register's
    lanes on a CPU with 16 SIMD registers where the staged rows compute reductions of their
    own (attention's score row: a vector of sums for each of ``group_rows`` queries, which in
    float16 fill all 16 AVX2 registers). Measured round-robin on PoCL, AMD EPYC (AVX2), 8 queries
    a work-item: float8 against float16 1.50x (8 heads x 256 x 64), 1.47x (12 x 128 x 64), 1.19x
    (4 x 128 x 64); a softmax's staged exp row keeps float16 (float8 0.90x at 1536x128 and
    4096x1024)."""
    if few_registers(caps) and caps.register_lanes and not shared_terms_only(loop):
        return min(STAGED_ROW_WIDTH, caps.register_lanes)
    return STAGED_ROW_WIDTH
