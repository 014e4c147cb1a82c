"""The models the model tests run, and onnxruntime as their reference.

- ``light(name)``: the real architectures onnx ships under ``onnx/backend/test/data/light``
  (opset 9). Their weights are ConstantOfShape fills and their shipped outputs uniform, so
  every fill is replaced by a seeded random initializer of its shape, scaled by the role its
  consumer gives it (He-normal conv and Gemm weights, BatchNormalization scales and variances
  in [0.5, 1.5], small biases and means), which keeps activations finite and of order one
  through 121 layers. The input of the final Softmax is added as an output: the logits are the
  strong check (a saturated or uniform softmax hides errors).
- ``bert_layer()``: a BERT-style encoder layer (opset 17): attention with a padding mask,
  shapes computed at run time the way exporters write them (Shape -> Gather -> Unsqueeze ->
  Concat -> Reshape), LayerNormalization, an Erf GELU feed-forward.
- ``mobilenet_v2()``: a MobileNetV2 stack (opset 17): a stem, inverted residual blocks
  (1x1 expand, 3x3 depthwise, 1x1 project, BatchNormalization, Clip(0, 6) with bounds as
  inputs, residual adds), global pooling and a classifier.
- ``inception()``: two Inception modules (opset 17): four branches each (a 1x1 conv; 1x1
  then 3x3; 1x1 then 5x5; 3x3 max pooling then 1x1), concatenated; the parallel branches and
  sibling 1x1 convs of Inception v1 in 12 convolutions instead of 57.
"""
from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LIGHT = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light")
LIGHT_MODELS = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
                "shufflenet", "squeezenet", "vgg19", "zfnet512")


def _consumer(graph: onnx.GraphProto, name: str) -> tuple[str, int, onnx.NodeProto | None]:
    """(op type, input index) of the first real use of ``name``, looking through Unsqueeze and
    Reshape."""
    for node in graph.node:
        if name in node.input:
            if node.op_type in ("Unsqueeze", "Reshape") and node.input[0] == name:
                return _consumer(graph, node.output[0])
            return node.op_type, list(node.input).index(name), node
    return "", -1, None


def _random_weight(rng: np.random.Generator, shape: tuple[int, ...], use: str, index: int,
                   node: onnx.NodeProto | None) -> np.ndarray:
    if use == "Conv" and index == 1:
        return rng.standard_normal(shape) * math.sqrt(2.0 / int(np.prod(shape[1:])))
    if use == "Gemm" and index == 1:
        trans = any(a.name == "transB" and a.i for a in node.attribute) if node else False
        return rng.standard_normal(shape) * math.sqrt(2.0 / shape[1 if trans else 0])
    if (use == "BatchNormalization" and index in (1, 4)) or use == "Mul":
        return rng.uniform(0.5, 1.5, shape)
    return rng.standard_normal(shape) * 0.1  # biases, means, additive terms


def light(name: str, seed: int = 0) -> onnx.ModelProto:
    """The light model ``name`` with random weights and its logits as a second output."""
    model = onnx.load(os.path.join(LIGHT, f"light_{name}.onnx"))
    graph, rng = model.graph, np.random.default_rng(seed)
    shapes = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    nodes, weights = [], []
    for node in graph.node:
        if node.op_type != "ConstantOfShape":
            nodes.append(node)
            continue
        shape = tuple(int(d) for d in shapes[node.input[0]])
        use, index, consumer = _consumer(graph, node.output[0])
        value = _random_weight(rng, shape, use, index, consumer)
        weights.append(numpy_helper.from_array(value.astype(np.float32), node.output[0]))
    del graph.node[:]
    graph.node.extend(nodes)
    used = {i for n in nodes for i in n.input}
    kept = [i for i in graph.initializer if i.name in used] + weights
    inputs = [i for i in graph.input if i.name in used]
    if model.ir_version < 4:  # IR 3: every initializer is also a graph input
        inputs += [helper.make_tensor_value_info(w.name, TensorProto.FLOAT, list(w.dims))
                   for w in weights]
    del graph.initializer[:], graph.input[:]
    graph.initializer.extend(kept)
    graph.input.extend(inputs)
    softmax = [n for n in nodes if n.op_type == "Softmax"]
    if softmax:
        inferred = onnx.shape_inference.infer_shapes(model).graph.value_info
        graph.output.append(next(v for v in inferred if v.name == softmax[-1].input[0]))
    return model


