"""OpenCL C through PyOpenCL: one ``__kernel`` per fused block, on whatever OpenCL device the
process finds (PoCL on these machines)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...ir.loop import LoopKernel
from ...lower import unroll
from ...lower.contraction import operand_has_reduction
from .. import templates
from ..base import Backend, Config, Emitted
from . import runtime as rt
from .emit import CAPABILITIES, WINDOW_ROWS, emit_opencl, opencl_contraction, opencl_window


@dataclass(frozen=True)
class OpenCL(Backend):
    def problem(self) -> str | None:
        try:
            rt.device()
        except Exception as exc:  # noqa: BLE001 - any failure means no usable device
            return f"OpenCL device unavailable (needs pyopencl + PoCL): {exc}"
        return None

    def device_identity(self) -> str:
        return rt.device().name

    def template_digest(self) -> str:
        return templates.digest(self.name)

    def search_space(self, loop: LoopKernel) -> list[Config]:
        return search_space(loop)

    def emit(self, loop: LoopKernel, options: Mapping[str, Any]) -> Emitted:
        renamed = {"schedule": "reduce_strategy", "pack": "pack_b"}  # step 1 only
        options = {renamed.get(k, k): v for k, v in options.items()}
        source, launch, extra = emit_opencl(loop, capabilities=self.caps, **options)
        geometry: dict[str, Any] = {
            "global_size": list(launch.global_size),
            "local_size": list(launch.local_size) if launch.local_size else None}
        if launch.scratch:
            geometry.update(args="the inputs, the outputs, then the scratch buffer",
                            scratch_bytes=4 * launch.scratch)
        if launch.pack is not None:  # launched first, filling the scratch buffer
            geometry["pack"] = {"kernel": f"{loop.name}_pack",
                                "global_size": list(launch.pack.global_size),
                                "local_size": list(launch.pack.local_size),
                                "args": "the inputs, then the scratch buffer"}
        runtime = rt.OpenCLRuntime(source, loop.name, launch, len(loop.inputs))
        return Emitted(source, geometry, extra, runtime)


def search_space(loop: LoopKernel) -> list[Config]:
    c = opencl_contraction(loop)
    if c is not None and not c.rows:  # depthwise: one row, columns in vectors
        tiles = [Config.of(tile_m=1, tile_n=n) for n in (32, 16, 48, 64)]
        window = opencl_window(loop)
        if window is None:
            return tiles
        # the default's window rows first, then the others and a few group sizes
        rows = sorted(window.row_choices,
                      key=lambda r: (r > WINDOW_ROWS, -r if r <= WINDOW_ROWS else r))
        return [Config.of(), *(Config.of(reduce_strategy="window", window_rows=r,
                                         local_size=ls)
                               for r in rows[:4] for ls in (8, 32)), *tiles]
    if c is not None:  # register tiles of the contraction templates
        # rows x columns; columns in float16 vectors (8 or 4 lanes on short runs)
        # (6x64: 293 GFLOP/s on im2col's 64x576x3136 GEMM, against 222 for 8x32)
        tiles = [Config.of(tile_m=m, tile_n=n) for m, n in
                 ((8, 32), (8, 48), (6, 64), (4, 64), (12, 32), (6, 32), (8, 16), (4, 16),
                  (4, 4))]
        # AGO: the emitter's own tile spans the producer once; most others recompute it
        ago = operand_has_reduction(c.left) or operand_has_reduction(c.right)
        if ago:
            return [Config.of(), *tiles]
        # the right operand read in place, packed by each column tile's item, or packed
        # by a first kernel: each way for the five likeliest tiles first, so a short
        # budget still measures every one
        ways = ({"pack_b": False}, {"pack_b": True, "pack_in_tile": True},
                {"pack_b": True, "pack_in_tile": False})
        return [*(Config.of(**t.as_options(), **way) for t in tiles[:5] for way in ways),
                *(Config.of(**t.as_options(), pack_b=False) for t in tiles[5:])]
    if loop.staged:  # a staged row is one work-item's array; queries a work-item share loads
        return [Config.of(), *(Config.of(reduce_strategy="row", group_rows=r)
                               for r in unroll.group_row_choices(loop)),
                *(Config.of(reduce_strategy="item", local_size=ls) for ls in (256, 64))]
    strategies: list[str | None] = [None]
    if loop.hoisted:
        strategies += ["row", "group", "item"]
    configs = [Config.of(**({"local_size": ls} | ({"reduce_strategy": st} if st else {})))
               for st in strategies for ls in (256, 64, 1024)]
    plans = unroll.ranked(loop)
    if plans:  # the default takes the first; the next two and one point per item too
        configs += [Config.of(local_size=ls, unroll=p)
                    for p in (*plans[1:3], unroll.none(loop)) for ls in (256, 1024)]
    return configs


BACKEND = OpenCL("opencl", CAPABILITIES, suffix="cl", comment="//")
