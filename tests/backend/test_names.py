"""Argument order and tensor names on every backend (probe defects D4 and D7): a kernel takes
its arrays in the order the user wrote them, and any tensor name (a C keyword, an OpenCL
built-in, another backend's own parameter name) computes the same as NumPy."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, run

import kernelgen as kg

T = kg.tensor
rng = np.random.default_rng(23)


def _arg_names(backend: str, fused: kg.FusedOp) -> list[str]:
    """The metadata's argument names (the block's, for the interpreter)."""
    if backend == "interp":
        return [v.name for v in fused.inputs]
    return [a["name"] for a in fused.emit(backend).metadata["args"]]


def test_gather_takes_data_then_indices(backend: str) -> None:
    """Same shape and dtype for both: the reversed order computed a wrong answer silently."""
    fused = kg.fuse(kg.gather(T("data", (3,), "int64"), T("indices", (3,), "int64")))
    data, idx = np.array([1, 2, 0]), np.array([0, 0, 0])
    (got,) = run(backend, fused, data, idx)
    np.testing.assert_array_equal(got, np.take(data, idx))
    assert _arg_names(backend, fused)[:2] == ["data", "indices"]


def test_gather_in_a_chain_keeps_the_written_order(backend: str) -> None:
    d, i = T("d", (5, 7), "float32"), T("i", (2, 3), "int32")
    g = kg.gather(kg.relu(d), i, axis=1)
    fused = kg.fuse(g.inputs[0], g, kg.exp(g))
    assert [v.name for v in fused.inputs] == ["d", "i"]
    data = rng.standard_normal((5, 7)).astype("f4")
    idx = rng.integers(-7, 7, (2, 3)).astype("i4")
    (got,) = run(backend, fused, data, idx)
    assert_close(got, np.exp(np.take(np.maximum(data, 0), idx, axis=1)))


def test_inputs_follow_the_expression_as_written() -> None:
    """The documented order: the output's expression read left to right, each operator's
    arguments in order, whatever order fuse got the operators in."""
    x, y, z = T("x", (4,)), T("y", (4,)), T("z", (4,))
    r = kg.relu(y)
    assert [v.name for v in kg.fuse(kg.add(x, r), r).inputs] == ["x", "y"]
    assert [v.name for v in kg.fuse(r, kg.add(r, x)).inputs] == ["y", "x"]
    mm = kg.matmul(T("a", (4, 4)), kg.relu(T("b", (4, 4))))
    biased = kg.add(mm, T("bias", (4,)))
    assert [v.name for v in kg.fuse(mm.inputs[1], mm, biased).inputs] == ["a", "b", "bias"]
    assert [v.name for v in kg.fuse(kg.where(T("c", (4,), "bool"), z, x)).inputs] == \
        ["c", "z", "x"]


def test_two_tensors_named_alike_are_a_fusion_error() -> None:
    with pytest.raises(kg.FusionError, match="'x'.*rename"):
        kg.fuse(kg.sub(T("x", (3,)), T("x", (3,))))


def test_one_tensor_used_twice_is_one_input(backend: str) -> None:
    x = T("x", (7,))
    e = kg.exp(x)
    fused = kg.fuse(e, kg.sub(x, e), kg.sub(x, x))
    assert [v.name for v in fused.inputs] == ["x"]
    a = rng.standard_normal(7).astype("f4")
    got = run(backend, fused, a)
    assert_close(got[0], a - np.exp(a))
    assert_close(got[1], np.zeros(7, "f4"))


# a C keyword, OpenCL built-ins the kernel body calls (fmax, exp) or that launch it
# (get_global_id), names C reserves, the NEON/Triton parameters' own names, and names that
# would end the comment that lists them
NAMES = ["fmax", "get_global_id", "__kernel", "kernel", "float", "exp", "in0", "out0", "NAN",
         "M_PI", "KG_FLOORMOD", "lid", "line\nbreak", "back\\"]


@pytest.mark.parametrize("name", NAMES)
def test_any_tensor_name_computes(backend: str, name: str) -> None:
    a, b = T(name, (3, 5)), T("x", (5,))
    m = kg.max(a, b)
    e = kg.exp(m)
    fused = kg.fuse(m, e, kg.add(e, a))
    A = rng.standard_normal((3, 5)).astype("f4")
    B = rng.standard_normal(5).astype("f4")
    (got,) = run(backend, fused, A, B)
    assert_close(got, np.exp(np.maximum(A, B)) + A)
    assert _arg_names(backend, fused)[:2] == [name, "x"]  # the user's names, not identifiers


def test_names_that_spell_the_same_identifier(backend: str) -> None:
    """'a-b' and 'a_b', '' and 'é' become one C identifier each unless told apart."""
    names = ["a-b", "a_b", "", "é", "1x", "v_1x"]
    values = [T(n, (4,)) for n in names]
    ops, total = [], values[0]
    for v in values[1:]:
        total = kg.add(total, v)
        ops.append(total)
    fused = kg.fuse(*ops)
    arrays = [rng.standard_normal(4).astype("f4") * 10 ** k for k in range(len(names))]
    (got,) = run(backend, fused, *arrays)
    assert_close(got, sum(arrays[1:], arrays[0]))


def test_a_long_block_gets_a_short_kernel_name(backend: str) -> None:
    """The kernel is named after its operators; 100-odd of them made a name PoCL aborted the
    process on (its cache path overflowed). A tree of branches keeps the block shallow."""
    x = T("x", (3,))
    branches = [kg.relu(x) if k % 2 else kg.neg(x) for k in range(32)]
    ops, level = list(branches), branches
    while len(level) > 1:
        level = [kg.add(a, b) for a, b in zip(level[::2], level[1::2])]
        ops += level
    fused = kg.fuse(*ops)
    assert len(fused.name) <= 64 and fused.name.endswith(f"_{len(ops)}_ops")
    a = np.array([-1.5, 0.25, 2.0], "f4")
    (got,) = run(backend, fused, a)
    assert_close(got, 16 * (np.maximum(a, 0) - a))


def test_a_chain_too_deep_to_inline_is_a_fusion_error() -> None:
    x = T("x", (3,))
    ops, v = [], x
    for k in range(400):
        v = kg.add(kg.relu(v) if k % 2 else kg.neg(v), x)
        ops += [v.inputs[0], v]
    with pytest.raises(kg.FusionError, match="too deep.*shorter pieces"):
        kg.fuse(*ops)
