"""Typed errors: each names the operator, the input and the axis at fault (shape, broadcast, dtype,
axis and attribute errors at construction; red and non-convex fusion; backend capabilities; and
kernel argument checks, which run before any OpenCL device is touched)."""
import dataclasses

import numpy as np
import pytest

import kernelgen as kg
from kernelgen import DType, backends
from kernelgen.backends.opencl.emit import OpenCLPrinter
from kernelgen.mapping_types import Colour


def _raises(exc_type, fn, *args, **kwargs):
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    return info.value


def test_all_errors_share_the_base_class():
    for cls in (kg.ShapeError, kg.BroadcastError, kg.DtypeError, kg.AxisError,
                kg.AttributeError_, kg.FusionError, kg.UnsupportedError, kg.ArgumentError):
        assert issubclass(cls, kg.KernelgenError)
    assert issubclass(kg.BroadcastError, kg.ShapeError)


# --- shapes --------------------------------------------------------------------------------

def test_reshape_to_wrong_element_count():
    x = kg.tensor("activations", (2, 3))
    err = _raises(kg.ShapeError, kg.reshape, x, (4, 2))
    assert isinstance(err, ValueError)
    assert err.op == "Reshape" and err.input == "activations"
    msg = str(err)
    assert "Reshape" in msg and "'activations'" in msg
    assert "6 elements" in msg and "(4, 2)" in msg


def test_reshape_with_indivisible_inferred_dim():
    err = _raises(kg.ShapeError, kg.reshape, kg.tensor("x", (2, 3)), (-1, 4))
    assert "Reshape" in str(err) and "'x'" in str(err)


def test_squeeze_of_a_non_unit_axis_names_the_axis():
    err = _raises(kg.ShapeError, kg.squeeze, kg.tensor("x", (1, 3)), [1])
    assert err.axis == 1
    assert "Squeeze" in str(err) and "'x'" in str(err) and "axis 1" in str(err)


def test_concat_mismatch_names_the_input_and_axis():
    a, b = kg.tensor("left", (2, 3)), kg.tensor("right", (4, 5))
    err = _raises(kg.ShapeError, kg.concat, [a, b], 1)
    assert err.op == "Concat" and err.input == "right" and err.axis == 0


def test_tensor_with_an_empty_dimension():
    err = _raises(kg.ShapeError, kg.tensor, "x", (3, 0))
    assert err.axis == 1 and "'x'" in str(err)


def test_unbroadcastable_add_names_both_inputs():
    lhs, rhs = kg.tensor("lhs", (2, 3)), kg.tensor("rhs", (4,))
    err = _raises(kg.BroadcastError, kg.add, lhs, rhs)
    assert isinstance(err, kg.ShapeError)
    assert err.op == "Add"
    msg = str(err)
    assert "Add" in msg
    assert "'lhs' (2, 3)" in msg and "'rhs' (4,)" in msg


# --- dtypes --------------------------------------------------------------------------------

def test_dtype_mismatch_add():
    f, i = kg.tensor("f", (2, 3), "float32"), kg.tensor("i", (2, 3), "int32")
    err = _raises(kg.DtypeError, kg.add, f, i)
    assert isinstance(err, TypeError)
    assert err.op == "Add" and err.input == "i"
    msg = str(err)
    assert "Add" in msg and "'i'" in msg and "int32" in msg and "float32" in msg


def test_dtype_not_accepted_by_the_operator():
    err = _raises(kg.DtypeError, kg.softmax, kg.tensor("ints", (2, 3), "int32"))
    assert err.op == "Softmax" and err.input == "ints"
    err = _raises(kg.DtypeError, kg.gather, kg.tensor("d", (4,)), kg.tensor("idx", (2,)))
    assert err.op == "Gather" and err.input == "idx"


# --- axes ----------------------------------------------------------------------------------

def test_softmax_axis_out_of_range():
    x = kg.tensor("logits", (2, 3))
    err = _raises(kg.AxisError, kg.softmax, x, axis=5)
    assert isinstance(err, IndexError)
    assert err.axis == 5 and err.rank == 2
    assert err.op == "Softmax" and err.input == "logits"
    assert "Softmax" in str(err) and "'logits'" in str(err) and "5" in str(err)


