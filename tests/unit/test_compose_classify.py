"""Index-map composition and mapping-type classification on maps built by real kernelgen
operators: compose() agrees with evaluating consumer then producer, classify() gives the DNNFusion
type of known operators (edge cases included), and One-to-One composition keeps the type."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kernelgen as kg
from kernelgen.mapping_types import IndexMap, MappingType, classify, compose, evaluate

OTO, OTM, MTM = MappingType.ONE_TO_ONE, MappingType.ONE_TO_MANY, MappingType.MANY_TO_MANY
REORG, SHUF = MappingType.REORGANIZE, MappingType.SHUFFLE


# --- random operators on a given input -----------------------------------------------------

def _factor_shape(draw, numel):
    """A random shape with ``numel`` elements (rank 1-4)."""
    dims = []
    rest = numel
    for _ in range(draw(st.integers(0, 3))):
        divisors = [d for d in range(1, rest + 1) if rest % d == 0]
        d = draw(st.sampled_from(divisors))
        dims.append(d)
        rest //= d
    dims.append(rest)
    return tuple(draw(st.permutations(dims)))


def _transpose(draw, x):
    return kg.transpose(x, draw(st.permutations(range(x.rank))))


def _reshape(draw, x):
    shape = list(_factor_shape(draw, x.numel))
    if draw(st.booleans()):
        shape[draw(st.integers(0, len(shape) - 1))] = -1
    return kg.reshape(x, shape)


def _flatten(draw, x):
    return kg.flatten(x, draw(st.integers(-x.rank, x.rank)))


def _squeeze(draw, x):
    ones = [a for a, n in enumerate(x.shape) if n == 1]
    if not ones or len(ones) == x.rank:
        return None
    if draw(st.booleans()):
        return kg.squeeze(x)
    return kg.squeeze(x, draw(st.lists(st.sampled_from(ones), min_size=1, unique=True)))


def _unsqueeze(draw, x):
    if x.rank >= 4:
        return None
    count = draw(st.integers(1, 4 - x.rank))
    rank = x.rank + count
    axes = draw(st.lists(st.integers(-rank, rank - 1), min_size=count, max_size=count,
                         unique_by=lambda a: a % rank))
    return kg.unsqueeze(x, axes)


def _slice(draw, x):
    axis = draw(st.integers(0, x.rank - 1))
    n = x.shape[axis]
    step = draw(st.sampled_from([1, 2, 3, -1, -2]))
    start = draw(st.integers(-n - 1, n + 1))
    end = draw(st.integers(-n - 1, n + 1))
    if not range(*slice(start, end, step).indices(n)):
        return None
    return kg.slice(x, [start], [end], [axis], [step])


def _expand(draw, x):
    shape = [draw(st.integers(1, 3)) if n == 1 else n for n in x.shape]
    lead = [draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, max(0, 4 - x.rank))))]
    return kg.expand(x, lead + shape)


def _pad(draw, x):
    pads = []
    for _ in range(2):
        for n in x.shape:
            pads.append(draw(st.integers(-((n - 1) // 2), 2)))
    mode = draw(st.sampled_from(["constant", "edge"]))
    if mode == "edge" and any(p < 0 for p in pads):
        mode = "constant"
    return kg.pad(x, pads, mode=mode)


def _depth_to_space(draw, x):
    if x.rank != 4:
        return None
    blocks = [b for b in (2, 3) if x.shape[1] % (b * b) == 0]
    if not blocks:
        return None
    return kg.depth_to_space(x, draw(st.sampled_from(blocks)),
                             mode=draw(st.sampled_from(["DCR", "CRD"])))


def _space_to_depth(draw, x):
    if x.rank != 4:
        return None
    blocks = [b for b in (2, 3) if x.shape[2] % b == 0 and x.shape[3] % b == 0]
    if not blocks:
        return None
    return kg.space_to_depth(x, draw(st.sampled_from(blocks)))


def _resize(draw, x):
    scales = [float(draw(st.sampled_from([1, 2, 3]))) for _ in x.shape]
    return kg.resize(x, scales=scales, coordinate_transformation_mode=draw(
        st.sampled_from(["asymmetric", "half_pixel", "align_corners"])))


SHAPE_OPS = [_transpose, _reshape, _flatten, _squeeze, _unsqueeze, _slice, _expand, _pad,
             _depth_to_space, _space_to_depth, _resize]


def _softmax(draw, x):
    return kg.softmax(x, draw(st.integers(-x.rank, x.rank - 1)))


def _reduce(draw, x):
    axes = draw(st.lists(st.integers(0, x.rank - 1), min_size=1, max_size=x.rank, unique=True))
    fn = draw(st.sampled_from([kg.reduce_sum, kg.reduce_max, kg.reduce_mean]))
    return fn(x, axes, keepdims=draw(st.sampled_from([0, 1])))


def _gather(draw, x):
    idx = kg.tensor("idx", (draw(st.integers(1, 3)),), "int64")
    return kg.gather(x, idx, draw(st.integers(0, x.rank - 1)))


def draw_op(draw, x, builders):
    """Apply a random applicable operator from ``builders`` to ``x``."""
    while True:
        op = draw(st.sampled_from(builders))(draw, x)
        if op is not None:
            return op


@st.composite
def input_tensor(draw):
    if draw(st.integers(0, 3)) == 0:  # NCHW shapes that DepthToSpace/SpaceToDepth accept
        shape = (draw(st.integers(1, 2)), draw(st.sampled_from([1, 2, 4, 8])),
                 draw(st.sampled_from([1, 2, 3, 4])), draw(st.sampled_from([2, 3, 4])))
    else:
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    return kg.tensor("x", shape)


@st.composite
def op_chains(draw):
    """(producer map, consumer map): two consecutive real operators, the second reading the
    first's output."""
    x = draw(input_tensor())
    first = draw_op(draw, x, SHAPE_OPS)
    second = draw_op(draw, first, SHAPE_OPS)
    return first.index_maps[0], second.index_maps[0]


