"""The loop IR's structural hash (``ir.fingerprint``), which Fast-Run keys and the plan caches
(``by_structure``) rest on: equal for the same computation built from other names, whatever
order sympy gives the renamed terms, and different wherever the computation differs."""
from __future__ import annotations

import numpy as np
import sympy

import kernelgen as kg
from kernelgen.dtypes import DType
from kernelgen.ir.expr import Load, Reduce
from kernelgen.ir.fingerprint import by_structure, fingerprint
from kernelgen.ir.loop import Buffer, LoopKernel, Store


def _conv_relu(x_name: str, w_name: str, side: int = 11, stride: int = 2, pad: int = 1,
               channels: int = 3) -> LoopKernel:
    x = kg.tensor(x_name, (1, channels, side, side))
    w = kg.tensor(w_name, (5, channels, 3, 3))
    conv = kg.conv(x, w, pads=[pad] * 4, strides=[stride, stride])
    return kg.fuse(conv, kg.relu(conv)).lower()


def _other_ops(count: int) -> None:
    """Build and lower some operators: the fresh reduction symbols of what is built next get
    other numbers (``r1_5`` against ``r1_12``), which sympy orders differently."""
    for k in range(count):
        kg.fuse(kg.reduce_sum(kg.tensor(f"pad{k}", (2, 3)), [1])).lower()


def test_the_same_computation_from_other_names_hashes_the_same() -> None:
    first = _conv_relu("image", "weights")
    _other_ops(7)
    second = _conv_relu("a", "zz")
    assert first.name == second.name and first.inputs[0].name != second.inputs[0].name
    assert fingerprint(first) == fingerprint(second)


def _window_sum(first: str, second: str) -> LoopKernel:
    """out[i] = sum over a < 3, b < 4 of x[i + a + b], the reduction's symbols named as given."""
    i = sympy.Symbol("i", integer=True)
    a, b = (sympy.Symbol(n, integer=True) for n in (first, second))
    body = Reduce(DType.float32, "sum", Load(DType.float32, "x", i + a + b), ((a, 3), (b, 4)))
    return LoopKernel("window_sum", (Buffer("x", (10,), DType.float32),),
                      (Buffer("out", (5,), DType.float32),), ((i, 5),), (Store("out", body),))


def test_renamed_symbols_that_sympy_orders_otherwise_hash_the_same() -> None:
    # sympy orders a sum's symbols by name: a + b prints 'alpha + beta' in one kernel and
    # 'beta + zeta' in the other, the same sum with its terms the other way round
    assert str(_window_sum("alpha", "beta").stores[0].value.body.offset) == "alpha + beta + i"
    assert str(_window_sum("zeta", "beta").stores[0].value.body.offset) == "beta + i + zeta"
    assert fingerprint(_window_sum("alpha", "beta")) == fingerprint(_window_sum("zeta", "beta"))
    # the window's extents are bound in order: a < 4, b < 3 is another computation
    swapped = _window_sum("alpha", "beta")
    body = swapped.stores[0].value
    other = Reduce(body.dtype, "sum", body.body, tuple((s, 7 - n) for s, n in body.axes))
    assert fingerprint(swapped) != fingerprint(
        LoopKernel(swapped.name, swapped.inputs, swapped.outputs, swapped.domain,
                   (Store("out", other),)))


def test_a_gather_hashes_the_same_from_other_names() -> None:
    def gather(table: str, index: str) -> LoopKernel:
        ids = kg.constant(index, np.array([[3, 0], [1, 2]], np.int64))
        return kg.fuse(kg.gather(kg.tensor(table, (4, 6)), ids, axis=0)).lower()
    assert fingerprint(gather("t", "i")) == fingerprint(gather("emb", "ids"))


def test_a_different_computation_hashes_differently() -> None:
    base = fingerprint(_conv_relu("x", "w"))
    variants = [_conv_relu("x", "w", side=13), _conv_relu("x", "w", stride=1),
                _conv_relu("x", "w", pad=0), _conv_relu("x", "w", channels=4)]
    x = kg.tensor("x", (1, 3, 11, 11))
    conv = kg.conv(x, kg.tensor("w", (5, 3, 3, 3)), pads=[1] * 4, strides=[2, 2])
    variants.append(kg.fuse(conv, kg.sigmoid(conv)).lower())
    prints = [fingerprint(k) for k in variants]
    assert base not in prints and len(set(prints)) == len(prints)


def test_an_index_read_backwards_hashes_differently() -> None:
    # x[i + 1] and x[5 - i] hold the same terms but for a sign, which sorting must keep
    x = kg.tensor("x", (7,))
    ahead = kg.fuse(kg.slice(x, [1], [6])).lower()
    back = kg.fuse(kg.slice(x, [5], [0], steps=[-1])).lower()
    assert fingerprint(ahead) != fingerprint(back)


def test_plans_are_cached_by_structure() -> None:
    seen: list[str] = []

    @by_structure(maxsize=8)
    def plan(kernel: LoopKernel, width: int) -> int:
        seen.append(kernel.inputs[0].name)
        return width * len(kernel.domain)

    first, second = _conv_relu("x1", "w1"), _conv_relu("x2", "w2")
    assert plan(first, 4) == plan(second, 4) == 12
    assert seen == ["x1"]  # the second kernel's structure was planned already
    assert plan(second, 8) == 24 and seen == ["x1", "x2"]  # other arguments: planned again
    assert plan(_conv_relu("x1", "w1", side=13), 4) == 12 and len(seen) == 3
