"""Model scale, above the compile driver.

- ``model``: ``Graph``, a model as kernelgen operators from any frontend;
- ``onnx_import``: ``import_onnx``, ONNX models as graphs (``onnx_check``, ``onnx_nodes``,
  ``onnx_fold`` do the checking, the per-node building and the constant folding);
- ``ecg``: DNNFusion's extended computation graph;
- ``blocks``: ``Block`` and the planner contract (``check_plan``, the unfused ``plan_none``);
- ``planners``: the planners by name (``PLANNERS``): ``none``, ``tvm`` (``tvm_fusion``),
  ``dnnfusion`` (``dnnfusion``);
- ``executor``: ``compile_plan``, a planned graph compiled once and run many times, its blocks
  compiled by structure (``block_kernels``), its plan plain data (``plan``) and its
  intermediates sharing memory by liveness (``memory``);
- ``profile``: where a compiled model's time goes, each launch timed on its own;
- ``session``: ``compile_model`` and the onnxruntime-like ``Session``;
- ``saved``: ``Session.save`` and ``load_model``, a compiled model saved and loaded back
  without compiling again;
- ``report``: ``fusion_report``, per planner its blocks, unfused edges and the rules that
  stopped them, DNNFusion's Table 5 counts and onnxruntime's optimised node count;
- ``simplify``: math-property rewriting to a fixpoint (DNNFusion Table 4, identities,
  constant folding, BatchNormalization folding), each rewrite kept only if FLOPs do not grow,
  then sibling projections of one input merged into one MatMul (``projections``);
- ``reference``: ``interpret_graph``, a graph on the IR interpreter (the reference semantics);
- ``rewrite`` (Conv-BN folding, kernel enlarging) and ``chain`` (the CLI's chain splitter).

The kernel layer below never imports this package. Nor does this package import onnx until
an ONNX name (``import_onnx``, ``fusion_report``, ``FusionReport``) or ``compile_model`` on an
ONNX model asks for it: a saved model loads and runs without it (``load_model``), and a
``Graph`` from another frontend compiles without it.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .ecg import ECG, ECGNode
from .executor import CompiledModel, compile_plan
from .model import Graph
from .plan import BufferSpec, KernelSpec, Launch, Plan
from .blocks import Block, Planner, Stop, check_plan, order_blocks, plan_none
from .dnnfusion import plan_dnnfusion
from .planners import PLANNERS, planner
from .profile import LaunchTime, Profile, profile
from .tvm_fusion import plan_tvm
from .reference import interpret_graph
from .simplify import Simplified, simplify
from .session import Session, TensorInfo, compile_model, load_model

if TYPE_CHECKING:
    from .onnx_import import import_onnx
    from .report import FusionReport, fusion_report

_ONNX_NAMES = {"import_onnx": ".onnx_import", "fusion_report": ".report",
               "FusionReport": ".report"}


def __getattr__(name: str) -> Any:
    if name in _ONNX_NAMES:
        return getattr(importlib.import_module(_ONNX_NAMES[name], __name__), name)
    raise AttributeError(f"module 'kernelgen.graph' has no attribute '{name}'")


__all__ = ["ECG", "PLANNERS", "Block", "BufferSpec", "CompiledModel", "ECGNode", "FusionReport",
           "Graph", "KernelSpec", "Launch", "LaunchTime", "Plan", "Planner", "Profile", "Session",
           "Simplified", "Stop", "TensorInfo", "check_plan", "compile_model", "compile_plan",
           "fusion_report", "import_onnx", "interpret_graph", "load_model", "order_blocks",
           "plan_dnnfusion", "plan_none", "plan_tvm", "planner", "profile", "simplify"]
