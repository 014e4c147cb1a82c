"""Every operator alone, on every backend, against ONNX's reference evaluator, on awkward shapes
(size 1, primes, sizes that do not divide a work-group)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import assert_close, prebuild, require, run
from reference import reference

import kernelgen as kg

rng = np.random.default_rng(1234)

SHAPES = [(1,), (7,), (3, 5), (1, 13), (17, 1), (2, 3, 5), (2, 1, 3, 7), (257,)]


def data(shape: tuple[int, ...], dtype: str = "float32", kind: str = "normal") -> np.ndarray:
    """Inputs in each function's domain: 'pos' (0.1..3), 'unit' (-0.9..0.9), 'ge1' (1..4)."""
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype in ("int32", "int64"):
        return rng.integers(-20, 20, shape).astype(dtype)
    low_high = {"pos": (0.1, 3.0), "unit": (-0.9, 0.9), "ge1": (1.0, 4.0)}.get(kind)
    x = rng.uniform(*low_high, shape) if low_high else rng.standard_normal(shape) * 2
    return x.astype(dtype)


@dataclass
class Case:
    """An operator built on tensors of ``shapes``; ``kinds`` picks each input's value domain."""

    name: str
    build: Callable[..., kg.Op]
    shapes: list[tuple[int, ...]]
    dtypes: tuple[str, ...] = ("float32",)
    kinds: tuple[str, ...] = ("normal",)
    scale: float = 1.0  # tolerance multiplier for transcendental functions
    ref: Callable[..., np.ndarray] | None = None  # NumPy reference where ONNX's cannot run it

    def inputs(self) -> tuple[list[kg.Value], list[np.ndarray]]:
        dtypes = self.dtypes * len(self.shapes) if len(self.dtypes) == 1 else self.dtypes
        kinds = self.kinds * len(self.shapes) if len(self.kinds) == 1 else self.kinds
        values = [kg.tensor(f"in{k}", s, d) for k, (s, d) in enumerate(zip(self.shapes, dtypes))]
        arrays = [data(s, d, kd) for s, d, kd in zip(self.shapes, dtypes, kinds)]
        return values, arrays


_DOMAIN = {"Log": "pos", "Sqrt": "pos", "Reciprocal": "pos", "Acosh": "ge1", "Asin": "unit",
           "Acos": "unit", "Atanh": "unit", "Tan": "unit"}
_ATTRS = {"LeakyRelu": {"alpha": 0.2}, "Elu": {"alpha": 0.7}, "Celu": {"alpha": 1.3},
          "ThresholdedRelu": {"alpha": 0.4}, "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
          "Shrink": {"bias": 0.3, "lambd": 0.6}, "IsInf": {"detect_negative": 0}}

CASES: list[Case] = []
for kind in kg.ops.UNARY:
    dt = ("bool",) if kind == "Not" else ("float32",)
    for shape in ((7,), (3, 5), (2, 1, 3, 7)):
        attrs = _ATTRS.get(kind, {})
        CASES.append(Case(f"{kind}{shape}", lambda x, k=kind, a=attrs: kg.ops.unary(k, x, **a),
                          [shape], dt, (_DOMAIN.get(kind, "normal"),), scale=4))
CASES += [Case(f"Gelu-tanh{(3, 5)}", lambda x: kg.gelu(x, approximate="tanh"), [(3, 5)]),
          Case("Relu-int32", kg.relu, [(3, 5)], ("int32",)),
          Case("Abs-int64", kg.abs, [(7,)], ("int64",)),
          Case("Neg-f16", kg.neg, [(3, 5)], ("float16",)),
          Case("Exp-f64", kg.exp, [(3, 5)], ("float64",))]
for kind in kg.ops.BINARY:
    if kind in ("Max", "Min"):
        continue
    dt = ("bool",) if kind in ("And", "Or", "Xor") else ("float32",)
    kinds = ("pos",) if kind == "Pow" else ("normal",)
    for a, b in [((3, 5), (3, 5)), ((3, 5), (5,)), ((2, 1, 7), (3, 1)), ((1,), (13,))]:
        CASES.append(Case(f"{kind}{a}{b}", lambda x, y, k=kind: kg.ops.binary(k, x, y), [a, b],
                          dt, kinds, scale=4))
