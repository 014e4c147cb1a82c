"""NEON C's tiled contraction with its epilogue as float32x4 vectors along a tile row
(``ContractionEmitter._vector_epilogue``, the default) against the same kernels with the
epilogue element by element (as before: ``mock.patch`` empties the vector hole), and
onnxruntime (all graph optimisations, 2 threads):

- ``gelu(x W + b)`` blocks at the BERT layer's and BERT-base's FFN shapes,
- the BERT-style encoder layer, the MobileNetV2 stack (112x112) and onnx's light ShuffleNet
  (random weights; its last stage over 7x7 maps, whose epilogues run along the merged pixels)
  under DNNFusion's plan.

Every variant is checked against onnxruntime, then timed round-robin in the same rounds,
onnxruntime last in each; medians in ms, and each variant's time over the default's as the
median of the rounds' ratios (``kept_runs.measure``). NEON C runs through SIMDe on x86.

    python bench/neon_epilogues.py [--rounds 7] [--repeat 30] [--json FILE]
"""
from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import ContextManager
from unittest import mock

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kept_runs import _session, measure  # noqa: E402
from models.model_zoo import light, mobilenet_v2  # noqa: E402
from vector_casts import bert_inputs, case_main  # noqa: E402

import kernelgen as kg  # noqa: E402
from kernelgen.backends.c.contraction import ContractionEmitter  # noqa: E402
from kernelgen.measure import runner  # noqa: E402

FFN = ((128, 256, 1024), (128, 768, 3072))  # the BERT layer of the model tests, BERT-base


@contextmanager
def scalar_epilogue() -> Iterator[None]:
    """The tiled epilogue element by element, as before the vector hole."""
    with mock.patch.object(ContractionEmitter, "_vector_epilogue", lambda *a: ""):
        yield


def _variants() -> tuple[tuple[str, ContextManager[None]], ...]:
    return (("default", ExitStack()), ("scalar epilogue", scalar_epilogue()))


def gelu_block(m: int, k: int, n: int) -> tuple[str, dict[str, Callable[[], object]]]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["a"]),
             helper.make_node("Gelu", ["a"], ["y"], domain="com.microsoft")]
    graph = helper.make_graph(
        nodes, "gelu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)],
                              ir_version=9)
    session = _session(model.SerializeToString())
    want = session.run(None, {"x": x})[0]
    runs: dict[str, Callable[[], object]] = {
        "onnxruntime": lambda: session.run(None, {"x": x})}
    for name, switch in _variants():
        mm = kg.matmul(kg.tensor("x", x.shape), kg.constant("w", w))
        a = kg.add(mm, kg.constant("b", b))
        with switch:
            program = kg.fuse(mm, a, kg.gelu(a)).emit("neon", tuning="none")
        np.testing.assert_allclose(program(x), want, rtol=1e-4, atol=1e-4, err_msg=name)
        runs[name] = runner(program, x)
    return f"gelu(x W + b), {m}x{k}x{n}", runs


def model(label: str, proto: object, feeds: dict[str, np.ndarray],
          shapes: dict[str, tuple[int, ...]] | None
          ) -> tuple[str, dict[str, Callable[[], object]]]:
    session = _session(proto.SerializeToString())  # type: ignore[attr-defined]
    want = session.run(None, feeds)
    runs: dict[str, Callable[[], object]] = {"onnxruntime": lambda: session.run(None, feeds)}
    for name, switch in _variants():
        with switch:
            compiled = kg.compile_model(proto, backend="neon", fusion="dnnfusion",
                                        input_shapes=shapes, warmup=True)
        for got, ref in zip(compiled.run(None, feeds), want):
            np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-3, err_msg=name)
        runs[name] = (lambda c=compiled: c.run(None, feeds))
    return label, runs


def cases() -> list[tuple[str, dict[str, Callable[[], object]]]]:
    proto, shapes, feeds = bert_inputs()
    image = {"image": np.random.default_rng(0).standard_normal((1, 3, 112, 112))
             .astype(np.float32)}
    return [gelu_block(*shape) for shape in FFN] + [
        model("BERT-style encoder layer (hidden 256, 4 heads, sequence 128)", proto, feeds,
              shapes),
        model("MobileNetV2 stack, 112x112", mobilenet_v2(size=112), image, None),
        model("ShuffleNet (onnx's light model)", light("shufflenet"),
              {"gpu_0/data_0": np.random.default_rng(0).standard_normal((1, 3, 224, 224))
               .astype(np.float32)}, None)]


def main() -> int:
    return case_main(__doc__, cases, measure)


if __name__ == "__main__":
    raise SystemExit(main())