def _init(name: str, value: Any, dtype: Any = np.float32) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def bert_layer(batch: int = 2, seq: int = 13, hidden: int = 64, heads: int = 4,
               seed: int = 1) -> onnx.ModelProto:
    """One post-LN BERT encoder layer; inputs ``x`` (batch, seq, hidden) and ``mask``
    (batch, seq) int64 (1: attend, 0: padding)."""
    rng = np.random.default_rng(seed)
    dh, ffn = hidden // heads, 4 * hidden
    inits, nodes = [], []

    def weight(name: str, shape: tuple[int, ...], scale: float) -> str:
        inits.append(_init(name, rng.standard_normal(shape) * scale))
        return name

    def gamma(name: str) -> str:
        inits.append(_init(name, 1 + rng.standard_normal(hidden) * 0.1))
        return name

    def node(op: str, ins: list[str], out: str, **attrs: Any) -> str:
        nodes.append(helper.make_node(op, ins, [out], name=f"n_{out}", **attrs))
        return out

    inits += [_init("axes0", [0], np.int64), _init("axes1", [1], np.int64),
              _init("axes2", [2], np.int64), _init("axes12", [1, 2], np.int64),
              _init("heads_dh", [heads, dh], np.int64), _init("minus1", [-1], np.int64),
              _init("one", 1.0), _init("big_negative", -10000.0),
              _init("sqrt_dh", math.sqrt(dh)), _init("sqrt2", math.sqrt(2.0)),
              _init("half", 0.5)]
    # the batch and sequence sizes, read from x at run time as exporters do
    shape = node("Shape", ["x"], "x_shape")
    b = node("Unsqueeze", [node("Gather", [shape, "zero_idx"], "b_scalar", axis=0), "axes0"], "b")
    s = node("Unsqueeze", [node("Gather", [shape, "one_idx"], "s_scalar", axis=0), "axes0"], "s")
    inits += [_init("zero_idx", 0, np.int64), _init("one_idx", 1, np.int64)]
    split_shape = node("Concat", [b, s, "heads_dh"], "split_shape", axis=0)
    merged_shape = node("Concat", [b, s, "minus1"], "merged_shape", axis=0)

    def heads_of(name: str, perm: list[int]) -> str:
        w = weight(f"W{name}", (hidden, hidden), 1 / math.sqrt(hidden))
        bias = weight(f"b{name}", (hidden,), 0.1)
        proj = node("Add", [node("MatMul", ["x", w], f"{name}_mm"), bias], f"{name}_proj")
        split = node("Reshape", [proj, split_shape], f"{name}_split")
        return node("Transpose", [split], f"{name}_heads", perm=perm)

    q, k, v = heads_of("q", [0, 2, 1, 3]), heads_of("k", [0, 2, 3, 1]), heads_of("v", [0, 2, 1, 3])
    scores = node("Div", [node("MatMul", [q, k], "qk"), "sqrt_dh"], "scores")
    mask = node("Cast", [node("Unsqueeze", ["mask", "axes12"], "mask4")], "maskf",
                to=TensorProto.FLOAT)
    penalty = node("Mul", [node("Sub", ["one", mask], "inverted"), "big_negative"], "penalty")
    probs = node("Softmax", [node("Add", [scores, penalty], "masked")], "probs", axis=-1)
    context = node("Transpose", [node("MatMul", [probs, v], "ctx_heads")], "ctx_t",
                   perm=[0, 2, 1, 3])
    merged = node("Reshape", [context, merged_shape], "ctx")
    wo, bo = weight("Wo", (hidden, hidden), 1 / math.sqrt(hidden)), weight("bo", (hidden,), 0.1)
    attn = node("Add", [node("MatMul", [merged, wo], "o_mm"), bo], "attn")
    g1, be1 = gamma("ln1_g"), weight("ln1_b", (hidden,), 0.1)
    h1 = node("LayerNormalization", [node("Add", ["x", attn], "res1"), g1, be1], "h1",
              axis=-1, epsilon=1e-5)
    w1, b1 = weight("W1", (hidden, ffn), 1 / math.sqrt(hidden)), weight("b1", (ffn,), 0.1)
    up = node("Add", [node("MatMul", [h1, w1], "up_mm"), b1], "up")
    erf = node("Erf", [node("Div", [up, "sqrt2"], "up_scaled")], "up_erf")
    gelu = node("Mul", [node("Mul", [up, node("Add", [erf, "one"], "erf1")], "gelu_x"),
                        "half"], "gelu")
    w2, b2 = weight("W2", (ffn, hidden), 1 / math.sqrt(ffn)), weight("b2", (hidden,), 0.1)
    down = node("Add", [node("MatMul", [gelu, w2], "down_mm"), b2], "down")
    g2, be2 = gamma("ln2_g"), weight("ln2_b", (hidden,), 0.1)
    node("LayerNormalization", [node("Add", [h1, down], "res2"), g2, be2], "y", axis=-1,
         epsilon=1e-5)
    graph = helper.make_graph(
        nodes, "bert_layer",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", hidden]),
         helper.make_tensor_value_info("mask", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", hidden]),
         helper.make_tensor_value_info("probs", TensorProto.FLOAT,
                                       ["batch", heads, "seq", "seq"])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mobilenet_v2(channels: int = 3, size: int = 32, classes: int = 10,
                 seed: int = 2) -> onnx.ModelProto:
    """A MobileNetV2 stem and four inverted residual blocks (expansion 6), then pooling and a
    classifier; input ``image`` (1, channels, size, size)."""
    rng = np.random.default_rng(seed)
    inits = [_init("relu6_min", 0.0), _init("relu6_max", 6.0)]
    nodes: list[onnx.NodeProto] = []
    count = iter(range(1000))

    def conv_bn(x: str, cin: int, cout: int, kernel: int, stride: int, group: int,
                relu6: bool) -> str:
        k = next(count)
        w = f"w{k}"
        inits.append(_init(w, rng.standard_normal((cout, cin // group, kernel, kernel))
                           * math.sqrt(2.0 / (cin // group * kernel * kernel))))
        params = [f"bn{k}_{p}" for p in ("scale", "bias", "mean", "var")]
        inits.extend([_init(params[0], rng.uniform(0.5, 1.5, cout)),
                      _init(params[1], rng.standard_normal(cout) * 0.1),
                      _init(params[2], rng.standard_normal(cout) * 0.1),
                      _init(params[3], rng.uniform(0.5, 1.5, cout))])
        pad = kernel // 2
        nodes.append(helper.make_node("Conv", [x, w], [f"conv{k}"], kernel_shape=[kernel] * 2,
                                      strides=[stride] * 2, pads=[pad] * 4, group=group))
        nodes.append(helper.make_node("BatchNormalization", [f"conv{k}", *params], [f"bn{k}"],
                                      epsilon=1e-5))
        if not relu6:
            return f"bn{k}"
        nodes.append(helper.make_node("Clip", [f"bn{k}", "relu6_min", "relu6_max"],
                                      [f"relu6_{k}"]))
        return f"relu6_{k}"

    def inverted(x: str, cin: int, cout: int, stride: int) -> str:
        hidden = cin * 6
        h = conv_bn(x, cin, hidden, 1, 1, 1, True)
        h = conv_bn(h, hidden, hidden, 3, stride, hidden, True)
        out = conv_bn(h, hidden, cout, 1, 1, 1, False)
        if stride == 1 and cin == cout:
            nodes.append(helper.make_node("Add", [x, out], [f"{out}_res"]))
            return f"{out}_res"
        return out

    x = conv_bn("image", channels, 16, 3, 2, 1, True)
    for cin, cout, stride in ((16, 24, 2), (24, 24, 1), (24, 32, 2), (32, 32, 1)):
        x = inverted(x, cin, cout, stride)
    return _classified("mobilenet_v2", nodes, inits, rng, x, 32, (channels, size), classes)


def _classified(name: str, nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto],
                rng: np.random.Generator, x: str, features: int, image: tuple[int, int],
                classes: int) -> onnx.ModelProto:
    """The image model (opset 17) of ``nodes`` from input ``image`` (1, channels, size, size)
    to ``x`` with ``features`` channels, then global pooling and a classifier to ``logits``."""
    inits += [_init("fc_w", rng.standard_normal((classes, features))
                    * math.sqrt(2 / features)),
              _init("fc_b", rng.standard_normal(classes) * 0.1)]
    nodes += [helper.make_node("GlobalAveragePool", [x], ["pooled"]),
              helper.make_node("Flatten", ["pooled"], ["flat"], axis=1),
              helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], transB=1)]
    channels, size = image
    graph = helper.make_graph(
        nodes, name,
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, channels, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, classes])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def inception(channels: int = 16, size: int = 8, classes: int = 10,
              seed: int = 3) -> onnx.ModelProto:
    """Two Inception modules (GoogLeNet's, convs with bias and ReLU), then pooling and a
    classifier; input ``image`` (1, channels, size, size)."""
    rng = np.random.default_rng(seed)
    inits: list[onnx.TensorProto] = []
    nodes: list[onnx.NodeProto] = []
    count = iter(range(1000))

    def conv_relu(x: str, cin: int, cout: int, kernel: int) -> str:
        k = next(count)
        inits.append(_init(f"w{k}", rng.standard_normal((cout, cin, kernel, kernel))
                           * math.sqrt(2.0 / (cin * kernel * kernel))))
        inits.append(_init(f"b{k}", rng.standard_normal(cout) * 0.1))
        nodes.append(helper.make_node("Conv", [x, f"w{k}", f"b{k}"], [f"conv{k}"],
                                      kernel_shape=[kernel] * 2, pads=[kernel // 2] * 4))
        nodes.append(helper.make_node("Relu", [f"conv{k}"], [f"relu{k}"]))
        return f"relu{k}"

    def module(x: str, cin: int, c1: int, r3: int, c3: int, r5: int, c5: int, cp: int) -> str:
        k = next(count)
        nodes.append(helper.make_node("MaxPool", [x], [f"pool{k}"], kernel_shape=[3, 3],
                                      pads=[1, 1, 1, 1]))
        branches = [conv_relu(x, cin, c1, 1), conv_relu(conv_relu(x, cin, r3, 1), r3, c3, 3),
                    conv_relu(conv_relu(x, cin, r5, 1), r5, c5, 5),
                    conv_relu(f"pool{k}", cin, cp, 1)]
        nodes.append(helper.make_node("Concat", branches, [f"concat{k}"], axis=1))
        return f"concat{k}"

    x = module("image", channels, 8, 8, 12, 4, 6, 6)
    x = module(x, 32, 12, 12, 16, 4, 8, 8)
    return _classified("inception", nodes, inits, rng, x, 44, (channels, size), classes)


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]
                        ) -> dict[str, np.ndarray]:
    """The model's outputs by name from onnxruntime with every graph optimisation on."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))
