"""DNNFusion's extended computation graph (ECG): the graph annotated with what fusion planning
and math-property rewriting read, per operator:

- its mapping type (``op.mapping_type``, from its index maps) and each input's;
- its index maps, output index -> input index, as text;
- whether its output is removable: an intermediate (not a graph output) that disappears when
  the operator is fused with all its consumers;
- its algebraic properties (``op.properties``: associative, commutative, distributes over);
- FLOPs and bytes: the operator alone as a kernel, counted on the loop IR as kernel metadata
  counts them (reductions hoisted out of the element loop count once per row), bytes as each
  input read once and the output written once; ``output_bytes`` is DNNFusion's intermediate
  result size, which its planner seeds from.

    ecg = ECG(graph)
    print(ecg)                   # one row per operator
    ecg.to_dict()                # the same as JSON data
    ecg["conv1"].mapping_type    # by operator name
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from functools import cached_property
from typing import Any

from ..fusion import fuse
from ..ir.node import MathProperties, Op
from ..lower import lower
from ..mapping_types import MappingType
from .model import Graph


@dataclass(frozen=True)
class ECGNode:
    """One operator of the extended computation graph."""

    name: str
    kind: str
    shape: tuple[int, ...]
    inputs: tuple[str, ...]
    consumers: tuple[str, ...]
    mapping_type: MappingType
    input_types: tuple[MappingType, ...]
    index_maps: tuple[str, ...]
    removable: bool
    properties: MathProperties
    flops: int
    bytes: int
    output_bytes: int


class ECG:
    """The extended computation graph of ``graph``; nodes in topological order."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph

    @cached_property
    def nodes(self) -> tuple[ECGNode, ...]:
        return tuple(self._node(op) for op in self.graph.ops)

    def _node(self, op: Op) -> ECGNode:
        loop = lower(fuse(op))
        return ECGNode(
            name=op.name, kind=op.kind, shape=op.shape,
            inputs=tuple(v.name for v in op.inputs),
            consumers=tuple(c.name for c in self.graph.consumers(op)),
            mapping_type=op.mapping_type, input_types=op.input_mapping_types,
            index_maps=tuple(str(m) for m in op.index_maps),
            removable=not self.graph.is_output(op), properties=op.properties,
            flops=loop.flops(), bytes=loop.bytes_moved(),
            output_bytes=op.numel * op.dtype.itemsize)

    def __getitem__(self, name: str) -> ECGNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no operator named '{name}' in graph '{self.graph.name}'")

    def __iter__(self) -> Iterator[ECGNode]:
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.graph.ops)

    def totals(self) -> dict[str, int]:
        """FLOPs, bytes of every operator run alone, and bytes of removable outputs."""
        return {"flops": sum(n.flops for n in self.nodes),
                "bytes": sum(n.bytes for n in self.nodes),
                "removable_bytes": sum(n.output_bytes for n in self.nodes if n.removable)}

    def to_dict(self) -> dict[str, Any]:
        """The graph as JSON-serialisable data: one entry per operator, and the totals."""
        nodes = []
        for n in self.nodes:
            entry = asdict(n)
            entry["shape"] = list(n.shape)
            entry["mapping_type"] = n.mapping_type.value
            entry["input_types"] = [t.value for t in n.input_types]
            entry["properties"]["distributes_over"] = list(n.properties.distributes_over)
            nodes.append(entry)
        return {"graph": self.graph.name, "nodes": nodes, "totals": self.totals()}

    def __str__(self) -> str:
        header = ("name", "kind", "shape", "mapping type", "removable", "properties", "FLOPs",
                  "bytes", "index maps")
        rows = [header]
        for n in self.nodes:
            props = ",".join(p for p, on in (("assoc", n.properties.associative),
                                              ("comm", n.properties.commutative)) if on)
            if n.properties.distributes_over:
                props += ("," if props else "") + "dist:" + "/".join(n.properties.distributes_over)
            maps = "; ".join(f"{src} {m}" for src, m in zip(n.inputs, n.index_maps))
            rows.append((n.name, n.kind, "x".join(map(str, n.shape)) or "scalar",
                         n.mapping_type.value, "yes" if n.removable else "no", props or "-",
                         f"{n.flops:,}", f"{n.bytes:,}", maps))
        widths = [max(len(r[c]) for r in rows) for c in range(len(header) - 1)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)) + "  " + r[-1]
                 for r in rows]
        t = self.totals()
        lines.append(f"{len(self)} operators, {t['flops']:,} FLOPs, {t['bytes']:,} bytes run "
                     f"one by one, {t['removable_bytes']:,} bytes of removable intermediates")
        return "\n".join(lines)
