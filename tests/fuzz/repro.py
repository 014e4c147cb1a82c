"""A failing case as a self-contained Python snippet: the kernelgen code, the input arrays and
the run, with the wrong values quoted as comments."""
from __future__ import annotations

import numpy as np
from judge import Case

_RUN = '''
def run(groups, values, backend):
    """Run the groups one after another, passing arrays by argument name."""
    for group in groups:
        if backend == "interp":
            loop = group.lower()
            got = kg.interpret(loop, *(values[b.name] for b in loop.inputs))
            outs = [b.name for b in loop.outputs]
        else:
            kernel = group.emit(backend, tuning="none")
            args = kernel.metadata["args"]
            got = kernel(*(values[a["name"]] for a in args if a["role"] == "input"))
            outs = [a["name"] for a in args if a["role"] == "output"]
        values.update(zip(outs, got if isinstance(got, tuple) else (got,)))
    return values
'''


def array_source(a: np.ndarray) -> str:
    """``a`` as Python source (exact: float32 values print as the shortest float64 repr)."""
    flat = ", ".join(repr(v) if not isinstance(v, float) or np.isfinite(v) else
                     ("nan" if np.isnan(v) else "inf" if v > 0 else "-inf")
                     for v in a.ravel().tolist())
    return f"np.array([{flat}], {str(a.dtype)!r}).reshape({a.shape})"


def reproducer(case: Case, backend: str, problem: str) -> str:
    """The snippet: run it to see ``problem`` again."""
    names = {o.name: f"v{k}" for k, o in enumerate(case.ops)}
    lines = ["import numpy as np", "import kernelgen as kg", "nan, inf = np.nan, np.inf", "",
             case.block.source()]
    groups = []
    for group in case.groups:
        members = ", ".join(names[o.name] for o in group.ops)
        extra = [names[o.name] for o in group.outputs if o.name in names]
        groups.append(f"kg.fuse({members}, outputs=[{', '.join(extra)}], "
                      f"force={case.block.force})")
    lines.append(f"groups = [{', '.join(groups)}]")
    lines.append("arrays = {")
    for name, a in case.feeds.items():
        lines.append(f"    {name!r}: {array_source(a)},")
    lines.append("}")
    lines.append(_RUN)
    sinks = ", ".join(f"v{k}" for k in case.sinks)
    lines.append(f"values = run(groups, dict(arrays), {backend!r})")
    lines.append(f"print([values[v.name] for v in [{sinks}]])")
    lines += ["# " + line for line in problem.splitlines()]
    return "\n".join(lines)
