"""proctree.random_below: the marker allocator's random start, without the secrets module."""

from __future__ import annotations

from collections import Counter

import pytest

from sandbox.proctree import MARKER_SPAN, random_below


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 255, 256, 257, MARKER_SPAN])
def test_always_in_range(n: int) -> None:
    assert all(0 <= random_below(n) < n for _ in range(2000))


def test_every_value_comes_up() -> None:
    counts = Counter(random_below(5) for _ in range(5000))
    assert set(counts) == set(range(5))
