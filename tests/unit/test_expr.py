"""Expression traversal: ``transform`` rebuilds a tree bottom-up, transforming shared subtrees
once."""
import sympy

from kernelgen.dtypes import DType
from kernelgen.ir.expr import Call, Const, Expr, Load, transform, walk

F32 = DType.float32


def _call_of_loads(n: int) -> Expr:
    """One call of ``n`` loads: nothing is built between visiting one load and the next."""
    return Call(F32, "sum", tuple(Load(F32, "x", sympy.Integer(k)) for k in range(n)))


def test_transform_recursing_into_nodes_it_builds() -> None:
    """Regression: the memo was keyed by ``id`` alone. ``fn`` recursing into a node it had just
    built, then dropped, let the next node built reuse that id and get the first one's result
    (``staging.unstage`` does this; it made the interpreter fail now and then)."""
    def fn(node: Expr, recurse) -> Expr | None:
        if isinstance(node, Load):  # a temporary node, dropped once transformed
            return recurse(Call(F32, "neg", (Const(F32, int(node.offset)),)))
        if isinstance(node, Call) and node.fn == "neg":
            return Const(F32, -node.args[0].value)  # type: ignore[attr-defined]
        return None

    out = transform(_call_of_loads(40), fn)
    consts = [n.value for n in walk(out) if isinstance(n, Const)]
    assert consts == [-k for k in range(40)]


def test_transform_visits_a_shared_subtree_once() -> None:
    shared = Call(F32, "exp", (Load(F32, "x", sympy.Integer(0)),))
    root = Call(F32, "add", (shared, Call(F32, "mul", (shared, shared))))
    seen: list[Expr] = []

    def fn(node: Expr, recurse) -> Expr | None:
        seen.append(node)
        return None

    assert transform(root, fn) is root  # nothing replaced: the very same tree
    assert seen.count(shared) == 1


def _doubling(depth: int, leaf: float) -> Expr:
    """x_{k+1} = x_k + x_k, ``depth`` times: ``depth + 1`` nodes, 2^depth paths to the leaf."""
    node: Expr = Const(F32, leaf)
    for _ in range(depth):
        node = Call(F32, "add", (node, node))
    return node


def test_equal_dags_built_apart_compare_each_pair_once() -> None:
    """Regression: two equal copies of a block whose math expansions share nodes (the fuzzer's
    long run built one) were compared path by path, 2^depth steps; hashing was already once per
    node. Each pair of nodes is now compared once, so this returns at once (it never would)."""
    a, b = _doubling(60, 1.0), _doubling(60, 1.0)
    assert a is not b and a == b and hash(a) == hash(b)
    assert a != _doubling(60, 2.0)  # a different leaf: unequal, the hashes already say so
    # unequal with equal hashes is decided by the fields: two Consts whose hashes collide
    assert Const(F32, -1) != Const(F32, -2) and hash(Const(F32, -1)) == hash(Const(F32, -2))