CASES += [
    Case("Add-int32", kg.add, [(3, 5), (5,)], ("int32",)),
    Case("Div-int32", kg.div, [(3, 5), (5,)], ("int32",), ("normal",)),
    Case("Mul-f16-bcast", kg.mul, [(4, 9), (9,)], ("float16",)),
    Case("Less-int64", kg.less, [(3, 5), (5,)], ("int64",)),
    Case("Mod-int", kg.mod, [(4, 9), (9,)], ("int32",)),
    Case("Mod-fmod", lambda a, b: kg.mod(a, b, fmod=1), [(4, 9), (9,)], ("float32",),
         ("normal", "pos")),
    # Python's % on floats: the divisor's sign; C's fmod on integers: the dividend's
    Case("Mod-float", kg.mod, [(4, 9), (9,)], ("float32",), ("normal", "normal")),
    Case("Mod-fmod-int", lambda a, b: kg.mod(a, b, fmod=1), [(4, 9), (9,)], ("int64",)),
    Case("PRelu", kg.prelu, [(2, 3, 5), (3, 1)]),
    Case("Sum3", kg.sum, [(3, 5), (5,), (1, 5)]),
    Case("Mean3", kg.mean, [(3, 5), (5,), (3, 1)]),
    Case("Max3", kg.max, [(2, 7), (7,), (2, 1)]),
    Case("Min2", kg.min, [(2, 7), (2, 7)]),
    Case("Where", kg.where, [(3, 5), (3, 5), (5,)], ("bool", "float32", "float32")),
    Case("Clip-scalars", lambda x: kg.clip(x, -0.5, 0.7), [(3, 5)]),
    Case("Clip-min-only", lambda x: kg.clip(x, min=0.1), [(13,)]),
    Case("Clip-tensors", lambda x, lo, hi: kg.clip(x, lo, hi), [(3, 5), (), ()],
         ("float32",), ("normal",)),
]
for src, dst in [("float32", "int32"), ("float32", "int64"), ("float32", "float16"),
                 ("float32", "bool"), ("int32", "float32"), ("bool", "float32"),
                 ("int64", "int32"), ("float16", "float32"), ("float32", "float64")]:
    CASES.append(Case(f"Cast-{src}-{dst}", lambda x, d=dst: kg.cast(x, d), [(3, 7)], (src,)))
for kind in kg.ops.REDUCE_KINDS:
    kinds = ("pos",) if kind in ("ReduceLogSum", "ReduceProd") else ("normal",)
    for shape, axes, keep in [((3, 5), [1], 1), ((3, 5), [0], 0), ((2, 3, 7), [0, 2], 1),
                              ((2, 3, 7), None, 0), ((1, 13), [-1], 1), ((5, 600), [1], 0),
                              ((2, 300, 3), [1], 1), ((1,), None, 1)]:
        CASES.append(Case(f"{kind}{shape}{axes}k{keep}",
                          lambda x, k=kind, a=axes, kd=keep: kg.ops.reduce_op(k, x, a, kd),
                          [shape], kinds=kinds, scale=20))
CASES += [Case("ReduceSum-int", lambda x: kg.reduce_sum(x, [1]), [(3, 5)], ("int32",)),
          Case("ReduceMax-int64", lambda x: kg.reduce_max(x, [0]), [(7, 3)], ("int64",))]
for shape, axis in [((3, 5), 1), ((3, 5), 0), ((2, 3, 7), 1), ((1, 1), -1), ((4, 9), -1),
                    ((3, 1000), 1), ((2, 700, 3), 1), ((5, 17), 0)]:
    CASES.append(Case(f"Softmax{shape}a{axis}", lambda x, a=axis: kg.softmax(x, a), [shape],
                      scale=10))
    CASES.append(Case(f"LogSoftmax{shape}a{axis}", lambda x, a=axis: kg.log_softmax(x, a),
                      [shape], scale=10))
CASES += [
    Case("Transpose-default", kg.transpose, [(2, 3, 5)]),
    Case("Transpose-perm", lambda x: kg.transpose(x, [1, 0, 3, 2]), [(2, 3, 5, 7)]),
    Case("Reshape", lambda x: kg.reshape(x, [5, -1]), [(3, 5, 2)]),
    Case("Reshape-zero", lambda x: kg.reshape(x, [0, 7, 1]), [(3, 7)]),
    Case("Flatten", lambda x: kg.flatten(x, 2), [(2, 3, 5, 7)]),
    Case("Flatten-0", lambda x: kg.flatten(x, 0), [(2, 3)]),
    Case("Squeeze", lambda x: kg.squeeze(x, [1, 3]), [(3, 1, 5, 1)]),
    Case("Squeeze-all", kg.squeeze, [(1, 7, 1)]),
    Case("Unsqueeze", lambda x: kg.unsqueeze(x, [0, 3]), [(3, 5)]),
    Case("Slice", lambda x: kg.slice(x, [1, 0], [3, 5], [0, 1], [1, 2]), [(4, 7)]),
    Case("Slice-neg-step", lambda x: kg.slice(x, [-1, 6], [-100, 0], [0, 1], [-2, -3]),
         [(5, 7)]),
    Case("Slice-clamped", lambda x: kg.slice(x, [-20], [1000], [1]), [(3, 11)]),
    Case("Concat", lambda a, b, c: kg.concat([a, b, c], 1), [(3, 2), (3, 5), (3, 1)]),
    Case("Concat-axis0", lambda a, b: kg.concat([a, b], 0), [(1, 7), (4, 7)]),
    Case("Expand", lambda x: kg.expand(x, [2, 3, 5]), [(3, 1)]),
    Case("Expand-rank", lambda x: kg.expand(x, [4, 1]), [(1, 6)]),
    Case("Pad-constant", lambda x: kg.pad(x, [1, 0, 2, 3], 0.5), [(3, 5)]),
    Case("Pad-edge", lambda x: kg.pad(x, [2, 1, 0, 3], mode="edge"), [(3, 5)]),
    Case("Pad-crop", lambda x: kg.pad(x, [-1, 2, 0, -2]), [(4, 7)],  # onnx.reference: no crops
         ref=lambda x: np.pad(x[1:, :-2], [(0, 0), (2, 0)])),
    Case("Pad-axes", lambda x: kg.pad(x, [1, 2], axes=[1]), [(2, 3, 4)]),
    Case("Gather", lambda d, i: kg.gather(d, i, 1), [(3, 7), (2, 4)], ("float32", "int64")),
    Case("Gather-axis0", lambda d, i: kg.gather(d, i, 0), [(5, 3), (6,)], ("float32", "int32")),
    Case("DepthToSpace-DCR", lambda x: kg.depth_to_space(x, 2), [(2, 8, 3, 5)]),
    Case("DepthToSpace-CRD", lambda x: kg.depth_to_space(x, 2, "CRD"), [(1, 12, 3, 2)]),
    Case("SpaceToDepth", lambda x: kg.space_to_depth(x, 3), [(2, 2, 6, 9)]),
    Case("Resize-up", lambda x: kg.resize(x, scales=[1, 1, 2, 3]), [(1, 2, 3, 5)]),
    Case("Resize-sizes", lambda x: kg.resize(x, sizes=[1, 2, 7, 4]), [(1, 2, 3, 5)]),
    Case("Resize-down-asym", lambda x: kg.resize(
        x, scales=[1, 1, 0.5, 0.5], coordinate_transformation_mode="asymmetric",
        nearest_mode="floor"), [(1, 2, 6, 7)]),
    Case("Resize-align", lambda x: kg.resize(
        x, sizes=[2, 5, 9], coordinate_transformation_mode="align_corners",
        nearest_mode="round_prefer_ceil"), [(2, 3, 4)]),
    Case("Resize-pytorch", lambda x: kg.resize(
        x, sizes=[3, 1], coordinate_transformation_mode="pytorch_half_pixel",
        nearest_mode="ceil"), [(3, 5)]),
    Case("Identity-int", kg.identity, [(3, 5)], ("int64",)),
]