def test_negative_axes_are_accepted_and_too_negative_ones_rejected():
    x = kg.tensor("x", (2, 3))
    assert kg.softmax(x, axis=-2).shape == (2, 3)
    err = _raises(kg.AxisError, kg.softmax, x, axis=-3)
    assert err.axis == -3


def test_reduce_axis_out_of_range():
    err = _raises(kg.AxisError, kg.reduce_sum, kg.tensor("x", (2, 3)), [0, 2])
    assert err.axis == 2 and err.op == "ReduceSum"


# --- attributes ----------------------------------------------------------------------------

def test_transpose_with_a_perm_of_the_wrong_length():
    err = _raises(kg.AttributeError_, kg.transpose, kg.tensor("x", (2, 3, 4)), (1, 0))
    assert err.op == "Transpose" and err.attribute == "perm"
    assert "Transpose" in str(err) and "perm" in str(err)


def test_transpose_with_an_out_of_range_perm_entry():
    err = _raises(kg.AxisError, kg.transpose, kg.tensor("x", (2, 3)), (0, 5))
    assert err.op == "Transpose" and err.axis == 5


def test_transpose_with_a_repeated_axis():
    err = _raises(kg.KernelgenError, kg.transpose, kg.tensor("x", (2, 3)), (0, 0))
    assert isinstance(err, kg.AttributeError_) and err.attribute == "perm"
    assert "out of range" not in str(err)


def test_bad_mode_attributes():
    err = _raises(kg.AttributeError_, kg.pad, kg.tensor("x", (2, 3)), [0, 0, 1, 1],
                  mode="reflect")
    assert err.op == "Pad" and err.attribute == "mode" and err.got == "reflect"
    err = _raises(kg.AttributeError_, kg.gelu, kg.tensor("x", (2,)), approximate="erf")
    assert err.op == "Gelu"
    # a pool kind that is not an ONNX op type once pooled as a max, silently
    err = _raises(kg.AttributeError_, kg.global_pool, "average", kg.tensor("x", (1, 2, 3, 3)))
    assert err.attribute == "kind" and err.got == "average" and "GlobalAveragePool" in str(err)


# --- fusion --------------------------------------------------------------------------------

def test_red_fusion_is_refused_quoting_the_rule():
    e = kg.expand(kg.tensor("v", (1, 3)), (4, 3))
    r = kg.reduce_sum(e, [0])
    err = _raises(kg.FusionError, kg.fuse, e, r)
    msg = str(err)
    assert "red" in msg
    assert e.name in msg and r.name in msg and "Expand" in msg and "ReduceSum" in msg
    assert "One-to-Many -> Many-to-Many" in msg
    assert "force=True" in msg


def test_red_fusion_with_force():
    e = kg.expand(kg.tensor("v", (1, 3)), (4, 3))
    r = kg.reduce_sum(e, [0])
    fused = kg.fuse(e, r, force=True)
    assert fused.forced
    assert all(edge.rule.colour is Colour.RED for edge in fused.forced)
    assert (fused.forced[0].producer, fused.forced[0].consumer) == (e.name, r.name)
    assert "red" in fused.report()


def test_green_fusion_has_nothing_forced():
    a = kg.relu(kg.tensor("x", (4, 3)))
    fused = kg.fuse(a, kg.exp(a))
    assert fused.forced == ()
    assert not fused.needs_measurement


def test_non_convex_block_names_the_missing_operator():
    a = kg.relu(kg.tensor("x", (4, 3)))
    b = kg.exp(a)
    c = kg.neg(b)
    err = _raises(kg.FusionError, kg.fuse, a, c)
    msg = str(err)
    assert f"'{b.name}'" in msg and "Exp" in msg
    assert "outside the block" in msg
    kg.fuse(a, b, c)  # including it is fine


def test_fuse_rejects_inputs_and_empty_blocks():
    x = kg.tensor("x", (4,))
    err = _raises(kg.FusionError, kg.fuse, x)
    assert "'x'" in str(err)
    _raises(kg.FusionError, kg.fuse)


# --- backend capabilities ------------------------------------------------------------------

def _float64_loop():
    y = kg.relu(kg.tensor("x64", (4, 8), "float64"))
    return kg.fuse(y).lower()