@st.composite
def operator_maps(draw):
    x = draw(input_tensor())
    if draw(st.booleans()):  # sometimes build on a reorganised input
        x = draw_op(draw, x, SHAPE_OPS)
    op = draw_op(draw, x, SHAPE_OPS + [_softmax, _reduce, _gather])
    return op.index_maps[0]


# --- evaluation helpers --------------------------------------------------------------------

def _points(shape, limit=1 << 14):
    """Every point of ``shape`` (row-major), or ``limit`` random ones of a larger domain."""
    if math.prod(shape) <= limit:
        return [g.reshape(-1) for g in np.indices(shape, dtype=np.int64)]
    rng = np.random.default_rng(math.prod(shape))
    return [rng.integers(0, n, limit, dtype=np.int64) for n in shape]


def _eval(expr, env, count, dtype=np.int64):
    return np.broadcast_to(np.asarray(evaluate(expr, env), dtype=dtype), (count,))


# --- compose -------------------------------------------------------------------------------

@settings(max_examples=200, deadline=None)
@given(op_chains())
def test_compose_agrees_with_pointwise_evaluation(chain):
    producer, consumer = chain
    assert not producer.reduce and not consumer.reduce
    composed = compose(producer, consumer)
    assert composed.out_shape == consumer.out_shape
    assert composed.in_shape == producer.in_shape
    points = _points(consumer.out_shape)
    count = points[0].size
    env_c = dict(zip(consumer.out_symbols, points))
    # consumer first: where in the producer's output it reads ...
    mid = [_eval(e, env_c, count) for e in consumer.exprs]
    env_p = dict(zip(producer.out_symbols, mid))
    # ... then producer: where in the producer's input that element comes from
    expected = [_eval(e, env_p, count) for e in producer.exprs]
    consumer_ok = _eval(consumer.guard, env_c, count, bool)
    producer_ok = _eval(producer.guard, env_p, count, bool)
    both = consumer_ok & producer_ok
    # the composed guard is exactly the conjunction (simplification keeps its meaning)
    np.testing.assert_array_equal(_eval(composed.guard, env_c, count, bool), both,
                                  err_msg=f"guard of {composed}")
    for axis, (e, want) in enumerate(zip(composed.exprs, expected)):
        got = _eval(e, env_c, count)
        np.testing.assert_array_equal(got[both], want[both],
                                      err_msg=f"axis {axis}: {composed} vs {producer} o {consumer}")
    # where both guards hold, the composed read stays inside the producer's input
    for axis, n in enumerate(producer.in_shape):
        got = _eval(composed.exprs[axis], env_c, count)[both]
        assert got.size == 0 or (got.min() >= 0 and got.max() < n)


