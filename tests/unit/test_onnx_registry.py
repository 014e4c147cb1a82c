"""The ONNX registry classifies exactly the standard-domain operators, each one sensibly."""
from __future__ import annotations

import pytest

from kernelgen.mapping_types.onnx_registry import ONNX_MAPPING, onnx_mapping_type, standard_onnx_ops
from kernelgen.mapping_types.types import MappingType, Opaque


def test_every_standard_op_is_classified() -> None:
    missing = sorted(set(standard_onnx_ops()) - ONNX_MAPPING.keys())
    assert not missing, f"standard ONNX ops without a mapping entry: {missing}"


def test_no_entry_outside_the_standard_domain() -> None:
    extras = sorted(ONNX_MAPPING.keys() - set(standard_onnx_ops()))
    assert not extras, f"mapping entries that are not standard ONNX ops: {extras}"


def test_standard_ops_are_sorted_and_unique() -> None:
    ops = standard_onnx_ops()
    assert ops == sorted(set(ops))
    assert "Relu" in ops


@pytest.mark.parametrize("op_type", sorted(ONNX_MAPPING))
def test_entry_is_a_mapping_type_or_a_one_line_reason(op_type: str) -> None:
    entry = ONNX_MAPPING[op_type]
    assert isinstance(entry, (MappingType, Opaque)), f"{op_type}: {entry!r}"
    if isinstance(entry, Opaque):
        assert isinstance(entry.reason, str)
        assert entry.reason.strip(), f"{op_type}: empty opaque reason"
        assert "\n" not in entry.reason, f"{op_type}: opaque reason spans several lines"


@pytest.mark.parametrize(
    ("op_type", "expected"),
    [
        ("Relu", MappingType.ONE_TO_ONE),
        ("Add", MappingType.ONE_TO_ONE),
        ("Concat", MappingType.ONE_TO_ONE),
        ("Transpose", MappingType.SHUFFLE),
        ("DepthToSpace", MappingType.SHUFFLE),
        ("Reshape", MappingType.REORGANIZE),
        ("Unsqueeze", MappingType.REORGANIZE),
        ("ReduceSum", MappingType.MANY_TO_MANY),
        ("Conv", MappingType.MANY_TO_MANY),
        ("Softmax", MappingType.MANY_TO_MANY),
        ("MatMul", MappingType.MANY_TO_MANY),
        ("Expand", MappingType.ONE_TO_MANY),
        ("Gather", MappingType.ONE_TO_MANY),
        ("Resize", MappingType.ONE_TO_MANY),
    ],
)
def test_well_known_classifications(op_type: str, expected: MappingType) -> None:
    assert onnx_mapping_type(op_type) is expected


@pytest.mark.parametrize("op_type", ["If", "Loop", "Scan", "NonZero", "RandomNormal", "Shape"])
def test_well_known_opaque_ops(op_type: str) -> None:
    assert isinstance(onnx_mapping_type(op_type), Opaque)


def test_unknown_op_raises_key_error_naming_it() -> None:
    with pytest.raises(KeyError, match="NotAnOnnxOp") as excinfo:
        onnx_mapping_type("NotAnOnnxOp")
    assert "standard domain" in str(excinfo.value)
