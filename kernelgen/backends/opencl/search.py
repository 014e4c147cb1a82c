"""What the tuner measures for an OpenCL kernel: the tunables worth trying, on the device the
capabilities describe (its vector widths and work-group limit), the default first."""
from __future__ import annotations

from ...ir.loop import LoopKernel
from ...lower import unroll
from ...lower.contraction import operand_has_reduction
from ..base import Capabilities, Config
from .columns import few_registers, opencl_contraction, register_tiles, swapped_plan
from .element_columns import opencl_columns
from . import panel, staged
from .schedule import row_vectorizable
from .transposed import tile_plan
from .window import is_pooling, opencl_window


def search_space(loop: LoopKernel, caps: Capabilities) -> list[Config]:
    """The tunables worth measuring for ``loop`` on the device ``caps`` describes (its vector
    widths and work-group limit), the default first."""
    widths, most = caps.vector_widths, caps.max_work_group or 1024
    c = opencl_contraction(loop, widths)
    window = opencl_window(loop, widths)
    if window is not None or (c is not None and not c.rows):
        # depthwise: one row, columns in vectors (a strided one: in the 'window' schedule only)
        tiles = [Config.of(tile=(1, n)) for n in (32, 16, 48, 64)] if c is not None else []
        if window is None:
            return tiles
        # the default's window rows first, then the nearest others and a few group sizes
        default = window.default_rows(caps)
        rows = sorted(window.row_choices, key=lambda r: (abs(r - default), -r))
        windows = [Config.of(schedule="window", window_rows=r, local_size=ls)
                   for r in rows[:4] for ls in (8, 32) if ls <= most]
        if is_pooling(window.contraction):  # or one work-item per output (a GPU's default)
            item = [Config.of(schedule="item")] if caps.simd_within_work_item else []
            return [Config.of(), *windows, *item]
        return [Config.of(), *windows, *tiles]
    if c is not None:  # register tiles of the contraction templates
        # rows x columns; columns in float16 vectors (8 or 4 lanes on short runs)
        # (6x64: 293 GFLOP/s on im2col's 64x576x3136 GEMM, against 222 for 8x32); with 16
        # registers (AVX2) in float8, the sums within 12 registers first (columns.py)
        shapes = ((6, 16), (4, 24), (4, 16), (5, 16), (3, 32), (2, 32), (6, 24), (8, 16),
                  (4, 8)) if few_registers(caps) else \
            ((8, 32), (8, 48), (6, 64), (4, 64), (12, 32), (6, 32), (8, 16), (4, 16), (4, 4))
        tiles = [Config.of(tile=t) for t in shapes]
        # AGO: each tile computes the producer once (one row tile, or a panel each column
        # tile's item packs), except where it is the broadcast operand, beyond one column tile
        if operand_has_reduction(c.left) or operand_has_reduction(c.right):
            return [Config.of(), *tiles]
        # the right operand read in place (work-groups of row tiles or of column tiles),
        # packed by each column tile's item, or packed by a first kernel: each way for the
        # five likeliest tiles first, so a short budget still measures every one
        ways = ({"pack": False, "group_columns": False}, {"pack": False, "group_columns": True},
                {"pack": True, "pack_in_tile": True}, {"pack": True, "pack_in_tile": False})
        # both operand orders with their own default tiles, next, where they can be exchanged
        orders = [Config.of(swap_operands=s) for s in (True, False)] if caps.vector_widths and \
            swapped_plan(loop, c, None, register_tiles(caps)) is not None else []
        return [Config.of(), *orders,
                *(Config.of(**t.as_options(), **way) for t in tiles[:5] for way in ways),
                *(Config.of(**t.as_options(), pack=False) for t in tiles[5:])]
    if loop.staged:  # a staged row is one work-item's array; queries a work-item share loads
        row = row_vectorizable(loop, caps)
        staged = [Config.of(schedule="row", group_rows=r) for r in
                  unroll.group_row_choices(loop)] if row else []
        if row:  # a staged row's vectors a step, each way
            staged += [Config.of(schedule="row", row_vectors=v)
                       for v in unroll.row_vector_choices(loop)]
        return [Config.of(), *staged, *(panels(loop, caps) if row else []),
                *(Config.of(schedule="item", local_size=ls) for ls in (256, 64) if ls <= most)]
    kinds: list[str | None] = [None]
    if loop.hoisted:
        kinds += ["row", "group", "item"] if row_vectorizable(loop, caps) else ["group", "item"]
    sizes = [ls for ls in (256, 64, 1024) if ls <= most]
    configs = [Config.of(**({"local_size": ls} | ({"schedule": st} if st else {})))
               for st in kinds for ls in sizes]
    if loop.hoisted and caps.simd_within_work_item and opencl_columns(loop, caps):
        # each element's reduction a vector lane, in small work-groups (few chunks of a short
        # axis still fill every core)
        configs += [Config.of(schedule="columns", local_size=ls) for ls in (8, 32) if ls <= most]
    square = [w for w in caps.vector_widths if tile_plan(loop, caps, w)]
    if square:  # remapped reads transposed in registers: each width, and one point an item
        configs += [Config.of(tile=(w, w), local_size=ls) for w in square for ls in (256, 64)
                    if ls <= most]
        configs.append(Config.of(tile=(1, 1)))
    plans = unroll.ranked(loop)
    if plans:  # the default takes the first; the next two and one point per item too
        configs += [Config.of(local_size=ls, unroll=p)
                    for p in (*plans[1:3], unroll.none(loop)) for ls in (256, 1024) if ls <= most]
    return configs


def panels(loop: LoopKernel, caps: Capabilities) -> list[Config]:
    """Where a staged score row reads its keys along the depth (``panel.key_read``): the row
    schedule without the key panel, and with it for each number of queries a work-item may
    take (``panel_rows``) at the default ``group_rows``; none where the panel cannot fit the
    device's local memory (the schedule's own decision, ``staged.decisions``, refuses it)."""
    if panel.key_read(loop) is None:
        return []
    off = Config.of(schedule="row", panel=False)
    try:
        fields = staged.decisions(loop, "row", {"panel": True}, caps)
    except ValueError:  # too few keys, or no room in local memory
        return [off]
    return [off, *(Config.of(schedule="row", panel=True, panel_rows=r)
                   for r in panel.row_choices(loop, fields["group_rows"]))]