def test_compose_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="cannot compose"):
        compose(IndexMap.identity((2, 3)), IndexMap.identity((3, 2)))


def test_compose_transpose_twice_is_identity():
    x = kg.tensor("x", (2, 3, 4))
    a = kg.transpose(x, (1, 2, 0))
    b = kg.transpose(a, (2, 0, 1))
    m = compose(a.index_maps[0], b.index_maps[0])
    assert m.exprs == m.out_symbols
    assert classify(m) is OTO


def test_compose_reshape_round_trip_is_identity():
    x = kg.tensor("x", (6, 4))
    a = kg.reshape(x, (2, 3, 4))
    b = kg.reshape(a, (6, 4))
    m = compose(a.index_maps[0], b.index_maps[0])
    # the composed expressions need not be syntactically o0, o1, but they are the identity
    points = _points((6, 4))
    env = dict(zip(m.out_symbols, points))
    for e, p in zip(m.exprs, points):
        np.testing.assert_array_equal(_eval(e, env, p.size), p)
    assert classify(m) is OTO


# --- classify on known operators -----------------------------------------------------------

def _map(op, slot=0):
    return op.index_maps[slot]


def test_identity_is_one_to_one():
    assert classify(IndexMap.identity((3, 4))) is OTO
    assert classify(_map(kg.relu(kg.tensor("x", (3, 4))))) is OTO


@pytest.mark.parametrize("perm", [(1, 0, 2), (2, 1, 0), (0, 2, 1), (1, 2, 0)])
def test_transpose_is_shuffle(perm):
    assert classify(_map(kg.transpose(kg.tensor("x", (2, 3, 4)), perm))) is SHUF


@pytest.mark.parametrize("build", [
    lambda x: kg.reshape(x, (6, 4)),
    lambda x: kg.reshape(x, (4, 3, 2)),
    lambda x: kg.reshape(x, (-1,)),
    lambda x: kg.flatten(x, 1),
    lambda x: kg.flatten(x, 0),
    lambda x: kg.unsqueeze(x, [0]),
    lambda x: kg.unsqueeze(x, [1, 4]),
], ids=["reshape", "reshape3", "reshape-1", "flatten1", "flatten0", "unsqueeze", "unsqueeze2"])
def test_reorganizing_ops_are_reorganize(build):
    assert classify(_map(build(kg.tensor("x", (2, 3, 4))))) is REORG


@pytest.mark.parametrize("axes", [None, [0], [2], [0, 2]])
def test_squeeze_is_reorganize(axes):
    assert classify(_map(kg.squeeze(kg.tensor("x", (1, 5, 1)), axes))) is REORG


def test_broadcast_operand_of_add_is_one_to_many():
    add = kg.add(kg.tensor("a", (4, 5)), kg.tensor("b", (1, 5)))
    assert classify(_map(add, 0)) is OTO
    assert classify(_map(add, 1)) is OTM
    assert add.mapping_type is OTO
    rank_broadcast = kg.add(kg.tensor("a", (4, 5)), kg.tensor("c", (5,)))
    assert classify(_map(rank_broadcast, 1)) is OTM


def test_expand_is_one_to_many():
    assert classify(_map(kg.expand(kg.tensor("x", (1, 3)), (4, 3)))) is OTM


@pytest.mark.parametrize("build", [
    lambda x: kg.reduce_sum(x, [1]),
    lambda x: kg.reduce_max(x, [0, 2], keepdims=0),
    lambda x: kg.reduce_mean(x),
    lambda x: kg.softmax(x, 1),
    lambda x: kg.log_softmax(x, -1),
], ids=["sum", "max", "mean-all", "softmax", "logsoftmax"])
def test_reductions_are_many_to_many(build):
    assert classify(_map(build(kg.tensor("x", (2, 3, 4))))) is MTM


def test_strided_slice_is_one_to_one():
    x = kg.tensor("x", (8, 5))
    assert classify(_map(kg.slice(x, [0], [8], [0], [2]))) is OTO
    assert classify(_map(kg.slice(x, [1, 0], [7, 5], [0, 1], [2, 2]))) is OTO


def test_gather_data_input_is_one_to_many():
    g = kg.gather(kg.tensor("x", (5, 3)), kg.tensor("i", (4,), "int64"), 0)
    assert classify(_map(g, 0)) is OTM


