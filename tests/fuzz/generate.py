"""Random fused blocks for the differential fuzzer, as data that Hypothesis draws and shrinks.

A ``Block`` is pure data: its inputs (name, shape, dtype, how their values are made) and its
nodes (a kernelgen constructor name, the values it reads, its attributes). ``build`` turns it
into kernelgen operators at the block's dtype or, for the float64 shadow reference, with every
float input widened to float64; ``source`` prints the same construction as Python, which is what
a reproducer shows. The strategy ``blocks`` draws a DAG of 1-5 operators on awkward shapes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

import kernelgen as kg

# special values by dtype: NaN, +-Inf, -0.0, a subnormal, a huge and a tiny magnitude
SPECIALS: dict[str, dict[str, float]] = {
    "float32": {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "-0": -0.0, "subnormal": 1e-40,
                "-subnormal": -3e-42, "huge": 1e30, "-huge": -1e30, "tiny": 1e-30},
    "float16": {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "-0": -0.0, "subnormal": 3e-6,
                "huge": 3e4, "-huge": -3e4, "tiny": 1e-4},
    "float64": {"nan": np.nan, "inf": np.inf, "-inf": -np.inf, "-0": -0.0, "subnormal": 1e-310,
                "huge": 1e150, "-huge": -1e150, "tiny": 1e-150},
}
FLOAT = ("float32", "float16", "float64")
INT = ("int32", "int64")
SIZES = [1, 1, 2, 3, 5, 7, 11, 13, 4, 6, 17, 23, 31, 40]


@dataclass(frozen=True)
class Input:
    """A block input: values are ``seed``'s normal (or small integer) draws, then ``specials``
    (flat position, name in SPECIALS) written over them; ``bound`` > 0 makes Gather indices in
    [-bound, bound - 1]."""
    name: str
    shape: tuple[int, ...]
    dtype: str
    seed: int = 0
    specials: tuple[tuple[int, str], ...] = ()
    bound: int = 0

    def array(self, dtype: str | None = None) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        if self.bound:
            return rng.integers(-self.bound, self.bound, self.shape).astype(self.dtype)
        if self.dtype in INT:
            return rng.integers(-4, 5, self.shape).astype(self.dtype)
        if self.dtype == "bool":
            return rng.integers(0, 2, self.shape).astype(bool)
        a = (rng.standard_normal(self.shape) * 2).astype(self.dtype)
        for pos, name in self.specials:
            a.flat[pos] = SPECIALS[self.dtype][name]
        return a.astype(dtype or self.dtype)


@dataclass(frozen=True)
class Node:
    """``v<k> = kg.<fn>(*args, **attrs)``; an arg names a value, or is a tuple of names (Concat)."""
    fn: str
    args: tuple[Any, ...]
    attrs: tuple[tuple[str, Any], ...] = ()


@dataclass
class Block:
    """Inputs and nodes (``v0``, ``v1``, ... in order); ``force`` fuses red edges too."""
    inputs: list[Input]
    nodes: list[Node]
    force: bool = False
    dtype: str = "float32"

    def source(self) -> str:
        """The kernelgen code that builds this block's operators."""
        lines = [f"{i.name} = kg.tensor({i.name!r}, {i.shape}, {i.dtype!r})" for i in self.inputs]
        for k, node in enumerate(self.nodes):
            args = ["[" + ", ".join(a) + "]" if isinstance(a, tuple) else str(a)
                    for a in node.args]
            args += [f"{name}={val!r}" for name, val in node.attrs]
            lines.append(f"v{k} = kg.{node.fn}({', '.join(args)})")
        return "\n".join(lines)


def call(values: dict[str, kg.Value], node: Node) -> kg.Op:
    args = [[values[a] for a in arg] if isinstance(arg, tuple) else
            None if arg is None else values[arg] for arg in node.args]
    return getattr(kg, node.fn)(*args, **dict(node.attrs))


def build(block: Block, wide: bool = False) -> list[kg.Op]:
    """The block's operators; ``wide``: every float input float64 (the shadow reference)."""
    values: dict[str, kg.Value] = {
        i.name: kg.tensor(i.name, i.shape, "float64" if wide and i.dtype in FLOAT else i.dtype)
        for i in block.inputs}
    ops = []
    for k, node in enumerate(block.nodes):
        ops.append(call(values, node))
        values[f"v{k}"] = ops[-1]
    return ops