def test_backend_rejects_a_dtype_its_capabilities_lack():
    opencl = backends.get("opencl")
    caps = dataclasses.replace(opencl.caps, dtypes=frozenset({DType.float32}))
    try:
        kg.compile_loop(_float64_loop(), dataclasses.replace(opencl, caps=caps))
    except kg.UnsupportedError as err:
        assert "float64" in str(err) and "opencl" in str(err)
        return
    raise AssertionError("float64 kernel emitted for a float32-only backend")


def test_printer_without_a_scalar_type_raises_unsupported():
    # a language table without a C type for the dtype
    class NoDouble(OpenCLPrinter):
        scalar_types = {k: v for k, v in OpenCLPrinter.scalar_types.items()
                        if k is not DType.float64}

    opencl = backends.get("opencl")
    schedule = opencl.choose(_float64_loop(), {})
    err = _raises(kg.UnsupportedError, NoDouble, schedule, opencl.caps)
    assert err.backend == "opencl" and "float64" in err.capability
    assert "x64" in err.needed_by


def test_unknown_backend():
    fused = kg.fuse(kg.relu(kg.tensor("x", (4,))))
    err = _raises(kg.UnsupportedError, fused.emit, "cuda")
    assert err.backend == "cuda"


# --- kernel arguments ----------------------------------------------------------------------

@pytest.fixture
def kernel(monkeypatch):
    """An emitted add kernel whose device run is replaced by a sentinel: argument checks must
    raise before it (so no OpenCL device is needed)."""
    a, b = kg.tensor("a", (4, 8)), kg.tensor("b", (8,))
    k = kg.fuse(kg.add(a, b)).emit("opencl")

    class DeviceUsed(Exception):
        pass

    def no_device(*args, **kwargs):
        raise DeviceUsed

    monkeypatch.setattr(k.runtime, "run", no_device)
    monkeypatch.setattr(k.runtime, "launch", no_device)
    k.DeviceUsed = DeviceUsed
    return k


def _arrays(*shapes, dtype=np.float32):
    return [np.zeros(s, dtype) for s in shapes]


def test_valid_arguments_reach_the_device(kernel):
    with pytest.raises(kernel.DeviceUsed):
        kernel(*_arrays((4, 8), (8,)))


def test_wrong_number_of_arrays(kernel):
    err = _raises(kg.ArgumentError, kernel, *_arrays((4, 8)))
    msg = str(err)
    assert "takes 2 inputs" in msg and "got 1" in msg and "a, b" in msg
    err = _raises(kg.ArgumentError, kernel, *_arrays((4, 8), (8,), (8,)))
    assert "got 3" in str(err)


def test_wrong_shape(kernel):
    err = _raises(kg.ArgumentError, kernel, *_arrays((4, 8), (7,)))
    msg = str(err)
    assert "'b'" in msg and "(8,)" in msg and "(7,)" in msg


def test_wrong_dtype(kernel):
    a, = _arrays((4, 8))
    b, = _arrays((8,), dtype=np.float64)
    err = _raises(kg.ArgumentError, kernel, a, b)
    msg = str(err)
    assert "'b'" in msg and "float32" in msg and "float64" in msg


def test_wrong_output_array(kernel):
    a, b = _arrays((4, 8), (8,))
    out_name = kernel.loop.outputs[0].name
    err = _raises(kg.ArgumentError, kernel, a, b, out=np.zeros((4, 7), np.float32))
    assert f"'{out_name}'" in str(err) and "(4, 7)" in str(err)
    err = _raises(kg.ArgumentError, kernel, a, b, out=(np.zeros((4, 8), np.float32),) * 2)
    assert "1 outputs" in str(err)
    non_contiguous = np.zeros((8, 4), np.float32).T
    err = _raises(kg.ArgumentError, kernel, a, b, out=non_contiguous)
    assert "C-contiguous" in str(err)


@pytest.mark.parametrize("backend_name", ["opencl", "neon", "triton"])
def test_backend_without_a_primitive_names_it(backend_name):
    """Capabilities are data: a backend declared without 'erf', and not expanding it into other
    primitives (``fast_math``), refuses Erf, naming it."""
    backend = backends.get(backend_name)
    caps = dataclasses.replace(backend.caps, primitives=backend.caps.primitives - {"erf"},
                               fast_math=backend.caps.fast_math - {"erf"})
    loop = kg.fuse(kg.erf(kg.tensor("x", (3, 5)))).lower()
    err = _raises(kg.UnsupportedError, kg.compile_loop, loop,
                  dataclasses.replace(backend, caps=caps))
    assert err.backend == backend_name and "'erf'" in str(err)