def test_depth_to_space_and_space_to_depth_are_shuffle():
    x = kg.tensor("x", (1, 8, 2, 3))
    assert classify(_map(kg.depth_to_space(x, 2))) is SHUF
    assert classify(_map(kg.depth_to_space(x, 2, mode="CRD"))) is SHUF
    assert classify(_map(kg.space_to_depth(kg.tensor("y", (1, 2, 4, 6)), 2))) is SHUF


def test_pad_is_one_to_one():
    x = kg.tensor("x", (2, 3, 4))
    assert classify(_map(kg.pad(x, [0, 1, 0, 0, 1, 2]))) is OTO
    assert classify(_map(kg.pad(x, [0, -1, 1, 0, 0, 1]))) is OTO  # negative pads crop
    assert classify(_map(kg.pad(x, [0, 0, 0, 0, 0, 0], mode="edge"))) is OTO


def test_edge_pad_replicates_border_elements():
    x = kg.tensor("x", (2, 3, 4))
    assert classify(_map(kg.pad(x, [0, 1, 0, 0, 1, 2], mode="edge"))) is OTM


def test_concat_pieces_are_one_to_one():
    c = kg.concat([kg.tensor("a", (2, 3)), kg.tensor("b", (2, 5))], axis=1)
    assert classify(_map(c, 0)) is OTO
    assert classify(_map(c, 1)) is OTO


def test_size_one_edge_cases():
    one = kg.tensor("x", (1,))
    assert classify(IndexMap.identity((1,))) is OTO
    assert classify(_map(kg.relu(one))) is OTO
    # a reduction over an axis of extent 1 reads one element: One-to-One
    assert classify(_map(kg.reduce_sum(kg.tensor("y", (3, 1)), [1]))) is OTO
    assert classify(_map(kg.reduce_sum(one, [0]))) is OTO
    # ... but over a longer axis of the same tensor it is a reduction
    assert classify(_map(kg.reduce_sum(kg.tensor("z", (3, 2)), [1]))) is MTM
    # a transpose that only moves a size-1 axis keeps the row-major order: a reshape
    assert classify(_map(kg.transpose(kg.tensor("t", (1, 5))))) is REORG
    # broadcasting a size-1 tensor to size 1 reads one element per output
    assert classify(_map(kg.expand(one, (1, 1)))) is REORG


# --- stability under composition with One-to-One -------------------------------------------

@settings(max_examples=200, deadline=None)
@given(operator_maps())
def test_classification_is_stable_under_identity_composition(m):
    want = classify(m)
    after = compose(m, IndexMap.identity(m.out_shape))   # identity consumer
    before = compose(IndexMap.identity(m.in_shape), m)   # identity producer
    assert classify(after) is want, f"{m} -> {after}"
    assert classify(before) is want, f"{m} -> {before}"


@settings(max_examples=100, deadline=None)
@given(operator_maps())
def test_classification_is_stable_under_elementwise_op_composition(m):
    # the same, with the identity maps of real elementwise operators on either side
    inner = kg.tensor("p", m.in_shape)
    outer = kg.tensor("q", m.out_shape)
    want = classify(m)
    assert classify(compose(_map(kg.exp(inner)), m)) is want
    assert classify(compose(m, _map(kg.neg(outer)))) is want


# --- large domains -------------------------------------------------------------------------

def test_large_transpose_is_shuffle():
    x = kg.tensor("x", (300, 400))
    assert math.prod(x.shape) > 1 << 16
    assert classify(_map(kg.transpose(x))) is SHUF


@pytest.mark.parametrize("shape", [(100, 10000), (1000000,), (10, 100, 1000)])
def test_large_reshape_is_reorganize(shape):
    assert classify(_map(kg.reshape(kg.tensor("x", (1000, 1000)), shape))) is REORG


def test_large_other_types():
    x = kg.tensor("x", (1000, 1000))
    assert classify(_map(kg.reduce_sum(x, [1]))) is MTM
    assert classify(_map(kg.slice(x, [0], [1000], [1], [2]))) is OTO
    assert classify(_map(kg.expand(kg.tensor("b", (1, 1000)), (1000, 1000)))) is OTM
    assert classify(IndexMap.identity((1000, 1000))) is OTO
