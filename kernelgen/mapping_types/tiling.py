"""AGO's no-redundancy constraint, from index maps (docs/algorithms.md, AGO).

When a producer is fused into a consumer tile by tile, each consumer tile computes the producer
region it reads. Tiles whose regions overlap (a KxK halo) or repeat (a consumer tiled along an
axis it reduces over, so every tile needs the whole producer extent) recompute producer work.
``redundancy`` measures it: total producer elements computed over all consumer tiles, divided by
the producer's size. 1.0 means every producer element is computed once (AGO's |TS2| >= |TS1|);
the tuner rejects tilings above 1.0, or costs KxK halos explicitly by this ratio.
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence

import sympy

from .index import bounds
from .index_map import IndexMap

Region = list[tuple[int, int]]  # per producer axis, [lo, hi)


def producer_region(consumer_map: IndexMap, tile: Sequence[tuple[int, int]]) -> Region:
    """The bounding box of producer elements read by consumer outputs in ``tile`` (per consumer
    output axis, ``[start, stop)``), over every reduction value, clipped to the producer."""
    offset: dict[sympy.Symbol, sympy.Expr] = {}
    ranges: dict[sympy.Symbol, int] = {}
    for s, (start, stop) in zip(consumer_map.out_symbols, tile):
        local = sympy.Symbol(f"{s}_t", integer=True, nonnegative=True)
        offset[s] = local + start
        ranges[local] = stop - start
    ranges.update(consumer_map.reduce)
    ranges.update(consumer_map.data)
    region = []
    for e, n in zip(consumer_map.exprs, consumer_map.in_shape):
        b = bounds(sympy.expand(e.xreplace(offset)), ranges)
        lo, hi = (0, n - 1) if b is None else b
        region.append((max(lo, 0), min(hi, n - 1) + 1))
    return region


def tiles(shape: Sequence[int], tile: Sequence[int]) -> list[list[tuple[int, int]]]:
    """Every tile of ``shape`` (row-major), edge tiles truncated."""
    axes = [[(s, min(s + t, n)) for s in range(0, n, t)] for n, t in zip(shape, tile)]
    return [list(t) for t in itertools.product(*axes)]


def redundancy(consumer_map: IndexMap, tile: Sequence[int]) -> float:
    """Producer elements computed when each consumer tile of size ``tile`` recomputes the
    producer region it needs, over the producer's element count (1.0: no recomputation)."""
    if len(tile) != len(consumer_map.out_shape):
        raise ValueError(f"tile {tuple(tile)} has {len(tile)} sizes for a consumer of rank "
                         f"{len(consumer_map.out_shape)}")
    total = 0
    for t in tiles(consumer_map.out_shape, tile):
        size = 1
        for lo, hi in producer_region(consumer_map, t):
            size *= max(hi - lo, 0)
        total += size
    produced = 1
    for n in consumer_map.in_shape:
        produced *= n
    return total / produced


def no_redundancy_constraint(consumer_map: IndexMap, tile_of: Callable[[Mapping], Sequence[int]],
                             tolerance: float = 1.0) -> Callable[[object], str | None]:
    """A tuner constraint: reject configs whose consumer tiling recomputes producer work beyond
    ``tolerance`` (1.0: none at all; a KxK consumer may allow its halo's ratio)."""
    def check(config: object) -> str | None:
        options = config.as_options() if hasattr(config, "as_options") else dict(config)  # type: ignore[call-overload]
        ratio = redundancy(consumer_map, tile_of(options))
        if ratio > tolerance + 1e-9:
            return f"tiling recomputes producer work (redundancy {ratio:.3f} > {tolerance})"
        return None

    return check