def _ints_in_range(case: Case, arrays: list[np.ndarray], values: list[kg.Value]) -> None:
    if case.name.startswith("Gather"):  # indices valid for the gathered axis, negatives too
        n = values[0].shape[1 if "axis0" not in case.name else 0]
        arrays[1][...] = rng.integers(-n, n, arrays[1].shape)
    if case.name in ("Div-int32", "Mod-int", "Mod-fmod-int"):
        arrays[1][arrays[1] == 0] = 3


@pytest.fixture(scope="module", autouse=True)
def _neon_batch(request: pytest.FixtureRequest) -> None:
    """Compile every case's NEON kernel in a few translation units before the tests run."""
    prebuild(request, lambda: [kg.fuse(c.build(*c.inputs()[0])) for c in CASES])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_operator(backend: str, case: Case) -> None:
    values, arrays = case.inputs()
    _ints_in_range(case, arrays, values)
    op = case.build(*values)
    want = case.ref(*arrays) if case.ref else reference(op, *arrays)
    fused = kg.fuse(op)
    (got,) = run(backend, fused, *(arrays[values.index(v)] for v in fused.inputs))
    assert got.dtype == op.dtype.numpy
    assert_close(got, want.astype(op.dtype.numpy), op.dtype.numpy, scale=case.scale)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_add_relu_shapes(backend: str, shape: tuple[int, ...]) -> None:
    """The same small chain over the shared awkward-shape list."""
    x, y = kg.tensor("x", shape), kg.tensor("y", shape[-1:])
    a = kg.add(x, y)
    r = kg.relu(a)
    X, Y = data(shape), data(shape[-1:])
    (got,) = run(backend, kg.fuse(a, r), X, Y)
    assert_close(got, np.maximum(X + Y, 0))


@pytest.mark.parametrize("strategy", ["group", "item", "row"])
@pytest.mark.parametrize("shape,axis", [((5, 131), 1), ((3, 40), 1), ((2, 9, 33), 2),
                                        ((1, 1000), -1)])
def test_reduction_schedules(strategy: str, shape: tuple[int, ...], axis: int) -> None:
    """Each OpenCL reduction schedule computes the same softmax and sum."""
    require("opencl")
    x = kg.tensor("x", shape)
    X = data(shape)
    for op, want in [(kg.softmax(x, axis), reference(kg.softmax(x, axis), X)),
                     (kg.reduce_sum(x, [axis]), X.sum(axis, keepdims=True))]:
        kernel = kg.fuse(op).emit("opencl", schedule=strategy, local_size=64)
        assert kernel.metadata["schedule"] == strategy
        assert_close(kernel(X), want, scale=10)


def test_split_outputs(backend: str) -> None:
    x = kg.tensor("x", (3, 11))
    X = data((3, 11))
    pieces = kg.split(x, [2, 4, 5], axis=1)
    for piece in pieces:
        (got,) = run(backend, kg.fuse(piece), X)
        assert_close(got, reference(piece, X))
    assert [p.shape for p in kg.split(x, axis=1, num_outputs=3)] == [(3, 4), (3, 4), (3, 3)]
