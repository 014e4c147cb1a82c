"""Index algebra of mapping_types: FloorDiv/FloorMod floor semantics, range-aware simplification
(simplify_index) and interval bounds (bounds), checked against NumPy evaluation on every point."""
import itertools

import numpy as np
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

from kernelgen.mapping_types import FloorDiv, FloorMod, evaluate, out_symbols, simplify_index
from kernelgen.mapping_types.index import bounds

O = out_symbols(3)


# --- constant folding ----------------------------------------------------------------------

def test_floor_semantics_of_negative_numerators():
    assert FloorDiv(-7, 2) == -4
    assert FloorMod(-7, 2) == 1
    assert FloorDiv(7, 2) == 3
    assert FloorMod(7, 2) == 1


@pytest.mark.parametrize("a, b", list(itertools.product(range(-13, 14), (1, 2, 3, 5, 8))))
def test_constant_folding_matches_python(a, b):
    q, r = FloorDiv(a, b), FloorMod(a, b)
    assert q.is_Integer and r.is_Integer
    assert int(q) == a // b
    assert int(r) == a % b
    assert 0 <= int(r) < b


def test_trivial_divisors_and_zero_numerators():
    assert FloorDiv(O[0], 1) == O[0]
    assert FloorMod(O[0], 1) == 0
    assert FloorDiv(0, 7) == 0
    assert FloorMod(0, 7) == 0


def test_floor_ops_on_symbols_stay_symbolic_and_integer():
    e = FloorDiv(O[0] + 3, 4)
    assert isinstance(e, FloorDiv)
    assert e.is_integer
    m = FloorMod(O[0] - 5, 4)
    assert isinstance(m, FloorMod)
    assert m.is_integer and m.is_nonnegative