def test_unknown_backend_lists_the_known_ones():
    loop = kg.fuse(kg.relu(kg.tensor("x", (3,)))).lower()
    err = _raises(kg.UnsupportedError, kg.compile_loop, loop, "vulkan")
    assert "opencl" in str(err) and "neon" in str(err) and "triton" in str(err)


# --- integer attributes and sizes (probe D11, D12) -----------------------------------------

_X, _W = ((1, 3, 8, 8), (4, 3, 3, 3))


@pytest.mark.parametrize(("attribute", "value"), [
    ("group", 0), ("group", 1.5), ("strides", [0, 0]), ("strides", [1, -1]),
    ("dilations", [0, 0]), ("dilations", [1, 1.5]), ("pads", [0, 0, 0, 0.5])])
def test_conv_attributes_must_be_positive_integers(attribute, value):
    err = _raises(kg.AttributeError_, kg.conv, kg.tensor("x", _X), kg.tensor("w", _W),
                  **{attribute: value})
    assert err.op == "Conv" and err.attribute == attribute
    msg = str(err)
    assert f"'{attribute}'" in msg and "integer" in msg and str(value) in msg
    if attribute != "pads":  # negative pads crop, so only integrality is asked of them
        assert ">= 1" in msg


@pytest.mark.parametrize("pool", [kg.max_pool, kg.average_pool])
@pytest.mark.parametrize(("attribute", "value"), [("strides", [0, 0]), ("dilations", [0, 1]),
                                                  ("kernel_shape", [2.0, 2])])
def test_pool_windows_must_be_positive_integers(pool, attribute, value):
    kwargs = {"kernel_shape": [2, 2], attribute: value}
    err = _raises(kg.AttributeError_, pool, kg.tensor("x", _X), **kwargs)
    assert err.op in ("MaxPool", "AveragePool") and err.attribute == attribute
    assert err.op in str(err) and f"'{attribute}'" in str(err)


@pytest.mark.parametrize("size", [2.5, 4.0, True, "3", None])
def test_tensor_sizes_must_be_integers(size):
    err = _raises(kg.ShapeError, kg.tensor, "x", (size, 4))
    assert err.op == "tensor" and err.input == "x" and err.axis == 0
    assert "int sizes" in str(err) and repr(size) in str(err)


def test_numpy_integer_sizes_and_attributes_are_accepted():
    x = kg.tensor("x", (np.int64(3), np.int32(4)))
    assert x.shape == (3, 4) and all(type(n) is int for n in x.shape)
    assert kg.reshape(x, (np.int64(4), 3)).shape == (4, 3)
    assert kg.slice(x, [np.int64(1)], [3], [0]).shape == (2, 4)
    assert kg.softmax(x, axis=np.int64(1)).shape == (3, 4)


@pytest.mark.parametrize(("attribute", "kwargs"), [
    ("starts", {"starts": [1.5], "ends": [3]}), ("ends", {"starts": [0], "ends": [2.0]}),
    ("steps", {"starts": [0], "ends": [3], "steps": [1.0]})])
def test_slice_bounds_must_be_integers(attribute, kwargs):
    err = _raises(kg.AttributeError_, kg.slice, kg.tensor("x", (6, 4)), axes=[0], **kwargs)
    assert err.op == "Slice" and err.attribute == attribute


def test_reshape_sizes_must_be_integers():
    err = _raises(kg.AttributeError_, kg.reshape, kg.tensor("x", (3, 4)), (4.0, 3))
    assert err.op == "Reshape" and err.attribute == "shape" and "integers" in str(err)


@pytest.mark.parametrize("axis", ["1", 1.0, True])
def test_non_integer_axes_are_refused(axis):
    err = _raises(kg.AttributeError_, kg.softmax, kg.tensor("x", (3, 4)), axis=axis)
    assert err.op == "Softmax" and err.attribute == "axis" and "integer" in str(err)
    err = _raises(kg.AttributeError_, kg.reduce_sum, kg.tensor("x", (3, 4)), [axis])
    assert err.op == "ReduceSum" and err.attribute == "axes"


