"""DNNFusion mapping type of every operator of the ONNX standard domain.

The graph compiler decides what it may fuse from the mapping type of each node
(``MappingType``): how every output element of the operator reads the elements of its
(primary) input. This module holds that classification for the whole standard domain
(``ai.onnx``, written ``""`` in ONNX) at the installed onnx's default opset, so that no
operator reaches the compiler unclassified: each one has either a mapping type or an
explicit ``Opaque`` reason saying why it has no static index map (control flow,
sequences, strings, randomness, data-dependent output shapes, metadata producers).

``ONNX_MAPPING`` is a hand-written table on purpose: the classification is a judgement
about semantics that onnx's schemas do not carry. onnx is only consulted by
``standard_onnx_ops`` (and by the tests) to check that the table covers the domain.
"""
from __future__ import annotations

import onnx.defs

from .types import MappingType, Opaque

_1TO1 = MappingType.ONE_TO_ONE
_1TOM = MappingType.ONE_TO_MANY
_MTOM = MappingType.MANY_TO_MANY
_REORG = MappingType.REORGANIZE
_SHUF = MappingType.SHUFFLE

# Opaque reasons shared by several operators.
_CONTROL_FLOW = Opaque("control flow: subgraph attribute")
_SEQUENCE = Opaque("sequence type: operates on tensor sequences, not tensor elements")
_OPTIONAL = Opaque("optional type: operates on optional values, not tensor elements")
_STRING = Opaque("string op: no numeric element index map")
_RANDOM = Opaque("random: no deterministic index map")
_DATA_SHAPE = Opaque("data-dependent output shape")
_VALUE_SHAPE = Opaque("generator: output shape comes from input values, not shapes")
_METADATA = Opaque("metadata: output derives from the input's shape, not its elements")

