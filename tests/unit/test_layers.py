"""The package's stairs run one way (docs/architecture.md), checked on the source with ``ast``:

- the import graph of ``kernelgen`` has no cycle, counting imports inside functions and under
  ``TYPE_CHECKING``;
- every import goes to the importer's own layer or one below it (``LAYERS``);
- the only imports inside functions are the optional third-party ones (``LAZY``) and the
  package face's model layer (``LAZY_FIRST_PARTY``), which loads when first asked for;
- shared code never names a backend: no string ``"opencl"``, ``"neon"`` or ``"triton"``
  outside ``kernelgen/backends/`` (which defines them) and ``kernelgen/cli/``;
- files stay under ``MAX_LINES`` lines and functions under ``MAX_FUNCTION_LINES``.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "kernelgen"
# bottom to top: a module may import from its own layer and the layers below
LAYERS = (
    ("version", "errors", "dtypes", "shapes", "options", "hostmem"),
    ("mapping_types",),
    ("ir",),
    ("ops",),
    ("fusion",),
    ("lower",),
    ("backends",),
    ("exec",),
    ("fastrun", "measure", "reference_check"),
    ("compile",),
    ("measure_fusion", "tune"),
    ("api", "graph"),
    ("cli", "__main__", ""),  # "": the package face, kernelgen/__init__.py
)
LAZY = {"pyopencl", "triton", "torch", "onnxruntime"}  # optional: imported where used
# the package face loads the model layer when one of its names is asked for
# (``kernelgen.__getattr__``), so that kernel-level processes start without it; the model layer
# loads its ONNX frontend and report (and with them onnx) where they are used, so that a saved
# model loads without onnx
LAZY_FIRST_PARTY = {("kernelgen", "kernelgen.graph"),
                    ("kernelgen.graph", "kernelgen.graph.onnx_import"),
                    ("kernelgen.graph", "kernelgen.graph.report"),
                    ("kernelgen.graph.session", "kernelgen.graph.onnx_import"),
                    ("kernelgen.graph.session", "kernelgen.graph.report")}
BACKEND_NAMES = {"opencl", "neon", "triton"}
NAMING_BACKENDS = ("backends", "cli")
MAX_LINES = 600
MAX_FUNCTION_LINES = 80


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = ("kernelgen", *path.relative_to(ROOT).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _targets(module: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The first-party modules an import statement loads (``kernelgen...``)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".")
            if MODULES[module].name != "__init__.py":
                package = package[:-1]
            package = package[:len(package) - node.level + 1]
            base = ".".join(package + ([node.module] if node.module else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base
                 for a in node.names]
    out = []
    for name in names:
        while name and name not in MODULES:
            name = name.rpartition(".")[0]
        if name and name != module:
            out.append(name)
    return out


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else ""
    return next(k for k, layer in enumerate(LAYERS) if top in layer)


def _imports() -> list[tuple[str, str, int, bool]]:
    """(importer, imported first-party module, line, inside a function or TYPE_CHECKING)."""
    found = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text())
        nested: set[int] = set()
        for node in ast.walk(tree):
            lazy_scope = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or (
                isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))
            if lazy_scope:
                nested.update(id(n) for n in ast.walk(node) if n is not node)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found += [(module, target, node.lineno, id(node) in nested)
                          for target in _targets(module, node)]
    return found


IMPORTS = _imports()


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        _layer(module)  # raises StopIteration for a top-level name no layer lists


def test_imports_go_down_or_stay_on_their_floor() -> None:
    upward = [f"{a} (layer {_layer(a)}) imports {b} (layer {_layer(b)}) at line {line}"
              for a, b, line, _ in IMPORTS if _layer(b) > _layer(a)]
    assert not upward, "\n".join(upward)


def test_no_import_cycle() -> None:
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for a, b, _, _ in IMPORTS:
        graph[a].add(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[set[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {[sorted(c) for c in cycles]}"


def test_only_optional_packages_are_imported_inside_functions() -> None:
    lazy = [f"{a} imports {b} inside a function (line {line})"
            for a, b, line, nested in IMPORTS if nested and (a, b) not in LAZY_FIRST_PARTY]
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.Import):
                    tops = {a.name.split(".")[0] for a in inner.names}
                elif isinstance(inner, ast.ImportFrom) and not inner.level:
                    tops = {(inner.module or "").split(".")[0]}
                else:
                    continue
                if tops - LAZY - {"kernelgen"}:  # first-party ones are reported above
                    lazy.append(f"{module} imports {sorted(tops)} inside {node.name} "
                                f"(line {inner.lineno})")
    assert not lazy, "\n".join(lazy)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def test_shared_code_never_names_a_backend() -> None:
    named = []
    for module, path in MODULES.items():
        if module.split(".")[1:2] and module.split(".")[1] in NAMING_BACKENDS:
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in BACKEND_NAMES and \
                    id(node) not in docs:
                named.append(f"{module}:{node.lineno} names {node.value!r}")
    assert not named, "\n".join(named)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_sizes(module: str) -> None:
    text = MODULES[module].read_text()
    assert text.count("\n") <= MAX_LINES, f"{module} has over {MAX_LINES} lines"
    long = [f"{node.name}: {node.end_lineno - node.lineno + 1} lines"
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not long, f"{module}: {long}"


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The import walk resolves relative imports: an upward one would be reported."""
    module = "kernelgen.ir.loop"
    node = ast.parse("from ..compile import compile").body[0]
    assert isinstance(node, ast.ImportFrom)
    assert _targets(module, node) == ["kernelgen.compile"]
    assert _layer("kernelgen.compile") > _layer(module)


def test_the_model_layer_loads_when_asked_for() -> None:
    """``import kernelgen`` leaves the model layer and onnx out (the build workers start
    without them); its names and ``kernelgen.graph`` load at first use, and onnx with the
    first ONNX name (a saved model loads without it: tests/graph/test_saved.py)."""
    code = ("import sys, kernelgen as kg\n"
            "print('onnx' in sys.modules, 'kernelgen.graph' in sys.modules)\n"
            "print(kg.compile_model.__module__, kg.graph.plan_dnnfusion.__name__)\n"
            "print('onnx' in sys.modules)\n"
            "print(kg.import_onnx.__module__, kg.graph.FusionReport.__name__)\n"
            "print('onnx' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.stdout.split("\n")[:5] == [
        "False False", "kernelgen.graph.session plan_dnnfusion", "False",
        "kernelgen.graph.onnx_import FusionReport", "True"], done.stderr
