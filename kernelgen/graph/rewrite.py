"""Graph rewrites that change weights, not kernels (docs/algorithms.md): BatchNormalization
folded into the preceding Conv or Gemm, and sibling convolutions on one input merged into one
wider convolution ("kernel enlarging"). Pure functions: they return new operators and leave the
old ones alone."""
from __future__ import annotations

import numpy as np

from ..errors import KernelgenError
from ..ir.node import Constant, Op, Value, constant
from ..ops.nn import conv, gemm
from ..ops.shape import slice_op


class RewriteError(KernelgenError, ValueError):
    """A rewrite whose preconditions do not hold; the message says which."""


def _const(op: str, v: Value, role: str) -> np.ndarray:
    if not isinstance(v, Constant):
        raise RewriteError(f"{op}: {role} '{v.name}' must be a constant (kg.constant) to fold")
    return np.asarray(v.value, dtype=np.float64)


def fold_batchnorm(bn: Op) -> Op:
    """``BatchNormalization(Conv(x, W, B))`` as one ``Conv(x, W', B')`` (same for Gemm with
    transB=0 and no transA): ``W' = W * s``, ``B' = (B - mean) * s + beta`` per output channel,
    with ``s = gamma / sqrt(var + eps)``. Removes two elementwise passes over the output."""
    if bn.kind != "BatchNormalization":
        raise RewriteError(f"fold_batchnorm: '{bn.name}' is {bn.kind}, not BatchNormalization")
    producer = bn.inputs[0]
    if not isinstance(producer, Op) or producer.kind not in ("Conv", "Gemm"):
        what = getattr(producer, "kind", "an input")
        raise RewriteError(f"fold_batchnorm: '{bn.name}' follows {what}, not Conv or Gemm")
    gamma, beta, mean, var = (_const("BatchNormalization", v, role) for v, role in
                              zip(bn.inputs[1:], ("scale", "B", "input_mean", "input_var")))
    s = gamma / np.sqrt(var + bn.attrs["epsilon"])
    x, w = producer.inputs[0], producer.inputs[1]
    weights = _const(producer.kind, w, "W")
    has_bias = len(producer.inputs) > 2
    bias = _const(producer.kind, producer.inputs[2], "B") if has_bias else 0.0
    dtype = w.dtype.numpy
    if producer.kind == "Conv":
        w_new = weights * s.reshape((-1,) + (1,) * (weights.ndim - 1))
        b_new = (bias - mean) * s + beta
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
    b_new = (np.broadcast_to(bias, (producer.shape[1],)) - mean) * s + beta
    return gemm(x, constant(f"{w.name}_bnfolded", w_new.astype(dtype)),
                constant(f"{bn.name}_bias", b_new.astype(dtype)))


def merge_sibling_convs(a: Op, b: Op) -> tuple[Op, Op, Op]:
    """Two convolutions of the same input with the same strides, dilations and output size, as
    one convolution over both filter banks; the smaller kernel is zero-padded to the larger
    (1x1 beside 3x3). Returns ``(merged, slice_a, slice_b)``, the slices being a's and b's
    outputs. Kernel enlarging trades a few zero multiplies for one pass over the input."""
    for op in (a, b):
        if op.kind != "Conv":
            raise RewriteError(f"merge_sibling_convs: '{op.name}' is {op.kind}, not Conv")
        if op.attrs["group"] != 1:
            raise RewriteError(f"merge_sibling_convs: '{op.name}' is grouped")
    if a.inputs[0] is not b.inputs[0]:
        raise RewriteError("merge_sibling_convs: the convolutions read different inputs")
    for attr in ("strides", "dilations"):
        if a.attrs[attr] != b.attrs[attr]:
            raise RewriteError(f"merge_sibling_convs: {attr} differ ({a.attrs[attr]} vs "
                               f"{b.attrs[attr]})")
    if a.shape[2:] != b.shape[2:]:
        raise RewriteError(f"merge_sibling_convs: output sizes differ ({a.shape} vs {b.shape})")
    nd = len(a.attrs["kernel_shape"])
    big = [max(p, q) for p, q in zip(a.attrs["kernel_shape"], b.attrs["kernel_shape"])]
    banks, biases, pads = [], [], None
    for op in (a, b):
        weights = _const("Conv", op.inputs[1], "W")
        offset = [(K - k) // 2 for K, k in zip(big, op.attrs["kernel_shape"])]
        if any((K - k) % 2 for K, k in zip(big, op.attrs["kernel_shape"])):
            raise RewriteError(f"merge_sibling_convs: '{op.name}' kernel cannot be centred in "
                               f"{big}")
        d = op.attrs["dilations"]
        padded = np.zeros(weights.shape[:2] + tuple(big))
        window = tuple(slice(o, o + k) for o, k in zip(offset, op.attrs["kernel_shape"]))
        padded[(slice(None), slice(None)) + window] = weights
        begin = [p + o * dd for p, o, dd in zip(op.attrs["pads"][:nd], offset, d)]
        if pads is None:
            pads = begin
        elif pads != begin:
            raise RewriteError("merge_sibling_convs: the kernels do not line up (padding "
                               f"{pads} vs {begin} once centred)")
        banks.append(padded)
        biases.append(_const("Conv", op.inputs[2], "B") if len(op.inputs) > 2
                      else np.zeros(weights.shape[0]))
    dtype = a.dtype.numpy
    x = a.inputs[0]
    end = [max(pe + (K - k - o) * dd, 0) for pe, K, k, o, dd in zip(
        a.attrs["pads"][nd:], big, a.attrs["kernel_shape"],
        [(K - k) // 2 for K, k in zip(big, a.attrs["kernel_shape"])], a.attrs["dilations"])]
    merged = conv(x, constant(f"{a.name}_{b.name}_w", np.concatenate(banks).astype(dtype)),
                  constant(f"{a.name}_{b.name}_b", np.concatenate(biases).astype(dtype)),
                  dilations=a.attrs["dilations"], kernel_shape=big, pads=pads + end,
                  strides=a.attrs["strides"])
    if merged.shape[2:] != a.shape[2:]:
        raise RewriteError(f"merge_sibling_convs: merged output {merged.shape} does not match "
                           f"{a.shape}")
    ma = a.shape[1]
    return (merged, slice_op(merged, [0], [ma], [1]),
            slice_op(merged, [ma], [ma + b.shape[1]], [1]))
