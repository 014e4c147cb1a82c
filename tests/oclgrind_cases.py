"""The blocks ``tests/backend/test_oclgrind.py`` runs under Oclgrind (``oclgrind_worker.py``):
every OpenCL schedule and template at small awkward shapes (1, primes, sizes no tile or vector
divides), forced onto its schedule by emit options where the default would pick another.

Each case names the schedule of every kernel it emits (``expect``, as ``label`` prints a
kernel's metadata), so a case that silently took another schedule fails instead of checking
nothing. Oclgrind simulates every work-item one instruction at a time with shadow memory, so
each kernel stays at thousands of work-items. ``ci`` marks the subset the default test run
takes: one case or two per schedule and template.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import kernelgen as kg


@dataclass(frozen=True)
class Case:
    """``build`` returns the block; ``options`` go to ``emit`` (``one_kernel``: ``emit_kernel``,
    no algorithm choice or padded copies); ``expect`` is each emitted kernel's ``label``, the
    same on every target, or per device kind ('cpu', 'gpu') where the defaults differ."""

    name: str
    build: Callable[[], kg.FusedOp]
    expect: tuple[str, ...] | dict[str, tuple[str, ...]]
    options: dict[str, Any] = field(default_factory=dict)
    ci: bool = False
    one_kernel: bool = False
    scale: float = 50.0  # tolerance multiplier: sums of many products, transcendentals
    # ``compile/padding.py``'s size threshold for this case (None: as it is)
    pad_min_bytes: int | None = None

    def expected(self, kind: str, target: str = "") -> tuple[str, ...]:
        """The labels on ``target`` (a profile's name) or, not named, on its ``kind``."""
        if not isinstance(self.expect, dict):
            return self.expect
        return self.expect.get(target, self.expect.get(kind, ()))


def label(metadata: dict[str, Any]) -> str:
    """A kernel's schedule with the variants the cases tell apart: an elementwise kernel
    computing several points per work-item, transposed tiles, interleaved stores or vectors of
    points, the scalar contraction template, packed panels (by a first launch or in the tile),
    a staged row, a staged row reading its keys from a panel in local memory."""
    schedule, tunables = metadata["schedule"], metadata["tunables"]
    if metadata.get("interleaved_stores"):
        return "elementwise+interleaved"
    if metadata.get("vector_points"):
        return "elementwise+vectors"
    if schedule == "elementwise" and any(f > 1 for f in tunables.get("unroll") or ()):
        return "elementwise+unroll"
    if schedule == "elementwise" and tunables.get("tile", (1, 1)) != (1, 1):
        return "elementwise+transposed"
    if schedule == "tiled" and "vector_width" not in tunables:
        return "tiled+scalar"
    if tunables.get("pack"):
        return "tiled+pack_in_tile" if tunables.get("pack_in_tile") else "tiled+pack"
    if metadata.get("key_panel_reads"):
        return f"{schedule}+panel"
    if metadata.get("staged_rows"):
        return f"{schedule}+staged"
    return schedule


def feeds(fused: kg.FusedOp, seed: int) -> list[np.ndarray]:
    """Inputs for ``fused`` in its input order: constants as built, gather indices from -5 to 4
    (every gathered axis here is longer), the rest small normal values."""
    rng = np.random.default_rng(seed)
    arrays = []
    for v in fused.inputs:
        value = getattr(v, "value", None)
        if value is not None:
            arrays.append(np.asarray(value))
        elif v.dtype.name in ("int32", "int64"):
            arrays.append(rng.integers(-5, 5, v.shape).astype(v.dtype.name))
        else:
            arrays.append((rng.standard_normal(v.shape) * 0.5).astype(v.dtype.name))
    return arrays


def _f32(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return (rng.standard_normal(shape) / 3).astype(np.float32)


# --- elementwise --------------------------------------------------------------------------

def bias_relu() -> kg.FusedOp:
    x, b = kg.tensor("x", (7, 37)), kg.tensor("b", (37,))
    a = kg.add(x, b)
    return kg.fuse(a, kg.relu(a))


def transposed(shape: tuple[int, ...], perm: tuple[int, ...]) -> Callable[[], kg.FusedOp]:
    def build() -> kg.FusedOp:
        t = kg.transpose(kg.tensor("x", shape), perm)
        a = kg.add(t, kg.tensor("b", (shape[perm[-1]],)))
        return kg.fuse(t, a, kg.relu(a))
    return build


def gated_channels() -> kg.FusedOp:
    """x * sigmoid(g), g per channel: rows of 77 points (4 vectors and a tail on a CPU)."""
    gate = kg.sigmoid(kg.tensor("g", (1, 3, 1, 1)))
    return kg.fuse(gate, kg.mul(kg.tensor("x", (1, 3, 7, 11)), gate))


def one_point() -> kg.FusedOp:
    return kg.fuse(kg.sigmoid(kg.tensor("x", (1, 1, 1))))


def pad_concat() -> kg.FusedOp:
    x, y = kg.tensor("x", (4, 5)), kg.tensor("y", (4, 3))
    p = kg.pad(x, [0, 1, 0, 2], 0.5)
    return kg.fuse(p, kg.concat([p, y], 1))


def half_mul() -> kg.FusedOp:
    x, y = kg.tensor("x", (5, 13), "float16"), kg.tensor("y", (13,), "float16")
    return kg.fuse(kg.mul(x, y))


def gather_rows() -> kg.FusedOp:
    d, i = kg.tensor("d", (10, 6)), kg.tensor("i", (7,), "int64")
    g = kg.gather(d, i, 0)
    return kg.fuse(g, kg.relu(g))


def depth_to_space() -> kg.FusedOp:
    x = kg.tensor("x", (2, 12, 3, 5))
    r = kg.relu(x)
    d2s = kg.depth_to_space(r, 2)
    return kg.fuse(r, d2s, kg.add(d2s, kg.tensor("b", (1, 3, 6, 10))))


def depth_to_space_wide() -> kg.FusedOp:
    """relu -> DepthToSpace(3) -> sigmoid, rows of 3 x 19: interleaved stores on a CPU, the
    last chunk of 16 shifted back over its neighbour."""
    r = kg.relu(kg.tensor("x", (1, 18, 2, 19)))
    d2s = kg.depth_to_space(r, 3)
    return kg.fuse(r, d2s, kg.sigmoid(d2s))


def upsample_concat() -> kg.FusedOp:
    """concat(resize_nearest(x, 2), skip) over 11x11 inputs: each input stored twice."""
    up = kg.resize(kg.tensor("x", (1, 2, 11, 11)), scales=[1.0, 1.0, 2.0, 2.0], mode="nearest")
    return kg.fuse(up, kg.concat([up, kg.tensor("s", (1, 3, 22, 22))], axis=1))


def pad_strided_slice() -> kg.FusedOp:
    z = kg.tensor("z", (4, 11))
    p = kg.pad(z, [0, 1, 0, 2], 0.5)
    s = kg.slice(p, [0, 0], [4, 14], [0, 1], [1, 2])
    return kg.fuse(p, s, kg.mul(s, s))


# --- reductions ---------------------------------------------------------------------------

def softmax(rows: int, cols: int) -> Callable[[], kg.FusedOp]:
    def block() -> kg.FusedOp:
        return kg.fuse(kg.softmax(kg.tensor("x", (rows, cols)), 1))
    block.__name__ = f"softmax_{rows}x{cols}"
    return block


def layer_norm() -> kg.FusedOp:
    x, s, b = kg.tensor("x", (3, 7, 29)), kg.tensor("s", (29,)), kg.tensor("b", (29,))
    return kg.fuse(kg.layer_normalization(x, s, b))


def column_sum() -> kg.FusedOp:
    return kg.fuse(kg.reduce_sum(kg.tensor("x", (61, 3)), [0], 0))


def whole_max() -> kg.FusedOp:
    return kg.fuse(kg.reduce_max(kg.tensor("x", (1, 1)), [0, 1], 0))


def instance_norm() -> kg.FusedOp:
    x, s, b = kg.tensor("x", (2, 3, 5, 7)), kg.tensor("s", (3,)), kg.tensor("b", (3,))
    return kg.fuse(kg.instance_normalization(x, s, b))


def global_average_pool() -> kg.FusedOp:
    return kg.fuse(kg.global_pool("GlobalAveragePool", kg.tensor("x", (2, 3, 5, 7))))


def max_pool() -> kg.FusedOp:
    x = kg.tensor("x", (1, 3, 7, 9))
    return kg.fuse(kg.max_pool(x, [3, 3], strides=[2, 2], pads=[1, 1, 1, 1]))


def max_pool_window(shape: tuple[int, ...], **attrs: Any) -> Callable[[], kg.FusedOp]:
    """relu -> MaxPool: a pooling window, its taps combined by max ('window' on a CPU)."""
    def block() -> kg.FusedOp:
        pre = kg.relu(kg.tensor("x", shape))
        return kg.fuse(pre, kg.max_pool(pre, **attrs))
    block.__name__ = f"max_pool_{'x'.join(map(str, shape))}"
    return block


def average_pool() -> kg.FusedOp:
    x = kg.tensor("x", (2, 3, 7, 5))
    return kg.fuse(kg.average_pool(x, [3, 2], pads=[1, 0, 1, 1], strides=[2, 1],
                                   count_include_pad=1))


def lrn() -> kg.FusedOp:
    """relu -> LRN over 7 channels of 2 images, 95 pixels: the window over channels tested a
    vector at a time; one 64-pixel chunk, then a vector and 15 pixels lane by lane."""
    pre = kg.relu(kg.tensor("x", (2, 7, 5, 19)))
    return kg.fuse(pre, kg.lrn(pre, size=5, alpha=1e-2, beta=0.75, bias=2.0))


def long_max_pool() -> kg.FusedOp:
    """A 9x9 MaxPool at stride 2 (more taps than a pooling window takes): each output's own
    max, its padded taps every second float, tested along the vector's lanes."""
    x = kg.tensor("x", (1, 2, 11, 45))
    return kg.fuse(kg.max_pool(x, [9, 9], pads=[4, 3, 4, 3], strides=[2, 2]))


# --- contractions -------------------------------------------------------------------------

def matmul(m: int, k: int, n: int, prologue: bool = False) -> Callable[[], kg.FusedOp]:
    """relu(b) (with ``prologue``), a @ b, a bias and a sigmoid after."""
    def block() -> kg.FusedOp:
        rng = np.random.default_rng(m * k * n)
        b: kg.Value = kg.tensor("b", (k, n))
        ops: list[kg.Op] = []
        if prologue:
            b = kg.relu(b)
            ops.append(b)  # type: ignore[arg-type]
        mm = kg.matmul(kg.tensor("a", (m, k)), b)
        add = kg.add(mm, kg.constant("bias", _f32(rng, n)))
        return kg.fuse(*ops, mm, add, kg.sigmoid(add))
    block.__name__ = f"matmul_{m}x{k}x{n}"
    return block


def gemm_trans() -> kg.FusedOp:
    a, b, c = kg.tensor("a", (5, 3)), kg.tensor("b", (7, 5)), kg.tensor("c", (3, 1))
    return kg.fuse(kg.gemm(a, b, c, alpha=0.5, beta=2.0, transA=1, transB=1))


def batched_transposed() -> kg.FusedOp:
    """b[2, 1, 23, 19] transposed and broadcast over a batch of 3."""
    mm = kg.matmul(kg.tensor("a", (2, 3, 11, 19)),
                   kg.transpose(kg.tensor("bt", (2, 1, 23, 19)), [0, 1, 3, 2]))
    return kg.fuse(mm.inputs[1], mm)  # type: ignore[arg-type]


def narrow_matmul() -> kg.FusedOp:
    """Three columns and a batch: no run as wide as a vector on either side (the scalar
    template)."""
    return kg.fuse(kg.matmul(kg.tensor("a", (2, 7, 13)), kg.tensor("b", (13, 3))))


def gather_matmul() -> kg.FusedOp:
    """An embedding lookup feeding a MatMul: the left operand gathered in the tile's loads."""
    table, ids = kg.tensor("table", (11, 9)), kg.tensor("ids", (6,), "int32")
    g = kg.gather(table, ids, 0)
    return kg.fuse(g, kg.matmul(g, kg.tensor("w", (9, 21))), force=True)


def conv(x_shape: tuple[int, ...], w_shape: tuple[int, ...], **attrs: Any
         ) -> Callable[[], kg.FusedOp]:
    """relu -> Conv (constant weights and bias) -> sigmoid."""
    def block() -> kg.FusedOp:
        rng = np.random.default_rng(sum(x_shape) + sum(w_shape))
        pre = kg.relu(kg.tensor("x", x_shape))
        out = kg.conv(pre, kg.constant("w", _f32(rng, *w_shape)),
                      kg.constant("cb", _f32(rng, w_shape[0])), **attrs)
        return kg.fuse(pre, out, kg.sigmoid(out))
    block.__name__ = f"conv_{'x'.join(map(str, x_shape))}"
    return block


def depthwise(x_shape: tuple[int, ...], w_shape: tuple[int, ...], **attrs: Any
              ) -> Callable[[], kg.FusedOp]:
    """relu -> a depthwise or grouped conv -> a residual add."""
    def block() -> kg.FusedOp:
        rng = np.random.default_rng(sum(x_shape))
        pre = kg.relu(kg.tensor("x", x_shape))
        out = kg.conv(pre, kg.constant("w", _f32(rng, *w_shape)), **attrs)
        return kg.fuse(pre, out, kg.add(out, kg.tensor("r", out.shape)))
    block.__name__ = f"depthwise_{'x'.join(map(str, x_shape))}"
    return block


def ago_conv_1x1(channels: int, out: int = 6) -> Callable[[], kg.FusedOp]:
    """conv3x3 + ReLU -> 1x1 conv (``out`` channels) as one contraction computing its
    producer (AGO)."""
    def block() -> kg.FusedOp:
        x, w1, w2 = (kg.tensor("x", (2, 5, 9, 11)), kg.tensor("w1", (channels, 5, 3, 3)),
                     kg.tensor("w2", (out, channels, 1, 1)))
        p = kg.conv(x, w1, pads=[1, 1, 1, 1])
        r = kg.relu(p)
        return kg.fuse(p, r, kg.conv(r, w2), force=True)
    block.__name__ = f"ago_conv_1x1_{channels}_{out}"
    return block


def ago_matmul_matmul() -> kg.FusedOp:
    a, b, d = kg.tensor("a", (13, 7)), kg.tensor("b", (7, 9)), kg.tensor("d", (9, 5))
    first = kg.matmul(a, b)
    return kg.fuse(first, kg.matmul(first, d), force=True)


def attention(batch: int, m: int, d: int, n: int, dv: int) -> Callable[[], kg.FusedOp]:
    """relu(softmax(Q Kᵀ * scale + mask) V), each score row staged once per query; K comes
    as (keys, depth) rows, so a query's scores reduce along contiguous rows ('row')."""
    def block() -> kg.FusedOp:
        q, kt, v = (kg.tensor("q", (batch, m, d)), kg.tensor("kt", (batch, n, d)),
                    kg.tensor("v", (batch, n, dv)))
        k = kg.transpose(kt, [0, 2, 1])
        s = kg.matmul(q, k)
        scaled = kg.mul(s, kg.tensor("scale", (1,)))
        masked = kg.add(scaled, kg.tensor("mask", (m, n)))
        p = kg.softmax(masked, 2)
        o = kg.matmul(p, v)
        return kg.fuse(k, s, scaled, masked, p, o, kg.relu(o), force=True)
    block.__name__ = f"attention_{batch}x{m}x{d}x{n}x{dv}"
    return block


def projection_layernorm(m: int, k: int, n: int) -> Callable[[], kg.FusedOp]:
    """LayerNorm(x W + b + r) over rows of ``n``: the projected row staged once per row, the
    LayerNorm's shift (its first point), mean, variance and outputs reading it."""
    def block() -> kg.FusedOp:
        mm = kg.matmul(kg.tensor("x", (m, k)), kg.tensor("w", (k, n)))
        biased = kg.add(mm, kg.tensor("b", (n,)))
        residual = kg.add(biased, kg.tensor("r", (m, n)))
        y = kg.layer_normalization(residual, kg.tensor("g", (n,)), kg.tensor("beta", (n,)))
        return kg.fuse(mm, biased, residual, y, force=True)
    block.__name__ = f"projection_layernorm_{m}x{k}x{n}"
    return block


def aliased_rows() -> kg.FusedOp:
    """A MatMul whose left operand's rows are 4 KiB long (1024 floats), with a ReLU after: on a
    CPU target the driver reads it from a padded copy. The case lowers the 1 MiB threshold
    (a 1 MiB operand takes Oclgrind 40 s); the Pad kernel and the sliced reads are the same at
    any size."""
    mm = kg.matmul(kg.tensor("a", (5, 1024)), kg.tensor("b", (1024, 7)))
    return kg.fuse(mm, kg.relu(mm))


# --- the cases ----------------------------------------------------------------------------

_CONV = ((1, 3, 7, 9), (5, 3, 3, 3))
# a 7x9 output: the output transform splits its odd sides by 2, the copies past them guarded;
# on a CPU its 5 tiles a row are a vector, each tile's two columns interleaved in the stores
_WIN = {"cpu": ("elementwise+unroll", "tiled", "elementwise+interleaved"),
        "gpu": ("elementwise+unroll", "tiled", "elementwise+unroll")}

CASES: dict[str, Case] = {c.name: c for c in (
    # elementwise, guards, float16 storage, gathers
    Case("elementwise-bias-relu", bias_relu, ("elementwise",), ci=True),
    Case("elementwise-one-point", one_point, ("elementwise",)),
    Case("elementwise-vectors", gated_channels, ("elementwise+vectors",), {"vectors": True},
         ci=True),
    Case("elementwise-transposed", transposed((37, 29), (1, 0)), ("elementwise+transposed",),
         ci=True),
    Case("elementwise-transposed-nchw-to-nhwc", transposed((2, 13, 7, 11), (0, 2, 3, 1)),
         ("elementwise+transposed",), {"tile": (4, 4)}),
    Case("elementwise-pad-concat", pad_concat, ("elementwise",), ci=True),
    Case("elementwise-float16", half_mul, ("elementwise",)),
    Case("gather-rows", gather_rows, ("elementwise",), ci=True),
    Case("elementwise-unrolled", depth_to_space, ("elementwise+unroll",),
         {"unroll": (1, 1, 2, 2)}, ci=True),
    Case("elementwise-interleaved-depth-to-space", depth_to_space_wide,
         {"cpu": ("elementwise+interleaved",), "gpu": ("elementwise",)}, ci=True),
    Case("elementwise-interleaved-upsample-concat", upsample_concat,
         {"cpu": ("elementwise+interleaved",), "gpu": ("elementwise",)}),
    Case("elementwise-unrolled-padded-slice", pad_strided_slice, ("elementwise+unroll",),
         {"unroll": (4, 1)}),
    # reductions
    # a CPU's 'row' stages the exp row once (stage_shared_terms); a GPU's does not
    Case("row-softmax", softmax(5, 37), {"cpu": ("row+staged",), "gpu": ("row",)},
         {"schedule": "row"}, ci=True),
    Case("row-layernorm", layer_norm, ("row",), {"schedule": "row"}),
    Case("group-softmax", softmax(3, 37), ("group",), {"schedule": "group"}, ci=True),
    Case("group-softmax-longer-than-the-group", softmax(2, 300), ("group",),
         {"schedule": "group"}),
    Case("group-layernorm", layer_norm, ("group",), {"schedule": "group"}, ci=True),
    Case("group-column-sum", column_sum, ("group",), {"schedule": "group"}),
    Case("group-one-point", whole_max, ("group",), {"schedule": "group"}),
    Case("row-two-vectors-and-a-tail", softmax(3, 19), {"cpu": ("row+staged",), "gpu": ("row",)},
         {"schedule": "row"}),
    Case("softmax-default", softmax(4, 600), {"cpu": ("row+staged",), "gpu": ("group",)}),
    # short rows: 5 a work-item on a CPU by default (unroll.SHORT_ROW_FLOATS)
    Case("softmax-short-rows-default", softmax(40, 37),
         {"cpu": ("row+staged",), "gpu": ("group",)}),
    Case("group-instance-norm", instance_norm, ("group",), {"schedule": "group"}),
    Case("item-softmax", softmax(5, 13), ("item",), {"schedule": "item"}, ci=True),
    Case("item-layernorm", layer_norm, ("item",), {"schedule": "item"}),
    Case("item-max-pool", max_pool, ("item",), {"schedule": "item"}, ci=True),
    Case("item-average-pool", average_pool, ("item",), {"schedule": "item"}),
    Case("window-average-pool", average_pool, ("window",), {"schedule": "window"}),
    Case("item-global-average-pool", global_average_pool, ("item",), {"schedule": "item"}),
    Case("columns-lrn", lrn, {"cpu": ("columns",), "gpu": ("item",)}, ci=True),
    Case("columns-long-max-pool", long_max_pool,
         {"cpu": ("columns",), "gpu": ("item",)}),
    # contractions
    Case("tiled-matmul", matmul(7, 13, 37), ("tiled",), ci=True),
    Case("tiled-gemm-transposed", gemm_trans, ("tiled",)),
    Case("tiled-scalar-template", narrow_matmul, ("tiled+scalar",), ci=True),
    Case("tiled-scalar-tile-2x2", narrow_matmul, ("tiled+scalar",), {"tile": (2, 2)}),
    Case("tiled-gather-matmul", gather_matmul, ("tiled",), ci=True),
    Case("tiled-conv-implicit-gemm", conv(*_CONV, pads=[1, 0, 1, 2]), ("tiled",),
         {"algorithm": "implicit_gemm"}),
    Case("tiled-conv-stride2-lanes", conv((2, 3, 9, 8), (5, 3, 3, 3), strides=[2, 2],
                                          pads=[1, 0, 2, 1]), ("tiled",),
         {"algorithm": "implicit_gemm"}, ci=True),
    Case("tiled-tile-1x1", matmul(7, 13, 11), ("tiled+scalar",), {"tile": (1, 1)}),
    Case("tiled-tile-2x3", matmul(7, 13, 11), ("tiled+scalar",), {"tile": (2, 3)}),
    Case("tiled-tile-8x4", matmul(7, 13, 11), ("tiled",), {"tile": (8, 4)}),
    Case("tiled-column-tile-groups", matmul(13, 9, 37), ("tiled",),
         {"group_columns": True, "tile": (6, 16)}, ci=True),
    # a 1x1 conv's output channels as lanes, its weights packed once: rows crossing images,
    # a shifted last channel tile
    Case("tiled-swapped-operands", conv((2, 11, 3, 3), (37, 11, 1, 1)), ("tiled+pack",),
         {"swap_operands": True, "tile": (4, 16)}, ci=True),
    Case("tiled-conv-7x7-stride2", conv((1, 3, 11, 11), (2, 3, 7, 7), pads=[3, 3, 3, 3],
                                        strides=[2, 2]), ("tiled+scalar",),
         {"algorithm": "implicit_gemm"}),
    Case("tiled-conv-dilation", conv((1, 2, 9, 7), (3, 2, 3, 3), dilations=[2, 1],
                                     pads=[2, 1, 2, 1]), ("tiled",),
         {"algorithm": "implicit_gemm"}),
    Case("tiled-conv-1d", conv((2, 3, 17), (4, 3, 5), pads=[2, 2]), ("tiled",),
         {"algorithm": "implicit_gemm"}),
    Case("packed-matmul", matmul(13, 9, 37, prologue=True), ("tiled+pack",),
         {"pack": True, "pack_in_tile": False, "tile": (6, 32)}, ci=True),
    Case("packed-batched-transposed", batched_transposed, ("tiled+pack",),
         {"pack": True, "pack_in_tile": False}),
    Case("in-tile-pack-matmul", matmul(13, 9, 37, prologue=True), ("tiled+pack_in_tile",),
         {"pack": True, "pack_in_tile": True, "tile": (6, 32)}, ci=True),
    Case("in-tile-pack-batched-transposed", batched_transposed, ("tiled+pack_in_tile",),
         {"pack": True, "pack_in_tile": True}),
    Case("im2col", conv(*_CONV, pads=[1, 1, 1, 1]), ("tiled+pack_in_tile",),
         {"algorithm": "im2col", "pack_in_tile": True}, ci=True),
    # a 'same' conv's columns over the whole map of each image (columns.vector_plan's wrap):
    # lanes masked by their own row and column, lane by lane at the map's first and last rows
    Case("im2col-wrapped-map", conv((2, 3, 9, 13), (5, 3, 5, 5), pads=[2, 2, 2, 2]),
         ("tiled+pack_in_tile",), {"algorithm": "im2col", "pack_in_tile": True}, ci=True),
    Case("implicit-gemm-wrapped-map-dilated", conv((1, 4, 7, 7), (3, 4, 3, 3),
                                                   pads=[2, 2, 2, 2], dilations=[2, 2]),
         ("tiled",), {"algorithm": "implicit_gemm"}),
    Case("im2col-packed-launch", conv((2, 5, 6, 11), (7, 5, 3, 3), pads=[1, 1, 1, 1],
                                      strides=[3, 1]), ("tiled+pack",),
         {"algorithm": "im2col", "pack_in_tile": False}),
    Case("im2col-stride2-patch-matrix", conv((2, 5, 7, 9), (7, 5, 3, 3), pads=[1, 1, 1, 1],
                                             strides=[2, 2]), ("elementwise", "tiled"),
         {"algorithm": "im2col"}),
    # output rows of 16 lanes and more: on AVX-512, every second float of the patches packed
    # (columns.column_plan), or read in place; narrower vectors keep the patch matrix
    Case("im2col-stride2-runs", conv((2, 3, 5, 37), (4, 3, 3, 3), pads=[1, 2, 1, 0],
                                     strides=[2, 2]),
         {"cpu-avx512": ("tiled+pack",), "cpu": ("elementwise", "tiled"),
          "gpu": ("elementwise", "tiled")}, {"algorithm": "im2col"}, ci=True),
    Case("implicit-gemm-stride2-runs", conv((1, 5, 4, 39), (3, 5, 3, 3), pads=[0, 1, 1, 1],
                                            strides=[2, 2]),
         {"cpu-avx512": ("tiled",), "cpu": ("tiled+scalar",), "gpu": ("tiled+scalar",)},
         {"algorithm": "implicit_gemm"}, ci=True),
    # sliding windows
    Case("window-3x3", depthwise((2, 6, 9, 37), (6, 1, 3, 3), pads=[1, 1, 1, 1], group=6),
         ("window",), {"algorithm": "direct"}, ci=True),
    Case("window-narrow-row-wide-pads", depthwise((1, 2, 6, 3), (2, 1, 3, 3), pads=[2, 2, 2, 2],
                                                  group=2), ("window",),
         {"algorithm": "direct"}, ci=True),
    Case("window-pads-wider-than-a-vector", depthwise((1, 2, 4, 5), (2, 1, 3, 3),
                                                      pads=[1, 17, 1, 0], group=2),
         ("window",), {"algorithm": "direct"}),
    Case("window-5x5-dilated-asymmetric", depthwise((1, 3, 8, 41), (3, 1, 5, 5),
                                                    pads=[4, 3, 4, 5], dilations=[2, 2],
                                                    group=3), ("window",),
         {"algorithm": "direct"}),
    Case("window-16-wide-prime-height", depthwise((1, 4, 13, 16), (4, 1, 3, 3),
                                                  pads=[1, 1, 1, 1], group=4), ("window",),
         {"algorithm": "direct"}),
    Case("window-7x7", depthwise((1, 2, 11, 23), (2, 1, 7, 7), pads=[3, 3, 3, 3], group=2),
         ("window",), {"algorithm": "direct"}),
    Case("window-max-pool-padded", max_pool_window((1, 3, 13, 17), kernel_shape=[3, 3],
                                                   pads=[1, 1, 1, 1]),
         ("window",), {"schedule": "window"}, ci=True),
    Case("window-max-pool-stride2-buffer-end", max_pool_window((1, 2, 5, 17), kernel_shape=[3, 3],
                                                               strides=[2, 2]),
         ("window",), {"schedule": "window"}, ci=True),
    # stride 2: twice the lanes read, the even ones kept; the last read ends at the buffer's end
    Case("window-stride2-buffer-end", depthwise((1, 2, 3, 17), (2, 1, 3, 3), group=2,
                                                strides=[2, 2]), ("window",),
         {"algorithm": "direct"}, ci=True),
    Case("window-stride2-padded", depthwise((1, 5, 15, 31), (5, 1, 3, 3), pads=[1, 1, 1, 1],
                                            group=5, strides=[2, 2]), ("window",),
         {"algorithm": "direct"}),
    Case("window-one-row-an-item", depthwise((2, 6, 9, 37), (6, 1, 3, 3), pads=[1, 1, 1, 1],
                                             group=6), ("window",),
         {"algorithm": "direct", "window_rows": 1, "local_size": 1}),
    Case("window-channel-multiplier", depthwise((1, 6, 5, 19), (12, 2, 3, 3),
                                                pads=[0, 2, 1, 1], group=3), ("window",),
         {"algorithm": "direct"}),
    # a group's input channels as a loop around the unrolled taps (window.tap_loop)
    Case("window-grouped-channel-loop", depthwise((1, 32, 6, 13), (32, 16, 3, 3),
                                                  pads=[1, 1, 1, 1], group=2), ("window",),
         {"algorithm": "direct"}, ci=True),
    # AGO and attention
    Case("ago-conv-1x1", ago_conv_1x1(7), ("tiled",), ci=True),
    Case("ago-conv-1x1-prime-channels", ago_conv_1x1(11), ("tiled",)),
    Case("ago-conv-1x1-13-channels", ago_conv_1x1(13), ("tiled",)),
    Case("ago-matmul-matmul", ago_matmul_matmul, ("tiled+scalar",)),
    # row tiles over a panel each column tile's item computes its producer into, or not
    Case("ago-narrow-tiles", ago_conv_1x1(7), ("tiled+pack_in_tile",), {"tile": (4, 4)}),
    Case("ago-narrow-tiles-recomputed", ago_conv_1x1(7), ("tiled",),
         {"tile": (4, 4), "pack": False}),
    Case("ago-many-rows-13-channels", ago_conv_1x1(13, 41), ("tiled+pack_in_tile",)),
    Case("attention-row", attention(1, 36, 16, 129, 17), ("row+staged",),
         {"schedule": "row", "panel": False}, ci=True),
    Case("attention-key-panel", attention(2, 36, 24, 129, 17), ("row+panel",),
         {"schedule": "row", "panel": True, "panel_rows": 12}, ci=True),
    Case("attention-row-one-query-an-item", attention(2, 6, 8, 40, 5), ("row+staged",),
         {"schedule": "row", "group_rows": 1}),
    Case("attention-item", attention(1, 7, 13, 5, 3), ("item+staged",), {"schedule": "item"},
         ci=True),
    Case("attention-default", attention(2, 5, 8, 11, 3), ("item+staged",)),
    Case("attention-one-key", attention(1, 1, 1, 1, 1), ("item",)),  # one point: one item
    Case("projection-layernorm-row", projection_layernorm(6, 11, 37), ("row+staged",),
         {"schedule": "row", "group_rows": 3}, ci=True),
    # Winograd: input transform, batched GEMM, output transform
    Case("winograd-2x2", conv(*_CONV, pads=[1, 1, 1, 1]), _WIN, {"algorithm": "winograd"},
         ci=True),
    Case("winograd-4x4", conv((1, 2, 8, 12), (3, 2, 3, 3), pads=[1, 1, 1, 1]),
         ("elementwise+unroll", "tiled", "elementwise+unroll"), {"algorithm": "winograd_4x4"},
         ci=True),
    # the padded-operand program (CPU targets): the Pad copy, then the GEMM on it
    Case("padded-operand", aliased_rows, {"cpu": ("elementwise", "tiled"), "gpu": ("tiled",)},
         {"pack": False}, ci=True, pad_min_bytes=0),
)}
