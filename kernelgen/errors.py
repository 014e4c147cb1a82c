"""Typed errors. Each names the operator, the input and the axis at fault, and what was expected."""
from __future__ import annotations

from collections.abc import Sequence


class KernelgenError(Exception):
    """Base class of every error kernelgen raises on bad input."""


def _where(op: str, input: str | None = None, axis: int | None = None) -> str:
    parts = [f"{op}"]
    if input is not None:
        parts.append(f"input '{input}'")
    if axis is not None:
        parts.append(f"axis {axis}")
    return ", ".join(parts)


class ShapeError(KernelgenError, ValueError):
    """A tensor's shape does not fit what the operator needs."""

    def __init__(self, op: str, input: str | None, expected: str, got: Sequence[int] | str,
                 axis: int | None = None) -> None:
        self.op, self.input, self.axis, self.expected, self.got = op, input, axis, expected, got
        super().__init__(f"{_where(op, input, axis)}: expected {expected}, got {got}")


class BroadcastError(ShapeError):
    """Input shapes that NumPy/ONNX broadcasting cannot reconcile."""

    def __init__(self, op: str, shapes: dict[str, tuple[int, ...]], axis: int) -> None:
        listing = ", ".join(f"'{n}' {s}" for n, s in shapes.items())
        super().__init__(op, None, f"shapes that broadcast (equal or 1 on every axis aligned "
                         f"from the right; axis {axis} from the right differs)", listing)


class DtypeError(KernelgenError, TypeError):
    """An input's dtype is not one the operator accepts, or inputs disagree."""

    def __init__(self, op: str, input: str | None, expected: str, got: str) -> None:
        self.op, self.input, self.expected, self.got = op, input, expected, got
        super().__init__(f"{_where(op, input)}: expected dtype {expected}, got {got}")


class AxisError(KernelgenError, IndexError):
    """An axis attribute out of range for the tensor's rank."""

    def __init__(self, op: str, input: str | None, axis: int, rank: int) -> None:
        self.op, self.input, self.axis, self.rank = op, input, axis, rank
        super().__init__(f"{_where(op, input)}: axis {axis} is out of range for a tensor of rank "
                         f"{rank} (expected -{rank} <= axis < {rank})")


class AttributeError_(KernelgenError, ValueError):
    """An attribute value the operator cannot use (a permutation that is not one, a bad mode)."""

    def __init__(self, op: str, attribute: str, expected: str, got: object) -> None:
        self.op, self.attribute, self.expected, self.got = op, attribute, expected, got
        super().__init__(f"{op}: attribute '{attribute}' expected {expected}, got {got!r}")


class FusionError(KernelgenError, ValueError):
    """A fusion the table forbids (red), or a block that cannot form one kernel."""


class UnsupportedError(KernelgenError, NotImplementedError):
    """A backend lacks a capability the kernel needs (a dtype, a function)."""

    def __init__(self, backend: str, capability: str, needed_by: str) -> None:
        self.backend, self.capability, self.needed_by = backend, capability, needed_by
        super().__init__(f"backend '{backend}' lacks {capability}, needed by {needed_by}")


class ArgumentError(KernelgenError, ValueError):
    """Arrays passed to a kernel that do not match its parameters."""


class ModelError(KernelgenError, ValueError):
    """A model that cannot be imported or run as given: it fails the ONNX checker, a node reads
    a name nothing defines, the nodes form a cycle, an initializer has the wrong shape, or a
    node's operator refuses its inputs. ``node`` and ``op_type`` name the node at fault."""

    def __init__(self, message: str, node: str | None = None, op_type: str | None = None) -> None:
        self.node, self.op_type = node, op_type
        where = f"node '{node}' ({op_type}): " if node is not None else ""
        super().__init__(where + message)


class UnsupportedOpError(ModelError, NotImplementedError):
    """A node kernelgen has no operator for, or an attribute or input form it does not handle;
    the message names the node, its op type and what is missing."""


class ValueInputError(UnsupportedOpError):
    """An input kernelgen needs as a value at import (Reshape's shape, Slice's starts, reduction
    axes...) that is computed from the graph's inputs; ``tensor`` names it. A caller that knows
    the input values may fix them (the ONNX backend specialises on them at run time)."""

    def __init__(self, message: str, node: str | None = None, op_type: str | None = None,
                 tensor: str = "") -> None:
        super().__init__(message, node, op_type)
        self.tensor = tensor
