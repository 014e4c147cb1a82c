"""Graph rewrites that change weights, not kernels (docs/algorithms.md): BatchNormalization
folded into the preceding Conv or Gemm, and sibling convolutions on one input merged into one
wider convolution ("kernel enlarging", IOS's merge stage: ``scheduling.py``). Pure functions:
they return new operators and leave the old ones alone."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..errors import KernelgenError
from ..ir.node import Constant, Op, Value, constant
from ..ops.nn import batch_norm_affine, conv, gemm
from ..ops.shape import slice_op


class RewriteError(KernelgenError, ValueError):
    """A rewrite whose preconditions do not hold; the message says which."""


def _const(op: str, v: Value, role: str) -> np.ndarray:
    if not isinstance(v, Constant):
        raise RewriteError(f"{op}: {role} '{v.name}' must be a constant (kg.constant) to fold")
    return np.asarray(v.value, dtype=np.float64)


def fold_batchnorm(bn: Op) -> Op:
    """``BatchNormalization(Conv(x, W, B))`` as one ``Conv(x, W', B')`` (same for Gemm with
    transB=0 and no transA): ``W' = W * s``, ``B' = B * s + t`` per output channel, with
    ``s = gamma / sqrt(var + eps)`` and ``t = beta - mean * s`` (``batch_norm_affine``).
    Removes an elementwise pass over the output."""
    if bn.kind != "BatchNormalization":
        raise RewriteError(f"fold_batchnorm: '{bn.name}' is {bn.kind}, not BatchNormalization")
    producer = bn.inputs[0]
    if not isinstance(producer, Op) or producer.kind not in ("Conv", "Gemm"):
        what = getattr(producer, "kind", "an input")
        raise RewriteError(f"fold_batchnorm: '{bn.name}' follows {what}, not Conv or Gemm")
    affine = batch_norm_affine(bn)
    if affine is None:
        raise RewriteError(f"fold_batchnorm: the parameters of '{bn.name}' must be constants "
                           f"(kg.constant) to fold")
    s, t = affine
    x, w = producer.inputs[0], producer.inputs[1]
    weights = _const(producer.kind, w, "W")
    has_bias = len(producer.inputs) > 2
    bias = _const(producer.kind, producer.inputs[2], "B") if has_bias else 0.0
    dtype = w.dtype.numpy
    if producer.kind == "Conv":
        w_new = weights * s.reshape((-1,) + (1,) * (weights.ndim - 1))
        b_new = bias * s + t
        a = producer.attrs
        return conv(x, constant(f"{w.name}_bnfolded", w_new.astype(dtype)),
                    constant(f"{bn.name}_bias", b_new.astype(dtype)),
                    dilations=a["dilations"], group=a["group"], kernel_shape=a["kernel_shape"],
                    pads=a["pads"], strides=a["strides"])
    a = producer.attrs
    if a["transA"] or a["transB"] or a["alpha"] != 1 or a["beta"] != 1 or bn.rank != 2:
        raise RewriteError(f"fold_batchnorm: Gemm '{producer.name}' must have transA=transB=0 "
                           "and alpha=beta=1 to fold (channels are its columns)")
    w_new = weights * s[None, :]
    b_new = np.broadcast_to(bias, (producer.shape[1],)) * s + t
    return gemm(x, constant(f"{w.name}_bnfolded", w_new.astype(dtype)),
                constant(f"{bn.name}_bias", b_new.astype(dtype)))


def merge_sibling_convs(a: Op, b: Op) -> tuple[Op, Op, Op]:
    """Two convolutions of the same input as one (``widen_convs``): ``(merged, slice_a,
    slice_b)``, the slices being a's and b's outputs."""
    merged, (sa, sb) = widen_convs([a, b])
    return merged, sa, sb


def widen_convs(convs: Sequence[Op], source: Value | None = None) -> tuple[Op, list[Op]]:
    """Convolutions of the same input with the same strides, dilations, output size and no
    groups, as one convolution over all their filter banks (IOS's merge, "kernel enlarging");
    smaller kernels are zero-padded, centred, to the largest (1x1 beside 3x3). Returns the
    merged convolution, reading ``source`` (default: the convolutions' common input, which
    ``source`` must equal in shape and dtype), and per convolution a Slice of it equal to its
    output. One pass over the input instead of several, for a few zero multiplies."""
    if len(convs) < 2:
        raise RewriteError("widen_convs: give at least two convolutions")
    a = convs[0]
    for op in convs:
        if op.kind != "Conv":
            raise RewriteError(f"widen_convs: '{op.name}' is {op.kind}, not Conv")
        if op.attrs["group"] != 1:
            raise RewriteError(f"widen_convs: '{op.name}' is grouped")
        if source is None and op.inputs[0] is not a.inputs[0]:
            raise RewriteError("widen_convs: the convolutions read different inputs")
        for attr in ("strides", "dilations"):
            if op.attrs[attr] != a.attrs[attr]:
                raise RewriteError(f"widen_convs: {attr} differ ({a.attrs[attr]} vs "
                                   f"{op.attrs[attr]})")
        if op.shape[2:] != a.shape[2:] or op.dtype != a.dtype:
            raise RewriteError(f"widen_convs: output sizes differ ({a.shape} vs {op.shape})")
    x = a.inputs[0] if source is None else source
    if x.shape != a.inputs[0].shape or x.dtype != a.inputs[0].dtype:
        raise RewriteError(f"widen_convs: the source {x.shape} {x.dtype} is not the "
                           f"convolutions' input {a.inputs[0].shape} {a.inputs[0].dtype}")
    nd = len(a.attrs["kernel_shape"])
    d = a.attrs["dilations"]
    big = [max(op.attrs["kernel_shape"][i] for op in convs) for i in range(nd)]
    banks, biases = [], []
    begin = end = None
    for op in convs:
        k = op.attrs["kernel_shape"]
        if any((K - kk) % 2 for K, kk in zip(big, k)):
            raise RewriteError(f"widen_convs: '{op.name}' kernel {k} cannot be centred in {big}")
        offset = [(K - kk) // 2 for K, kk in zip(big, k)]
        weights = _const("Conv", op.inputs[1], "W")
        padded = np.zeros(weights.shape[:2] + tuple(big))
        window = tuple(slice(o, o + kk) for o, kk in zip(offset, k))
        padded[(slice(None), slice(None)) + window] = weights
        # the centred kernel reaches o * dilation further on each side: the padding shrinks
        lo = [p + o * dd for p, o, dd in zip(op.attrs["pads"][:nd], offset, d)]
        hi = [p + o * dd for p, o, dd in zip(op.attrs["pads"][nd:], offset, d)]
        if begin is None:
            begin, end = lo, hi
        elif (lo, hi) != (begin, end):
            raise RewriteError("widen_convs: the kernels do not line up (padding "
                               f"{begin + end} vs {lo + hi} once centred)")
        banks.append(padded)
        biases.append(_const("Conv", op.inputs[2], "B") if len(op.inputs) > 2
                      else np.zeros(weights.shape[0]))
    assert begin is not None and end is not None
    dtype = a.dtype.numpy
    label = "+".join(op.name for op in convs)
    merged = conv(x, constant(f"{label}_w", np.concatenate(banks).astype(dtype)),
                  constant(f"{label}_b", np.concatenate(biases).astype(dtype)),
                  dilations=d, kernel_shape=big, pads=begin + end, strides=a.attrs["strides"])
    if merged.shape[2:] != a.shape[2:]:
        raise RewriteError(f"widen_convs: merged output {merged.shape} does not match "
                           f"{a.shape}")
    slices, at = [], 0
    for op in convs:
        slices.append(slice_op(merged, [at], [at + op.shape[1]], [1]))
        at += op.shape[1]
    return merged, slices
