"""Compile generated Triton modules ahead of time for a GPU target, no GPU needed.

The interpreter accepts some kernels the compiler rejects, so tests compile every generated
kernel for ``GPUTarget("cuda", 80, 32)`` too. Triton allows one mode per process: run this in a
process where ``TRITON_INTERPRET`` is unset:

    python -m kernelgen.backends.triton.aot MANIFEST.json   # prints one JSON line per kernel
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any


def compile_module(path: str, function: str, signature: dict[str, str],
                   constexprs: dict[str, int], target: tuple[str, Any, int]) -> dict[str, Any]:
    """AOT-compile ``function`` of the module at ``path``; returns the artefacts' summary."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    fn = getattr(module, function)
    full_signature = {**signature, **{c: "constexpr" for c in constexprs}}
    compiled = triton.compile(ASTSource(fn=fn, signature=full_signature, constexprs=constexprs),
                              target=GPUTarget(*target))
    return {"stages": sorted(compiled.asm), "shared": compiled.metadata.shared}


def main(argv: list[str]) -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: the AOT compiler and the interpreter cannot share a "
              "process", file=sys.stderr)
        return 2
    jobs = json.loads(Path(argv[0]).read_text())
    failures = 0
    for job in jobs:
        try:
            result = compile_module(job["path"], job["function"], job["signature"],
                                    job["constexprs"], tuple(job.get("target", ("cuda", 80, 32))))
            print(json.dumps({"name": job["name"], "ok": True, **result}), flush=True)
        except Exception as exc:  # noqa: BLE001 - report every kernel, then fail
            failures += 1
            print(json.dumps({"name": job["name"], "ok": False, "error": repr(exc)[:2000]}),
                  flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
