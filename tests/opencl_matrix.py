"""The OpenCL tests on every OpenCL implementation besides the default one: each runs
``pytest -k "opencl and not neon and not triton" tests/backend`` with ``--opencl-device``
naming it, in its own processes (the device is chosen once per process; pytest-xdist, one
worker per core).

    python tests/opencl_matrix.py [--all] [NAME ...]     # default: every one installed

The implementations share each test's cases (``--case-share``, in turns): every test runs on
every implementation, each of its cases on the default one (the whole suite) and on one
other, which halves the matrix (32 minutes on a Zen 1 CPU with every case on both). ``--all``
runs every case on each.

NAME is a part of a device's name as ``python -m kernelgen devices`` lists them: ``intel``
(Intel's CPU runtime, pip ``intel-opencl-rt``) and ``pocl 3.0`` (pip's PoCL, LLVM 14). The
default device (Debian's PoCL) runs the whole suite already; Oclgrind runs its own checks
(``tests/backend/test_oclgrind.py``). With ``KERNELGEN_REQUIRE_BACKENDS=1`` (CI) a missing
implementation fails; otherwise it is skipped with a line naming it.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the OpenCL tests by name, less the NEON C and Triton cases of OpenCL test files (the same on
# every OpenCL implementation; the Triton one took 74 s of Intel's 13 minutes on a Zen 1 CPU)
ONLY_OPENCL = "opencl and not neon and not triton"
IMPLEMENTATIONS = {"intel": "Intel's CPU runtime (pip intel-opencl-rt intel-cmplr-lib-rt)",
                   "pocl 3.0": "pip's PoCL (pip pocl-binary-distribution)"}


def installed(name: str) -> str | None:
    """The label of the device ``--opencl-device=name`` runs on, where ``name`` names an
    implementation (a platform's name or version: on an Intel CPU, 'intel' is in every
    implementation's device name too)."""
    from kernelgen.backends.opencl.runtime import named_devices
    found = named_devices(name)
    return found[0][1] if found and found[0][0] <= 1 else None


def main(args: list[str]) -> int:
    every_case = "--all" in args
    status = 0
    found: dict[str, str | None] = {}
    for name in [a for a in args if a != "--all"] or list(IMPLEMENTATIONS):
        found[name] = installed(name)
        if found[name] is None:
            print(f"opencl matrix: {IMPLEMENTATIONS.get(name, name)} is not installed")
            if os.environ.get("KERNELGEN_REQUIRE_BACKENDS"):
                status = 1
    running = [name for name, device in found.items() if device is not None]
    shared = not every_case and len(running) > 1
    for share, name in enumerate(running):
        cases = [f"--case-share={share}/{len(running)}"] if shared else []
        which = f" (share {share + 1} of {len(running)} of the cases)" if shared else ""
        print(f"opencl matrix: the OpenCL tests on '{name}': {found[name]}{which}", flush=True)
        start = time.time()
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "auto",
                               "--dist", "worksteal", "-k", ONLY_OPENCL, "--durations=15",
                               *cases, "tests/backend", f"--opencl-device={name}",
                               "-W", "ignore::pyopencl.CompilerWarning"], cwd=ROOT)
        print(f"opencl matrix: '{name}' {'passed' if done.returncode == 0 else 'FAILED'} in "
              f"{time.time() - start:.0f} s", flush=True)
        status |= done.returncode != 0
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