# --- drawing ----------------------------------------------------------------------------------

FLOAT_UNARY = ["relu", "neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "softsign",
               "softplus", "erf", "floor", "ceil", "round", "reciprocal", "sign", "leaky_relu",
               "elu", "selu", "gelu", "hard_sigmoid", "hard_swish", "mish", "sin", "cos", "atan",
               "clip"]
INT_UNARY = ["relu", "neg", "abs", "sign", "clip"]
FLOAT_BINARY = ["add", "sub", "mul", "div", "max", "min", "pow", "prelu"]
INT_BINARY = ["add", "sub", "mul", "max", "min"]
FLOAT_REDUCE = ["reduce_sum", "reduce_mean", "reduce_max", "reduce_min", "reduce_prod",
                "reduce_l1", "reduce_l2", "reduce_sum_square", "reduce_log_sum",
                "reduce_log_sum_exp", "softmax", "log_softmax", "layer_normalization"]
INT_REDUCE = ["reduce_sum", "reduce_max", "reduce_min", "reduce_l1"]
CATEGORIES = ["unary", "unary", "binary", "binary", "where", "shuffle", "shuffle", "shuffle",
              "reduce", "reduce", "contract", "contract", "window", "window", "gather"]


class Drawer:
    """One block being drawn: values by name (built at once, so their shapes are known)."""

    def __init__(self, draw: st.DrawFn, dtype: str, max_numel: int):
        self.draw, self.dtype, self.max_numel = draw, dtype, max_numel
        self.inputs: list[Input] = []
        self.nodes: list[Node] = []
        self.values: dict[str, kg.Value] = {}

    def integers(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def choice(self, seq: Any) -> Any:
        return self.draw(st.sampled_from(list(seq)))

    def new_input(self, shape: tuple[int, ...], dtype: str | None = None, bound: int = 0) -> str:
        dtype = dtype or self.dtype
        numel = int(np.prod(shape))
        specials: tuple[tuple[int, str], ...] = ()
        if dtype in FLOAT and numel:
            specials = tuple(self.draw(st.lists(st.tuples(
                st.integers(0, numel - 1), st.sampled_from(sorted(SPECIALS[dtype]))),
                max_size=min(6, numel))))
        inp = Input(f"x{len(self.inputs)}", shape, dtype, self.integers(0, 2**16), specials,
                    bound)
        self.inputs.append(inp)
        self.values[inp.name] = kg.tensor(inp.name, shape, dtype)
        return inp.name

    def shape(self, lo: int = 1, hi: int = 4) -> tuple[int, ...]:
        dims = [self.choice(SIZES) for _ in range(self.integers(lo, hi))]
        while int(np.prod(dims)) > self.max_numel:
            dims[dims.index(max(dims))] = max(1, max(dims) // 3)
        return tuple(dims)

    def add(self, fn: str, *args: Any, **attrs: Any) -> str:
        """Build ``kg.fn(*args, **attrs)`` now; a construction error rejects the example."""
        node = Node(fn, tuple(args), tuple(attrs.items()))
        try:
            op = call(self.values, node)
        except kg.KernelgenError as exc:
            raise Rejected(f"{fn}: {exc}") from exc
        if op.numel > self.max_numel * 4:
            raise Rejected(f"{fn}: {op.shape} too large")
        name = f"v{len(self.nodes)}"
        self.nodes.append(node)
        self.values[name] = op
        return name

    def pick(self, pred: Any = lambda v: True) -> str | None:
        """A value (an input or a node's output) that satisfies ``pred``."""
        cands = [n for n, v in self.values.items() if pred(v)]
        return self.choice(cands) if cands else None


class Rejected(Exception):
    """The drawn operator cannot be built (kernelgen refused it): the example is discarded."""


def _bcast_shape(d: Drawer, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape``: leading axes dropped, some set to 1, and a size-1
    axis of ``shape`` sometimes grown (so the result is larger than either operand)."""
    out = list(shape[d.integers(0, len(shape)):]) if shape else []
    for k in range(len(out)):
        r = d.integers(0, 3)
        if r == 0:
            out[k] = 1
        elif r == 1 and out[k] == 1:
            out[k] = d.choice([2, 3, 5])
    return tuple(out)


def draw_unary(d: Drawer, v: str) -> str:
    x = d.values[v]
    if str(x.dtype) in INT:
        fn = d.choice(INT_UNARY)
    else:
        fn = d.choice(FLOAT_UNARY)
    if fn == "clip":
        lo = d.choice([None, -1.0, 0.0, 0.5]) if str(x.dtype) in FLOAT else d.choice([None, -2])
        return d.add("clip", v, min=lo, max=d.choice([None, 1.0 if str(x.dtype) in FLOAT else 3]))
    # ONNX stores float attributes as float32: float32-exact values mean the same on both sides
    if fn == "leaky_relu":
        return d.add(fn, v, alpha=float(np.float32(d.choice([0.01, 0.3]))))
    if fn == "hard_sigmoid":
        return d.add(fn, v, alpha=float(np.float32(0.2)), beta=0.5)
    return d.add(fn, v)


def draw_binary(d: Drawer, v: str) -> str:
    x = d.values[v]
    fn = d.choice(INT_BINARY if str(x.dtype) in INT else FLOAT_BINARY)
    other = d.pick(lambda w: w.dtype == x.dtype and w.name != x.name and _broadcasts(w, x))
    if other is None or d.integers(0, 2) == 0:
        other = d.new_input(_bcast_shape(d, x.shape), str(x.dtype))
    if fn == "prelu":  # the slope broadcasts to x; x must hold the full shape
        return d.add(fn, v, d.new_input(_bcast_shape(d, x.shape)[:x.rank], str(x.dtype)))
    a, b = (v, other) if d.integers(0, 1) else (other, v)
    return d.add(fn, a, b)


def _broadcasts(a: kg.Value, b: kg.Value) -> bool:
    return all(p == q or p == 1 or q == 1 for p, q in zip(a.shape[::-1], b.shape[::-1]))


def draw_where(d: Drawer, v: str) -> str:
    """where(x < y, x, z): the condition is never a block output (a flip of a compare that
    ties after rounding would be noise, not a bug)."""
    x = d.values[v]
    y = d.new_input(_bcast_shape(d, x.shape), str(x.dtype))
    cond = d.add(d.choice(["less", "greater", "less_or_equal", "equal"]), v, y)
    z = d.pick(lambda w: w.dtype == x.dtype and _broadcasts(w, x)) or v
    return d.add("where", cond, v, z) if d.integers(0, 1) else d.add("where", cond, z, v)


def _factor(d: Drawer, n: int) -> list[int]:
    """A random factorisation of ``n`` into 1-3 sizes (with 1s sometimes)."""
    dims = []
    for _ in range(d.integers(0, 2)):
        divs = [k for k in range(1, n + 1) if n % k == 0]
        k = d.choice(divs)
        dims.append(k)
        n //= k
    return [*dims, n]


def draw_shuffle(d: Drawer, v: str) -> str:
    x = d.values[v]
    kind = d.choice(["transpose", "reshape", "flatten", "unsqueeze", "squeeze", "slice",
                     "concat", "pad", "depth_to_space", "space_to_depth", "expand"])
    r = x.rank
    if kind == "transpose" and r > 1:
        return d.add("transpose", v, perm=list(d.draw(st.permutations(range(r)))))
    if kind == "flatten" and r > 0:
        return d.add("flatten", v, axis=d.integers(-r, r))
    if kind == "unsqueeze":
        return d.add("unsqueeze", v, axes=[d.integers(-r - 1, r)])
    if kind == "squeeze" and 1 in x.shape:
        return d.add("squeeze", v, axes=[x.shape.index(1)] if d.integers(0, 1) else None)
    if kind == "slice" and r > 0:
        axis = d.integers(0, r - 1)
        n = x.shape[axis]
        step = d.choice([1, 1, 2, 3, -1, -2])
        start, end = d.integers(-n - 2, n + 2), d.integers(-n - 3, n + 3)
        if step < 0 and d.integers(0, 1):
            start, end = n - 1, -1000  # the whole axis reversed
        return d.add("slice", v, starts=[start], ends=[end], axes=[axis], steps=[step])
    if kind == "concat" and r > 0:
        axis = d.integers(0, r - 1)
        same = d.pick(lambda w: w.dtype == x.dtype and w.rank == r and all(
            p == q for k, (p, q) in enumerate(zip(w.shape, x.shape)) if k != axis))
        shape = list(x.shape)
        shape[axis] = d.choice([1, 2, 3])
        other = same if same and d.integers(0, 1) else d.new_input(tuple(shape), str(x.dtype))
        return d.add("concat", (v, other) if d.integers(0, 1) else (other, v, v), axis=axis)
    if kind == "pad" and r > 0:
        pads = [d.integers(-1 if n > 1 else 0, 2) for n in x.shape * 2]
        if d.integers(0, 1):
            return d.add("pad", v, pads=pads, mode="edge") if min(x.shape) > 1 else \
                d.add("pad", v, pads=[abs(p) for p in pads], mode="edge")
        value = d.choice([0.0, 1.5, -2.0]) if str(x.dtype) in FLOAT else 0
        return d.add("pad", v, pads=pads, constant_value=value)
    if kind == "depth_to_space" and r == 4:
        b = d.choice([2, 3])
        if x.shape[1] % (b * b) == 0:
            return d.add("depth_to_space", v, blocksize=b, mode=d.choice(["DCR", "CRD"]))
    if kind == "space_to_depth" and r == 4:
        b = d.choice([2, 3])
        if x.shape[2] % b == 0 and x.shape[3] % b == 0:
            return d.add("space_to_depth", v, blocksize=b)
    if kind == "expand":
        shape = [d.choice([1, 2, 3]) if n == 1 else n for n in x.shape]
        return d.add("expand", v, shape=[d.choice([2, 3])] * d.integers(0, 1) + shape)
    dims = _factor(d, x.numel) if x.numel else [0]
    if dims and d.integers(0, 3) == 0:
        dims[d.integers(0, len(dims) - 1)] = -1
    return d.add("reshape", v, shape=dims)


def draw_reduce(d: Drawer, v: str) -> str:
    x = d.values[v]
    if x.rank == 0:
        return draw_unary(d, v)
    fn = d.choice(INT_REDUCE if str(x.dtype) in INT else FLOAT_REDUCE)
    axis = d.integers(-x.rank, x.rank - 1)
    if fn in ("softmax", "log_softmax"):
        return d.add(fn, v, axis=axis)
    if fn == "layer_normalization":
        a = axis % x.rank
        scale = d.new_input(x.shape[a:], str(x.dtype))
        bias = d.new_input(x.shape[a:], str(x.dtype)) if d.integers(0, 1) else None
        epsilon = float(np.float32(d.choice([1e-5, 0.1])))  # float32-exact, as ONNX stores it
        return d.add(fn, v, scale, bias, axis=axis, epsilon=epsilon)
    axes = sorted(set(d.draw(st.lists(st.integers(0, x.rank - 1), min_size=1, max_size=3))))
    if d.integers(0, 4) == 0:
        return d.add(fn, v, axes=None, keepdims=d.integers(0, 1))
    return d.add(fn, v, axes=axes, keepdims=d.integers(0, 1))


def draw_contract(d: Drawer, v: str) -> str:
    x = d.values[v]
    if x.rank == 0:
        return draw_unary(d, v)
    n = d.choice([1, 2, 3, 5, 7])
    if x.rank == 2 and d.integers(0, 1):
        ta, tb = d.integers(0, 1), d.integers(0, 1)
        m, k = x.shape[::-1] if ta else x.shape
        w = d.new_input((n, k) if tb else (k, n))
        c = d.new_input(d.choice([(m, n), (n,), (1, n), (m, 1), (1,)])) if d.integers(0, 1) \
            else None
        return d.add("gemm", v, w, c, alpha=d.choice([1.0, 0.5]), beta=d.choice([1.0, -2.0]),
                     transA=ta, transB=tb)
    if d.integers(0, 1) or x.rank == 1:  # x @ w
        w = d.new_input((x.shape[-1], n) if d.integers(0, 3) else (x.shape[-1],))
        return d.add("matmul", v, w)
    w = d.new_input(((2,) if d.integers(0, 2) == 0 else ()) + (n, x.shape[-2]))
    return d.add("matmul", w, v)


def _as_image(d: Drawer, v: str) -> str:
    """``v`` as an (N, C, spatial...) value: reshaped when its rank is below 3."""
    x = d.values[v]
    if x.rank >= 3 and x.rank <= 4:
        return v
    dims = _factor(d, x.numel)
    return d.add("reshape", v, shape=([1] * (3 - len(dims)) + dims)[-4:] if len(dims) <= 4
                 else [1, 1, x.numel])


def draw_window(d: Drawer, v: str) -> str:
    v = _as_image(d, v)
    x = d.values[v]
    kernel = [d.integers(1, min(3, n)) for n in x.shape[2:]]
    pads = [d.integers(0, k - 1) for k in kernel] * 2
    strides = [d.choice([1, 1, 2]) for _ in kernel]
    dil = [d.choice([1, 1, 2]) if 2 * k - 1 <= n else 1 for k, n in zip(kernel, x.shape[2:])]
    kind = d.choice(["conv", "conv", "max_pool", "average_pool", "global"])
    if kind == "conv":
        c = x.shape[1]
        group = d.choice([g for g in (1, 1, c) if c % g == 0])
        m = group * d.choice([1, 2, 3])
        w = d.new_input((m, c // group, *kernel))
        b = d.new_input((m,)) if d.integers(0, 1) else None
        return d.add("conv", v, w, b, pads=pads, strides=strides, dilations=dil, group=group)
    if kind == "max_pool":
        return d.add("max_pool", v, kernel_shape=kernel, pads=pads, strides=strides,
                     ceil_mode=d.integers(0, 1))
    if kind == "average_pool":
        return d.add("average_pool", v, kernel_shape=kernel, pads=pads, strides=strides,
                     count_include_pad=d.integers(0, 1))
    return d.add("reduce_mean" if d.integers(0, 1) else "reduce_max", v,
                 axes=list(range(2, x.rank)))  # GlobalAveragePool / GlobalMaxPool


def draw_gather(d: Drawer, v: str) -> str:
    x = d.values[v]
    if x.rank == 0:
        return draw_unary(d, v)
    axis = d.integers(-x.rank, x.rank - 1)
    shape = tuple(d.choice([1, 2, 3, 5]) for _ in range(d.integers(0, 2)))
    idx = d.new_input(shape, d.choice(INT), bound=x.shape[axis])
    return d.add("gather", v, idx, axis=axis)


DRAW = {"unary": draw_unary, "binary": draw_binary, "where": draw_where,
        "shuffle": draw_shuffle, "reduce": draw_reduce, "contract": draw_contract,
        "window": draw_window, "gather": draw_gather}
INT_OK = {"unary", "binary", "shuffle", "reduce", "gather"}


@st.composite
def blocks(draw: st.DrawFn, max_numel: int = 600, max_ops: int = 5) -> Block:
    """A random block: 1-``max_ops`` operators (a few more when a window needs a reshape),
    each reading the newest value and sometimes an older one (a DAG), on awkward shapes,
    at a random dtype, with special values at random positions of the float inputs."""
    dtype = draw(st.sampled_from(["float32"] * 7 + ["float16", "float64", "int32", "int64"]))
    d = Drawer(draw, dtype, max_numel)
    first = d.new_input(d.shape(0 if d.integers(0, 9) == 0 else 1,
                                4) if d.integers(0, 3) else d.shape(3, 4))
    newest = first
    for _ in range(d.integers(1, max_ops)):
        cat = d.choice([c for c in CATEGORIES if dtype in FLOAT or c in INT_OK])
        want = d.values[newest].dtype
        src = newest if d.integers(0, 3) else (d.pick(lambda w, t=want: w.dtype == t) or newest)
        saved = (list(d.inputs), list(d.nodes), dict(d.values))
        try:
            newest = DRAW[cat](d, src)
        except Rejected:  # drop the operator (and inputs drawn for it); the block goes on
            d.inputs, d.nodes, d.values = saved
    if not d.nodes:
        d.add("neg" if dtype != "bool" else "logical_not", first)
    return Block(d.inputs, d.nodes, force=draw(st.booleans()), dtype=dtype)
