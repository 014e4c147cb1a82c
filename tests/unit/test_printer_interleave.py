"""``printer.interleave``: independent blocks of one-line statements listed statement by
statement in turn; anything else (a nested block, blocks of different lengths) unchanged."""
from __future__ import annotations

from kernelgen.backends.printer import interleave


def test_statements_of_equal_blocks_alternate() -> None:
    a = ["    const float8 v1 = x + y;", "    const float8 v2 = v1 * v1;  // exp(v1)"]
    b = ["    const float8 v3 = x - y;", "    const float8 v4 = v3 * v3;  // exp(v3)"]
    assert interleave([a, b]) == [a[0], b[0], a[1], b[1]]


def test_nested_or_uneven_blocks_follow_one_another() -> None:
    nested = ["    if (c) {", "        v = 1;", "    }"]
    flat = ["    a = 1;", "    b = 2;", "    c = 3;"]
    assert interleave([nested, flat]) == nested + flat
    assert interleave([flat, flat[:2]]) == flat + flat[:2]
    comment = ["    // a comment", "    a = 1;", "    b = 2;"]
    assert interleave([comment, flat]) == comment + flat
    assert interleave([[], []]) == []