# --- messages (probe D16) ------------------------------------------------------------------

def test_concat_of_nothing():
    err = _raises(kg.ShapeError, kg.concat, [], axis=0)
    assert err.op == "Concat" and "non-empty list" in str(err)


def test_matmul_batch_mismatch_names_the_users_tensors_and_shapes():
    err = _raises(kg.ShapeError, kg.matmul, kg.tensor("left", (2, 3, 4)),
                  kg.tensor("right", (3, 4, 6)))
    assert err.op == "MatMul" and err.input == "right" and err.axis == 0
    msg = str(err)
    assert "'left' (2, 3, 4)" in msg and "(3, 4, 6)" in msg and "batch" in msg


def test_fuse_of_a_list_says_to_unpack_it():
    err = _raises(kg.FusionError, kg.fuse, [kg.relu(kg.tensor("x", (3,)))])
    assert "separate arguments" in str(err) and "fuse(*ops)" in str(err)
    err = _raises(kg.FusionError, kg.fuse, 3)
    assert "int" in str(err) and "input tensor" not in str(err)


def test_split_into_too_many_pieces_reports_num_outputs():
    err = _raises(kg.AttributeError_, kg.split, kg.tensor("s", (3, 4)), num_outputs=5)
    assert err.attribute == "num_outputs" and err.got == 5
    assert "'s'" in str(err) and "size 3" in str(err)


@pytest.mark.parametrize("dtype", ["int8", "complex64", "bfloat16", "uint8"])
def test_unsupported_dtypes_are_dtype_errors_naming_the_tensor(dtype):
    err = _raises(kg.DtypeError, kg.tensor, "weights", (3,), dtype)
    assert isinstance(err, TypeError) and err.input == "weights"
    assert dtype in str(err) and "float32" in str(err)


def test_unsupported_constant_and_cast_dtypes():
    err = _raises(kg.DtypeError, kg.constant, "c", np.ones(3, "int8"))
    assert err.input == "c" and "int8" in str(err)
    err = _raises(kg.DtypeError, kg.cast, kg.tensor("x", (3,)), to="int8")
    assert err.input == "x" and "Cast" in str(err) and "'to'" in str(err)


# --- names (probe D7) ----------------------------------------------------------------------

def test_distinct_inputs_with_one_name_are_refused():
    err = _raises(kg.FusionError, kg.fuse, kg.sub(kg.tensor("x", (3,)), kg.tensor("x", (3,))))
    assert "'x'" in str(err) and "rename" in str(err)
    x = kg.tensor("x", (3,))
    assert len(kg.fuse(kg.sub(x, x)).inputs) == 1  # one tensor used twice is one input


def test_an_input_named_like_the_blocks_output_is_refused():
    x = kg.tensor("x", (3,))
    r = kg.relu(x)
    clash = kg.tensor(r.name, (3,))
    err = _raises(kg.FusionError, kg.fuse, r, kg.add(clash, x))
    assert f"'{r.name}'" in str(err) and "rename" in str(err)


def test_two_outputs_named_alike_are_refused():
    x = kg.tensor("x", (3,))
    a, b = kg.relu(x), kg.exp(x)
    b.name = a.name
    err = _raises(kg.FusionError, kg.fuse, a, b)
    assert f"'{a.name}'" in str(err) and "Relu" in str(err) and "Exp" in str(err)


# --- bench (probe D13) ---------------------------------------------------------------------

def test_bench_checks_dtypes_before_the_device(kernel, monkeypatch):
    def no_device(*args, **kwargs):
        raise kernel.DeviceUsed

    monkeypatch.setattr(kernel.runtime, "device_array", no_device)
    a, = _arrays((4, 8))
    b, = _arrays((8,), dtype=np.float16)
    err = _raises(kg.ArgumentError, kg.bench, kernel, a, b)
    msg = str(err)
    assert kernel.name in msg and "'b'" in msg and "float32" in msg and "float16" in msg


@pytest.mark.parametrize("thing", [lambda x: x, [], "kernel", None])
def test_bench_takes_kernels(thing):
    err = _raises(kg.ArgumentError, kg.bench, thing, np.zeros(3, "f4"))
    assert "bench takes a kernel" in str(err)
