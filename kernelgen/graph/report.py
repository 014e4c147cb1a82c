"""The fusion report: what each planner fused, what it left apart and why, and DNNFusion's
Table 5 counts beside onnxruntime's own optimised graph.

    report = fusion_report(graph, model="model.onnx")   # every planner in PLANNERS
    print(report)                                       # counts, then blocks and edges
    json.dumps(report.to_dict())

Per planner: each block's operators with their mapping types and the block's fused type (the
table's verdict along its edges, as the executor fuses it); each edge between two blocks with
the bytes it materialises and the rule that stopped it (``Block.stops``, recorded by the
planner when it refused the edge); and the counts of DNNFusion's Table 5: kernels (one per
block), compute-intensive ones (holding a contraction: Conv, MatMul, Gemm) and memory-intensive
ones (the rest), and the bytes of intermediate results (values one block writes and another
reads, graph outputs not counted). The unfused graph's layer counts head the report, and, for an
ONNX model, the node count of the graph onnxruntime optimises it into (all optimisations, CPU,
written with ``SessionOptions.optimized_model_filepath``).
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import onnx

from ..backends import Backend
from ..ir.node import Op
from ..mapping_types import Colour
from .blocks import Block, block_outputs, fusible
from .model import Graph
from .onnx_import import ModelLike, load_model
from .planners import PLANNERS, planner

# DNNFusion's compute-intensive layers (CIL); every other operator is memory-intensive (MIL)
COMPUTE_INTENSIVE = frozenset({"Conv", "MatMul", "Gemm"})
_NO_RULE = "no rule recorded (the planner does not say why)"


@dataclass(frozen=True)
class OpEntry:
    """An operator of a block: its name, ONNX kind and mapping type."""

    name: str
    kind: str
    mapping_type: str


@dataclass(frozen=True)
class BlockEntry:
    """One block, one kernel: its operators, fused type, the values it writes, and the red
    edges it fuses anyway (a planner such as ``tvm`` that ignores the table's colours)."""

    index: int
    ops: tuple[OpEntry, ...]
    fused_type: str
    compute_intensive: bool
    writes: tuple[str, ...]
    forced: tuple[str, ...]


@dataclass(frozen=True)
class EdgeEntry:
    """A producer -> consumer edge between two blocks: the bytes its value takes in memory and
    the rule that kept the two apart."""

    producer: str
    consumer: str
    bytes: int
    rule: str


@dataclass(frozen=True)
class Counts:
    """DNNFusion's Table 5 columns for one plan (or for the unfused graph's layers)."""

    kernels: int
    compute_intensive: int
    memory_intensive: int
    intermediate_bytes: int
    intermediates: int


@dataclass(frozen=True)
class PlannerReport:
    """One planner's blocks, unfused edges and counts."""

    planner: str
    counts: Counts
    blocks: tuple[BlockEntry, ...]
    unfused: tuple[EdgeEntry, ...]


@dataclass(frozen=True)
class FusionReport:
    """The report of one graph under several planners (``fusion_report`` builds it)."""

    model: str
    layers: Counts  # the graph as imported, one layer per operator
    onnx_nodes: int | None  # nodes of the ONNX model, when the graph came from one
    onnxruntime_nodes: int | None  # nodes of onnxruntime's optimised graph
    planners: tuple[PlannerReport, ...]

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-serialisable data."""
        return asdict(self)

    def __getitem__(self, name: str) -> PlannerReport:
        for p in self.planners:
            if p.planner == name:
                return p
        raise KeyError(f"the report has no planner '{name}'; it has "
                       f"{[p.planner for p in self.planners]}")

    def format(self, details: Sequence[str] | None = None) -> str:
        """The counts table, then the blocks and unfused edges of the planners ``details``
        names (all of them for None)."""
        c = self.layers
        lines = [f"model '{self.model}': {c.kernels} operators ({c.compute_intensive} "
                 f"compute-intensive, {c.memory_intensive} memory-intensive), "
                 f"{c.intermediate_bytes:,} bytes in {c.intermediates} intermediate results "
                 "when unfused"]
        if self.onnxruntime_nodes is not None:
            lines.append(f"onnxruntime's optimised graph: {self.onnxruntime_nodes} nodes (the "
                         f"ONNX model has {self.onnx_nodes})")
        header = ("planner", "kernels", "compute", "memory", "intermediate bytes", "unfused edges")
        rows = [header] + [(p.planner, str(p.counts.kernels), str(p.counts.compute_intensive),
                            str(p.counts.memory_intensive), f"{p.counts.intermediate_bytes:,}",
                            str(len(p.unfused))) for p in self.planners]
        widths = [max(len(r[k]) for r in rows) for k in range(len(header))]
        lines.append("")
        lines += ["  " + "  ".join(cell.ljust(w) if k == 0 else cell.rjust(w)
                                   for k, (cell, w) in enumerate(zip(r, widths)))
                  for r in rows]
        for p in self.planners:
            if details is None or p.planner in details:
                lines += ["", *_planner_lines(p)]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def _planner_lines(p: PlannerReport) -> list[str]:
    lines = [f"planner '{p.planner}': {p.counts.kernels} block(s)"]
    for b in p.blocks:
        heavy = "compute" if b.compute_intensive else "memory"
        lines.append(f"  block {b.index}: {b.fused_type} ({heavy}-intensive), writes "
                     f"{', '.join(b.writes)}")
        lines += [f"    {op.name}  {op.kind}  {op.mapping_type}" for op in b.ops]
        lines += [f"    red edge fused by force: {e}" for e in b.forced]
    if p.unfused:
        lines.append(f"  edges not fused ({len(p.unfused)}):")
        lines += [f"    {e.producer} -> {e.consumer} ({e.bytes:,} bytes): {e.rule}"
                  for e in p.unfused]
    return lines


def fusion_report(graph: Graph, planners: Sequence[str] = tuple(PLANNERS),
                  model: ModelLike | None = None,
                  planned: Mapping[str, Sequence[Block]] | None = None,
                  backend: str | Backend | None = None) -> FusionReport:
    """The fusion report of ``graph`` under each of ``planners`` (names in ``PLANNERS``).
    ``planned`` gives blocks already planned, by planner name (a session's own), which are
    used instead of planning again; ``model`` is the ONNX model the graph came from, for
    onnxruntime's node count (left out: no count); ``backend``: yellow cells as the verdicts
    stored for it decide (``planner``; left out: unfused)."""
    planned = dict(planned or {})
    reports = tuple(_plan_report(graph, name,
                                 planned.get(name) or planner(name, backend)(graph))
                    for name in dict.fromkeys([*planners, *planned]))
    onnx_nodes = ort_nodes = None
    if model is not None:
        proto = load_model(model)
        onnx_nodes = len(proto.graph.node)
        ort_nodes = onnxruntime_node_count(proto)
    ops = graph.ops
    heavy = sum(op.kind in COMPUTE_INTENSIVE for op in ops)
    inner = [op for op in ops if not graph.is_output(op)]
    layers = Counts(len(ops), heavy, len(ops) - heavy, sum(_nbytes(op) for op in inner),
                    len(inner))
    return FusionReport(graph.name, layers, onnx_nodes, ort_nodes, reports)


def onnxruntime_node_count(model: ModelLike) -> int | None:
    """Nodes in the graph onnxruntime optimises ``model`` into (CPU, all optimisations), or
    None when onnxruntime is not installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    proto = load_model(model)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    with tempfile.TemporaryDirectory() as tmp:
        options.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
        ort.InferenceSession(proto.SerializeToString(), options,
                             providers=["CPUExecutionProvider"])
        optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    return len(optimized.graph.node)


def _plan_report(graph: Graph, name: str, blocks: Sequence[Block]) -> PlannerReport:
    owner = {id(op): k for k, block in enumerate(blocks) for op in block.ops}
    rules = {(s.producer, s.consumer): s.rule for block in blocks for s in block.stops}
    entries = []
    written: list[Op] = []
    for k, block in enumerate(blocks):
        outs = block_outputs(graph, block.ops)
        written += [op for op in outs if not graph.is_output(op)]
        fused = fusible(graph, block.ops, force=True)
        entries.append(BlockEntry(
            k, tuple(OpEntry(op.name, op.kind, op.mapping_type.value) for op in block.ops),
            fused.mapping_type.value, any(op.kind in COMPUTE_INTENSIVE for op in block.ops),
            tuple(op.name for op in outs),
            tuple(str(e) for e in fused.edges if e.rule.colour is Colour.RED)))
    unfused = tuple(EdgeEntry(op.name, c.name, _nbytes(op), rules.get((op.name, c.name), _NO_RULE))
                    for op in graph.ops for c in graph.consumers(op)
                    if owner[id(op)] != owner[id(c)])
    heavy = sum(b.compute_intensive for b in entries)
    counts = Counts(len(blocks), heavy, len(blocks) - heavy, sum(_nbytes(op) for op in written),
                    len(written))
    return PlannerReport(name, counts, tuple(entries), unfused)


def _nbytes(op: Op) -> int:
    return op.numel * op.dtype.itemsize