ONNX_MAPPING: dict[str, MappingType | Opaque] = {
    # ---- ONE_TO_ONE: elementwise unary math and activations ----
    "Abs": _1TO1,
    "Acos": _1TO1,
    "Acosh": _1TO1,
    "Asin": _1TO1,
    "Asinh": _1TO1,
    "Atan": _1TO1,
    "Atanh": _1TO1,
    "Ceil": _1TO1,
    "Celu": _1TO1,
    "Cos": _1TO1,
    "Cosh": _1TO1,
    "Elu": _1TO1,
    "Erf": _1TO1,
    "Exp": _1TO1,
    "Floor": _1TO1,
    "Gelu": _1TO1,
    "HardSigmoid": _1TO1,
    "HardSwish": _1TO1,
    "LeakyRelu": _1TO1,
    "Log": _1TO1,
    "Mish": _1TO1,
    "Neg": _1TO1,
    "Reciprocal": _1TO1,
    "Relu": _1TO1,
    "Round": _1TO1,
    "Selu": _1TO1,
    "Shrink": _1TO1,
    "Sigmoid": _1TO1,
    "Sign": _1TO1,
    "Sin": _1TO1,
    "Sinh": _1TO1,
    "Softplus": _1TO1,
    "Softsign": _1TO1,
    "Sqrt": _1TO1,
    "Swish": _1TO1,
    "Tan": _1TO1,
    "Tanh": _1TO1,
    "ThresholdedRelu": _1TO1,
    # ---- ONE_TO_ONE: elementwise binary / variadic (numpy broadcasting) ----
    "Add": _1TO1,
    "Div": _1TO1,
    "Max": _1TO1,
    "Mean": _1TO1,
    "Min": _1TO1,
    "Mod": _1TO1,
    "Mul": _1TO1,
    "Pow": _1TO1,
    "PRelu": _1TO1,
    "Sub": _1TO1,
    "Sum": _1TO1,
    "SwiGLU": _1TO1,  # Swish(A) * B, A and B of identical shape
    # ---- ONE_TO_ONE: comparisons, logical and bitwise ops, predicates ----
    "And": _1TO1,
    "BitShift": _1TO1,
    "BitwiseAnd": _1TO1,
    "BitwiseNot": _1TO1,
    "BitwiseOr": _1TO1,
    "BitwiseXor": _1TO1,
    "Equal": _1TO1,
    "Greater": _1TO1,
    "GreaterOrEqual": _1TO1,
    "IsInf": _1TO1,
    "IsNaN": _1TO1,
    "Less": _1TO1,
    "LessOrEqual": _1TO1,
    "Not": _1TO1,
    "Or": _1TO1,
    "Xor": _1TO1,
    "Where": _1TO1,
    "Clip": _1TO1,
    # ---- ONE_TO_ONE: type conversion and (de)quantization with static scales ----
    "BitCast": _1TO1,  # same bit width, so same shape
    "Cast": _1TO1,
    "CastLike": _1TO1,
    "DequantizeLinear": _1TO1,  # per-tensor/axis/block scale broadcast onto x
    "QuantizeLinear": _1TO1,
    # ---- ONE_TO_ONE: inference-time normalization and masking ----
    "BatchNormalization": _1TO1,  # inference: per-channel affine with running stats
    "Dropout": _1TO1,  # identity at inference; a training mask is still elementwise
    "Trilu": _1TO1,  # keeps or zeroes each element by its position
    # ---- ONE_TO_ONE: every output element has exactly one source element ----
    "CenterCropPad": _1TO1,
    "Concat": _1TO1,
    "Pad": _1TO1,
    "Slice": _1TO1,
    "Split": _1TO1,
    "TensorScatter": _1TO1,  # each output is one cache or one update element
    # ---- ONE_TO_MANY: broadcast, gather, upsample ----
    "Expand": _1TOM,
    "Gather": _1TOM,
    "GatherElements": _1TOM,
    "GatherND": _1TOM,
    "GridSample": _1TOM,  # sampling by grid coordinates, like Resize
    "OneHot": _1TOM,  # each index feeds `depth` outputs
    "Resize": _1TOM,
    "Tile": _1TOM,
    "Upsample": _1TOM,  # deprecated, superseded by Resize
    # ---- MANY_TO_MANY: convolutions and contractions ----
    "AffineGrid": _MTOM,  # theta times the base grid
    "CausalConvWithState": _MTOM,
    "Col2Im": _MTOM,  # overlapping blocks are summed
    "Conv": _MTOM,
    "ConvInteger": _MTOM,
    "ConvTranspose": _MTOM,
    "DeformConv": _MTOM,
    "Einsum": _MTOM,
    "Gemm": _MTOM,
    "MatMul": _MTOM,
    "MatMulInteger": _MTOM,
    "QLinearConv": _MTOM,
    "QLinearMatMul": _MTOM,
    # ---- MANY_TO_MANY: pooling ----
    "AveragePool": _MTOM,
    "GlobalAveragePool": _MTOM,
    "GlobalLpPool": _MTOM,
    "GlobalMaxPool": _MTOM,
    "LpPool": _MTOM,
    "MaxPool": _MTOM,
    "MaxRoiPool": _MTOM,
    "RoiAlign": _MTOM,
    # ---- MANY_TO_MANY: reductions, scans, selections ----
    "ArgMax": _MTOM,
    "ArgMin": _MTOM,
    "CumProd": _MTOM,
    "CumSum": _MTOM,
    "Det": _MTOM,
    "ReduceL1": _MTOM,
    "ReduceL2": _MTOM,
    "ReduceLogSum": _MTOM,
    "ReduceLogSumExp": _MTOM,
    "ReduceMax": _MTOM,
    "ReduceMean": _MTOM,
    "ReduceMin": _MTOM,
    "ReduceProd": _MTOM,
    "ReduceSum": _MTOM,
    "ReduceSumSquare": _MTOM,
    "TopK": _MTOM,
    # ---- MANY_TO_MANY: softmax family and losses ----
    "Hardmax": _MTOM,
    "LogSoftmax": _MTOM,
    "NegativeLogLikelihoodLoss": _MTOM,
    "Softmax": _MTOM,
    "SoftmaxCrossEntropyLoss": _MTOM,
    # ---- MANY_TO_MANY: normalizations over statistics of several elements ----
    "DynamicQuantizeLinear": _MTOM,  # scale and zero point from the whole tensor's range
    "GroupNormalization": _MTOM,
    "InstanceNormalization": _MTOM,
    "LayerNormalization": _MTOM,
    "LpNormalization": _MTOM,
    "LRN": _MTOM,
    "MeanVarianceNormalization": _MTOM,
    "RMSNormalization": _MTOM,
    # ---- MANY_TO_MANY: recurrences, attention, spectral transforms ----
    "Attention": _MTOM,
    "DFT": _MTOM,
    "GRU": _MTOM,
    "LinearAttention": _MTOM,
    "LSTM": _MTOM,
    "RNN": _MTOM,
    "RotaryEmbedding": _MTOM,  # each output mixes an element with its rotation partner
    "STFT": _MTOM,
    "TfIdfVectorizer": _MTOM,  # n-gram counts over each whole input row
    # ---- MANY_TO_MANY: scatters (targets are data; a reduction may merge updates) ----
    "MaxUnpool": _MTOM,  # overlapping windows may send several inputs to one output
    "Scatter": _MTOM,  # deprecated, superseded by ScatterElements
    "ScatterElements": _MTOM,
    "ScatterND": _MTOM,
    # ---- REORGANIZE: index remap keeping row-major order ----
    "Flatten": _REORG,
    "Identity": _REORG,
    "Reshape": _REORG,
    "Squeeze": _REORG,
    "Unsqueeze": _REORG,
    # ---- SHUFFLE: permutations that break element order ----
    "DepthToSpace": _SHUF,
    "ReverseSequence": _SHUF,  # per-batch reversal of the first seq_len elements
    "SpaceToDepth": _SHUF,
    "Transpose": _SHUF,
    # ---- Opaque: control flow ----
    "If": _CONTROL_FLOW,
    "Loop": _CONTROL_FLOW,
    "Scan": _CONTROL_FLOW,
    "SequenceMap": _CONTROL_FLOW,
    # ---- Opaque: sequence and optional types ----
    "ConcatFromSequence": _SEQUENCE,
    "SequenceAt": _SEQUENCE,
    "SequenceConstruct": _SEQUENCE,
    "SequenceEmpty": _SEQUENCE,
    "SequenceErase": _SEQUENCE,
    "SequenceInsert": _SEQUENCE,
    "SequenceLength": _SEQUENCE,
    "SplitToSequence": _SEQUENCE,
    "Optional": _OPTIONAL,
    "OptionalGetElement": _OPTIONAL,
    "OptionalHasElement": _OPTIONAL,
    # ---- Opaque: strings ----
    "RegexFullMatch": _STRING,
    "StringConcat": _STRING,
    "StringNormalizer": _STRING,
    "StringSplit": _STRING,
    # ---- Opaque: random ----
    "Bernoulli": _RANDOM,
    "Multinomial": _RANDOM,
    "RandomNormal": _RANDOM,
    "RandomNormalLike": _RANDOM,
    "RandomUniform": _RANDOM,
    "RandomUniformLike": _RANDOM,
    # ---- Opaque: data-dependent output shapes ----
    "Compress": _DATA_SHAPE,
    "ImageDecoder": Opaque("data-dependent output shape: decoded from encoded image bytes"),
    "NonMaxSuppression": _DATA_SHAPE,
    "BlackmanWindow": _VALUE_SHAPE,
    "HammingWindow": _VALUE_SHAPE,
    "HannWindow": _VALUE_SHAPE,
    "MelWeightMatrix": _VALUE_SHAPE,
    "Range": _VALUE_SHAPE,
    "NonZero": _DATA_SHAPE,
    "Unique": _DATA_SHAPE,
    # ---- Opaque: constants, fills and shape/metadata producers ----
    "Constant": Opaque("constant: no input elements to map from"),
    "ConstantOfShape": Opaque("fill: input is a shape, output reads an attribute value"),
    "EyeLike": _METADATA,
    "Shape": _METADATA,
    "Size": _METADATA,
}


def onnx_mapping_type(op_type: str) -> MappingType | Opaque:
    """Return the mapping type (or opaque reason) of the ONNX standard-domain ``op_type``.

    Raises ``KeyError`` when ``op_type`` is not an operator of the ONNX standard domain.
    """
    try:
        return ONNX_MAPPING[op_type]
    except KeyError:
        raise KeyError(
            f"{op_type!r} is not an operator of the ONNX standard domain (ai.onnx); "
            "it has no mapping type"
        ) from None


def standard_onnx_ops() -> list[str]:
    """Sorted names of the ONNX standard-domain operators at onnx's default opset.

    An operator counts when some version of it was introduced at or before
    ``onnx.defs.onnx_opset_version()``; deprecated operators that onnx still lists
    (``Scatter``, ``Upsample``) are included.
    """
    opset = onnx.defs.onnx_opset_version()
    return sorted(
        {
            schema.name
            for schema in onnx.defs.get_all_schemas_with_history()
            if schema.domain == "" and schema.since_version <= opset
        }
    )
