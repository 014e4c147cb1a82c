"""Every Triton kernel of the operator and fusion matrix, and the fused attention kernels (staged
score rows), also compile ahead of time for a CUDA target (sm_80), in a separate process:
kernels the interpreter wrongly accepts fail here."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require
from test_fusion import NEIGHBOUR_CASES, neighbour_block
from test_golden import CASES as GOLDEN_CASES
from test_ago import ATTENTION_SHAPES, _scaled_attention
from test_nn import CASES as NN_CASES
from test_ops import CASES

import kernelgen as kg
from kernelgen import backends
from kernelgen.backends.triton.runtime import load_module, module_dir


def _blocks() -> list[tuple[str, kg.FusedOp]]:
    blocks = [(c.name, kg.fuse(c.build(*c.inputs()[0]))) for c in CASES]
    blocks += [(f"neighbours-{c.name}", kg.fuse(*neighbour_block(c)[2], force=True))
               for c in NEIGHBOUR_CASES]
    blocks += [(f"golden-{name}", make()) for name, (make, _) in GOLDEN_CASES.items()]
    blocks += [(f"nn-{c.name}", kg.fuse(c.build(*c.inputs()[0]))) for c in NN_CASES]
    # a row padded to a power of two; 4096 keys: the widest staged row, a [4096, 2] tile
    blocks += [(f"attention-{'x'.join(map(str, s))}",
                kg.fuse(*_scaled_attention(*s)[1], force=True))
               for s in [*ATTENTION_SHAPES, (1, 3, 16, 4096, 8)]]
    blocks += list(WIDE.items()) + list(FUZZ_FINDINGS.items())
    return blocks


def _window_summed_twice() -> kg.FusedOp:
    """The fuzzer's finding on an H200: an average pool's sum and count reduce over one window
    symbol, serially and then in lanes; Triton's compiler rejected the name rebound to a block."""
    ops = [kg.reduce_sum_square(kg.tensor("x0", (1,)), axes=[0], keepdims=0)]
    ops.append(kg.sin(ops[-1]))
    ops.append(kg.unsqueeze(ops[-1], axes=[0]))
    ops.append(kg.reshape(ops[-1], shape=[1, 1, 1]))
    ops.append(kg.average_pool(ops[-1], kernel_shape=[1], pads=[0, 0], strides=[2],
                               count_include_pad=0))
    ops.append(kg.max_pool(ops[-1], kernel_shape=[1], ceil_mode=1))
    return kg.fuse(*ops, force=True)


FUZZ_FINDINGS = {"window-summed-twice": _window_summed_twice()}


# contractions whose operands hold more than 2**31 elements (emitted and compiled, not run)
WIDE = {
    "wide-matmul-tall": kg.fuse(kg.matmul(kg.tensor("a", (70000, 40000)),
                                          kg.tensor("b", (40000, 4)))),
    "wide-matmul-broad": kg.fuse(kg.matmul(kg.tensor("a", (4, 40000)),
                                           kg.tensor("b", (40000, 70000)))),
    "wide-conv": kg.fuse(kg.conv(kg.tensor("x", (1, 64, 6000, 6000)),
                                 kg.tensor("w", (64, 64, 3, 3)), pads=[1] * 4)),
}


@pytest.mark.parametrize("name", WIDE)
@pytest.mark.parametrize("pack", [False, True])
def test_wide_contractions_index_in_64_bits(name: str, pack: bool) -> None:
    """Every offset of a contraction over more than 2**31 elements is computed in int64: the
    program ids and the tiles' positions are widened before any multiply, and no 32-bit
    zeros broadcast an offset (40000 * 69999 overflows int32)."""
    triton = backends.get("triton")
    schedule = triton.choose(WIDE[name].lower(), {"pack": pack})
    assert schedule.kind == "tiled" and schedule.index_type == "tl.int64"
    text = triton.render(schedule).text
    assert "tl.int32" not in text
    assert "tl.program_id(0).to(tl.int64)" in text
    assert "rk = k0 + tl.arange(0, BLOCK_K).to(tl.int64)" in text


def test_every_kernel_compiles_for_cuda(tmp_path: Path) -> None:
    require("triton")
    jobs = []
    # every block at its defaults; each contraction also with its row blocks packed first
    # (pack: the panel store, the barrier and the panel loads)
    variants = [(name, block, {}) for name, block in _blocks()]
    variants += [(f"{name}-packed", block, {"pack": True}) for name, block in _blocks()
                 if name.startswith("nn-")]
    triton = backends.get("triton")
    for name, block, options in variants:
        schedule = triton.choose(block.lower(), options)
        if options and not schedule.pack:
            continue  # not a contraction
        source = triton.render(schedule)
        load_module(source.module_name, source.text)  # writes the module file
        jobs.append({"name": name, "path": str(module_dir() / f"{source.module_name}.py"),
                     "function": source.function, "signature": source.signature,
                     "constexprs": source.constexprs})
    assert any(job["name"].endswith("-packed") for job in jobs)
    manifest = tmp_path / "jobs.json"
    manifest.write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.setdefault("TRITON_CACHE_DIR", str(Path(env.get("XDG_CACHE_HOME", tmp_path)) / "triton"))
    result = subprocess.run([sys.executable, "-m", "kernelgen.backends.triton.aot", str(manifest)],
                            capture_output=True, text=True, env=env, timeout=1800)
    reports = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    failed = [r for r in reports if not r["ok"]]
    assert len(reports) == len(jobs), f"AOT process died:\n{result.stderr[-3000:]}"
    assert not failed, "kernels the CUDA compiler rejects:\n" + "\n".join(
        f"{r['name']}: {r['error']}" for r in failed[:10])
    assert all("ptx" in r["stages"] for r in reports)


@pytest.mark.parametrize("target", [("cuda", 90, 32), ("hip", "gfx942", 64)])
def test_softmax_compiles_for_other_targets(tmp_path: Path, target: tuple) -> None:
    """The single-kernel softmax also builds for Hopper and for AMD's gfx942."""
    require("triton")
    x = kg.tensor("x", (7, 1000))
    triton = backends.get("triton")
    source = triton.render(triton.choose(kg.fuse(kg.softmax(x, 1)).lower(), {}))
    load_module(source.module_name, source.text)
    job = {"name": "softmax", "path": str(module_dir() / f"{source.module_name}.py"),
           "function": source.function, "signature": source.signature,
           "constexprs": source.constexprs, "target": list(target)}
    manifest = tmp_path / "jobs.json"
    manifest.write_text(json.dumps([job]))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-m", "kernelgen.backends.triton.aot", str(manifest)],
                            capture_output=True, text=True, env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
