"""Data-dependent indices (Gather's): wrapped once and clamped into the axis in the IR itself, so
no backend reads outside a buffer whatever index the caller passes, and recognised again by the
interpreter and the host-side check (``exec/bounds.py``), which report an index outside
[-n, n-1] instead of reading a clamped one.
"""
from __future__ import annotations

from .expr import Call, Const, Expr, Select, call, const, select


def clamp_index(raw: Expr, n: int) -> Expr:
    """``raw`` (an integer index into an axis of size ``n``, negative counting from the end)
    as a position in [0, n-1]: wrapped once, then clamped (two integer min/max: cheap)."""
    wrapped = select(call("lt", raw, const(0, raw.dtype)), call("add", raw, const(n, raw.dtype)),
                     raw)
    return call("min", call("max", wrapped, const(0, raw.dtype)), const(n - 1, raw.dtype))


def raw_index(value: Expr, n: int) -> Expr | None:
    """The caller's index inside ``value`` when ``clamp_index(raw, n)`` built it, else None."""
    if not (isinstance(value, Call) and value.fn == "min" and _is_const(value.args[1], n - 1)):
        return None
    inner = value.args[0]
    if not (isinstance(inner, Call) and inner.fn == "max" and _is_const(inner.args[1], 0)):
        return None
    wrapped = inner.args[0]
    if isinstance(wrapped, Select) and isinstance(wrapped.cond, Call) and \
            wrapped.cond.fn == "lt" and wrapped.cond.args[0] == wrapped.if_false:
        return wrapped.if_false
    return None


def _is_const(node: Expr, value: int) -> bool:
    return isinstance(node, Const) and node.value == value
