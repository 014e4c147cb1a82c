"""``--case-share K/N`` (tests/conftest.py), which the OpenCL matrix gives each implementation:
the shares of a test's cases are disjoint and cover them all, and a test with one case runs
in every share."""
from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
FILE = "unit/test_cli.py"  # parametrised tests and tests of one case, collected in seconds


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args, FILE],
                          cwd=TESTS, capture_output=True, text=True, timeout=300)


def _collected(*args: str) -> list[str]:
    done = _collect(*args)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return [line for line in done.stdout.splitlines() if "::" in line]


def test_shares_split_each_tests_cases_and_keep_single_cases_whole() -> None:
    every = _collected()
    shares = [_collected(f"--case-share={k}/2") for k in range(2)]
    per_test = Counter(nodeid.split("[")[0] for nodeid in every)
    single = {n for n in every if per_test[n.split("[")[0]] == 1}
    several = set(every) - single
    assert several and single, f"{FILE} no longer has both kinds of test"
    assert set(shares[0]) | set(shares[1]) == set(every)
    assert set(shares[0]) & set(shares[1]) == single
    for test, n in per_test.items():  # dealt in turns: the shares differ by one case at most
        got = [sum(nodeid.split("[")[0] == test for nodeid in share) for share in shares]
        assert n == 1 or abs(got[0] - got[1]) <= 1, (test, got)


def test_a_share_past_the_last_is_a_usage_error() -> None:
    done = _collect("--case-share=2/2")
    assert done.returncode == 4 and "K must be in 0..N-1" in done.stderr, done.stderr[-2000:]