def test_evaluate_uses_floor_semantics_on_arrays():
    a = np.arange(-9, 10)
    np.testing.assert_array_equal(evaluate(FloorDiv(O[0] - 9, 4), {O[0]: a + 9}), a // 4)
    np.testing.assert_array_equal(evaluate(FloorMod(O[0] - 9, 4), {O[0]: a + 9}), a % 4)


# --- simplify_index on reshape-style round trips -------------------------------------------

@pytest.mark.parametrize("rows, cols", [(1, 2), (2, 3), (5, 7), (16, 4), (1, 9), (300, 400)])
def test_reshape_round_trip_simplifies(rows, cols):
    o0, o1 = O[0], O[1]
    ranges = {o0: rows, o1: cols}
    flat = o0 * cols + o1
    assert simplify_index(FloorDiv(flat, cols), ranges) == o0
    assert simplify_index(FloorMod(flat, cols), ranges) == o1


@pytest.mark.parametrize("rows", [1, 3])
def test_reshape_round_trip_with_unit_columns_keeps_values(rows):
    # cols == 1: FloorDiv(x, 1) folds to x at construction; o1 only takes the value 0
    o0, o1 = O[0], O[1]
    ranges = {o0: rows, o1: 1}
    env = {o0: np.arange(rows), o1: np.zeros(rows, np.int64)}
    div = simplify_index(FloorDiv(o0 + o1, 1), ranges)
    np.testing.assert_array_equal(evaluate(div, env), np.arange(rows))
    assert simplify_index(FloorMod(o0 + o1, 1), ranges) == 0


def test_three_axis_round_trip_simplifies():
    o0, o1, o2 = O
    ranges = {o0: 2, o1: 3, o2: 4}
    flat = o0 * 12 + o1 * 4 + o2
    assert simplify_index(FloorDiv(flat, 12), ranges) == o0
    assert simplify_index(FloorMod(FloorDiv(flat, 4), 3), ranges) == o1
    assert simplify_index(FloorMod(flat, 4), ranges) == o2


@pytest.mark.parametrize("dims", [(3, 5), (4, 5, 7), (2, 3, 4, 5), (7, 1, 3)])
def test_a_merged_axis_split_again_folds_back(dims):
    """The offset of a read through a reshape that merges axes, ``sum(stride_k * index_k)``
    with each index a division and remainder of the merged axis, folds back to the merged
    axis itself, however many axes were merged (their divisions nest)."""
    o1 = O[1]
    n = int(np.prod(dims))
    strides = [int(np.prod(dims[k + 1:])) for k in range(len(dims))]
    offset = sum(s * FloorMod(FloorDiv(o1, s), d) if k else s * FloorDiv(o1, s)
                 for k, (s, d) in enumerate(zip(strides, dims)))
    assert simplify_index(offset, {o1: n}) == o1
    np.testing.assert_array_equal(evaluate(offset, {o1: np.arange(n)}), np.arange(n))


@pytest.mark.parametrize("batch", [1, 3])
def test_a_channel_split_behind_a_batch_axis_factors(batch):
    """A Reshape splitting channels (1, 112, 56, 56) -> (1, 28, 4, 56, 56), as ShuffleNet's
    channel shuffle has: the batch axis's multiple of the divisor splits off, and the rest
    still factors to ``c // 4`` (it had stayed a division of the whole offset by 12544,
    which a conv reading through it then computed at every tap)."""
    n, c, h, w = out_symbols(4)
    ranges = {n: batch, c: 112, h: 56, w: 56}
    flat = 351232 * n + 3136 * c + 56 * h + w
    assert simplify_index(FloorMod(FloorDiv(flat, 12544), 28), ranges) == FloorDiv(c, 4)
    got = simplify_index(FloorDiv(flat, 12544), ranges)
    assert got == 28 * n + FloorDiv(c, 4)
    grid = np.indices((batch, 112, 56, 56)).reshape(4, -1)
    np.testing.assert_array_equal(evaluate(got, dict(zip((n, c, h, w), grid))),
                                  (351232 * grid[0] + 3136 * grid[1] + 56 * grid[2] + grid[3])
                                  // 12544)


def test_nested_floordiv_merges():
    o0 = O[0]
    ranges = {o0: 1000}
    got = simplify_index(FloorDiv(FloorDiv(o0, 3), 5), ranges)
    assert got == FloorDiv(o0, 15)
    # also when the inner numerator is an affine expression
    o1 = O[1]
    ranges = {o0: 40, o1: 7}
    got = simplify_index(FloorDiv(FloorDiv(o0 + 3 * o1, 2), 4), ranges)
    assert got == FloorDiv(o0 + 3 * o1, 8)
    g0, g1 = np.indices((40, 7)).reshape(2, -1)
    np.testing.assert_array_equal(evaluate(got, {o0: g0, o1: g1}), ((g0 + 3 * g1) // 2) // 4)


def test_nested_floormod_with_dividing_modulus_merges():
    o0 = O[0]
    got = simplify_index(FloorMod(FloorMod(o0, 12), 4), {o0: 100})
    assert got == FloorMod(o0, 4)


def test_nested_floormod_with_non_dividing_modulus_is_kept():
    o0 = O[0]
    e = FloorMod(FloorMod(o0, 10), 4)
    got = simplify_index(e, {o0: 100})
    points = np.arange(100)
    np.testing.assert_array_equal(evaluate(got, {o0: points}), (points % 10) % 4)
    assert got != FloorMod(o0, 4)


def test_range_too_large_does_not_simplify():
    o0, o1 = O[0], O[1]
    cols = 4
    ranges = {o0: 3, o1: cols + 1}  # o1 may reach cols: the carry into o0 is real
    div = simplify_index(FloorDiv(o0 * cols + o1, cols), ranges)
    mod = simplify_index(FloorMod(o0 * cols + o1, cols), ranges)
    assert div != o0
    assert mod != o1
    assert div.has(FloorDiv)
    assert mod.has(FloorMod)
    # and what it did produce is still exact
    g0, g1 = np.indices((3, cols + 1)).reshape(2, -1)
    env = {o0: g0, o1: g1}
    np.testing.assert_array_equal(evaluate(div, env), (g0 * cols + g1) // cols)
    np.testing.assert_array_equal(evaluate(mod, env), (g0 * cols + g1) % cols)


def test_small_numerators_fold_to_zero_or_themselves():
    o0 = O[0]
    assert simplify_index(FloorDiv(o0, 4), {o0: 4}) == 0
    assert simplify_index(FloorMod(o0, 4), {o0: 4}) == o0
    assert simplify_index(FloorDiv(o0, 4), {o0: 5}) == FloorDiv(o0, 4)
    assert simplify_index(FloorMod(o0, 4), {o0: 5}) == FloorMod(o0, 4)


def test_negative_offsets_keep_floor_semantics():
    o0 = O[0]
    ranges = {o0: 10}
    e = simplify_index(FloorDiv(3 * o0 - 1, 3), ranges)
    assert e == o0 - 1
    e = simplify_index(FloorMod(3 * o0 - 1, 3), ranges)
    assert e == 2


# --- property tests ------------------------------------------------------------------------

@st.composite
def expressions(draw, nsyms):
    """Random affine / FloorDiv / FloorMod / Min / Max expressions over the first ``nsyms``
    output symbols."""
    syms = O[:nsyms]
    leaf = st.one_of(st.sampled_from(syms), st.integers(-6, 6).map(sympy.Integer))

    def extend(children):
        return st.one_of(
            st.tuples(children, children).map(lambda t: t[0] + t[1]),
            st.tuples(children, children).map(lambda t: t[0] - t[1]),
            st.tuples(children, st.integers(-4, 6)).map(lambda t: t[0] * t[1]),
            st.tuples(children, st.integers(1, 7)).map(lambda t: FloorDiv(t[0], t[1])),
            st.tuples(children, st.integers(1, 7)).map(lambda t: FloorMod(t[0], t[1])),
            st.tuples(children, children).map(lambda t: sympy.Min(*t)),
            st.tuples(children, children).map(lambda t: sympy.Max(*t)),
        )

    return draw(st.recursive(leaf, extend, max_leaves=10))


@st.composite
def expr_and_ranges(draw):
    nsyms = draw(st.integers(2, 3))
    ranges = {s: draw(st.integers(1, 9)) for s in O[:nsyms]}
    # bias toward the reshape pattern d*q + r that simplify_index targets
    if draw(st.booleans()):
        d = draw(st.integers(1, 6))
        q = draw(expressions(nsyms))
        r = draw(expressions(nsyms))
        wrap = draw(st.sampled_from([FloorDiv, FloorMod]))
        expr = wrap(d * q + r, d)
        if draw(st.booleans()):
            expr = expr + draw(expressions(nsyms))
    else:
        expr = draw(expressions(nsyms))
    return sympy.sympify(expr), ranges


def grid(ranges):
    syms = list(ranges)
    points = np.indices(tuple(ranges[s] for s in syms), dtype=np.int64).reshape(len(syms), -1)
    return {s: p for s, p in zip(syms, points)}, points.shape[1]


def values(expr, env, count):
    return np.broadcast_to(np.asarray(evaluate(expr, env), dtype=np.int64), (count,))


@settings(max_examples=200, deadline=None)
@given(expr_and_ranges())
def test_simplify_index_preserves_values(case):
    expr, ranges = case
    env, count = grid(ranges)
    simplified = simplify_index(expr, ranges)
    expected = values(expr, env, count)
    np.testing.assert_array_equal(values(simplified, env, count), expected,
                                  err_msg=f"{expr} -> {simplified} with {ranges}")
    # simplifying again must not change the values either
    again = simplify_index(simplified, ranges)
    np.testing.assert_array_equal(values(again, env, count), expected,
                                  err_msg=f"{simplified} -> {again} with {ranges}")


@settings(max_examples=200, deadline=None)
@given(expr_and_ranges())
def test_bounds_are_sound(case):
    expr, ranges = case
    env, count = grid(ranges)
    for e in (expr, simplify_index(expr, ranges)):
        b = bounds(e, ranges)
        # affine / FloorDiv / FloorMod expressions are always bounded
        assert b is not None, e
        lo, hi = b
        assert lo <= hi
        v = values(e, env, count)
        assert v.min() >= lo and v.max() <= hi, f"{e}: values [{v.min()}, {v.max()}], bounds {b}"


@settings(max_examples=50, deadline=None)
@given(expr_and_ranges(), st.integers(0, 5), st.integers(1, 5))
def test_bounds_are_sound_through_max_and_min(case, lo_clamp, width):
    expr, ranges = case
    env, count = grid(ranges)
    e = sympy.Max(lo_clamp, sympy.Min(lo_clamp + width, expr))
    b = bounds(e, ranges)
    if b is None:  # sympy may have folded the clamp into something bounds does not follow
        return
    v = values(e, env, count)
    assert b[0] <= v.min() and v.max() <= b[1]


def test_bounds_of_unknown_symbols_and_functions_is_none():
    free = sympy.Symbol("n", integer=True)
    assert bounds(free + O[0], {O[0]: 4}) is None
    assert bounds(O[0] ** 2, {O[0]: 4}) is None


def test_bounds_examples():
    o0, o1 = O[0], O[1]
    ranges = {o0: 5, o1: 3}
    assert bounds(o0, ranges) == (0, 4)
    assert bounds(2 * o0 - o1, ranges) == (-2, 8)
    assert bounds(FloorDiv(o0, 2), ranges) == (0, 2)
    assert bounds(FloorMod(o0 + 7, 3), ranges) == (0, 2)
    assert bounds(FloorMod(o1, 4), ranges) == (0, 2)


def test_clamps_that_never_bind_are_dropped():
    o0, o1 = O[0], O[1]
    ranges = {o0: 56, o1: 9}
    # a nearest Resize by 2 clamps its source index to [0, 27]: o0 // 2 never leaves it
    assert simplify_index(sympy.Max(0, sympy.Min(27, FloorDiv(o0, 2))), ranges) == FloorDiv(o0, 2)
    # half of the clamp binds: o1 - 2 goes below 0, never above 10
    assert simplify_index(sympy.Max(0, sympy.Min(10, o1 - 2)), ranges) == sympy.Max(0, o1 - 2)
    assert simplify_index(sympy.Min(o1, 8), ranges) == o1
    assert simplify_index(sympy.Min(o1, 7), ranges) == sympy.Min(o1, 7)
    # bounds that touch ([-3, 5] and [5, 10]): the one that decides stays
    low, high = o1 - 3, 5 + FloorMod(o0, 6)
    assert simplify_index(sympy.Max(low, high), ranges) == high
    assert simplify_index(sympy.Min(low, high), ranges) == low


# --- specialised offsets (ir.substitute.specialise_index, cached) --------------------------

def test_specialised_offsets_depend_on_the_ranges_of_what_is_left():
    # the same offset and values under other ranges: the cache must not answer for both
    from kernelgen.ir.substitute import specialise_index
    o, u = O[0], sympy.Symbol("u_test", integer=True, nonnegative=True)
    offset = FloorDiv(o + 2, 4) + 5 * FloorMod(o, 3)
    narrow = specialise_index(offset, {o: 2 * u}, {u: 1})  # o + 2 == 2 < 4: no division
    wide = specialise_index(offset, {o: 2 * u}, {u: 8})
    assert not narrow.has(FloorDiv) and wide.has(FloorDiv)
    assert int(narrow.subs(u, 0)) == 0
    for value in range(8):
        want = (2 * value + 2) // 4 + 5 * ((2 * value) % 3)
        assert int(wide.subs(u, value)) == want
    # asked again, each gives its own answer
    assert specialise_index(offset, {o: 2 * u}, {u: 1}) == narrow
    assert specialise_index(offset, {o: 2 * u}, {u: 8}) == wide


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(0, 5), st.integers(1, 12), st.integers(2, 6))
def test_specialised_offsets_match_the_offset_at_every_point(f, r, n, d):
    """``specialise_index`` of ``o = f*u + r`` (an unrolled copy) equals the offset evaluated at
    every point, asked twice (the second answer is the cached one)."""
    from kernelgen.ir.substitute import specialise_index
    o, k = O[0], O[1]
    u = sympy.Symbol(f"u_{o}_{f}", integer=True, nonnegative=True)
    offset = 7 * FloorDiv(o + k, d) + FloorMod(3 * o + 1, d) + k
    ranges = {u: n, k: 3}
    for _ in range(2):
        got = specialise_index(offset, {o: f * u + r}, ranges)
        for uv, kv in itertools.product(range(n), range(3)):
            ov = f * uv + r
            want = 7 * ((ov + kv) // d) + (3 * ov + 1) % d + kv
            assert int(got.subs({u: uv, k: kv})) == want
