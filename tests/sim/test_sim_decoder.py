"""Multi-token step pattern of the simulated decode node."""

from itertools import islice

import pytest

from sim.tilert.decoder import burst_sizes


@pytest.mark.parametrize(
    ("rate", "first"),
    [(3.2, [3, 3, 3, 3, 4, 3, 3, 3, 3, 4]), (1, [1, 1, 1]), (2.5, [2, 3, 2, 3])],
)
def test_burst_pattern(rate: float, first: list[int]) -> None:
    assert list(islice(burst_sizes(rate), len(first))) == first


def test_mean_is_exact_over_many_steps() -> None:
    assert sum(islice(burst_sizes(3.2), 1000)) == 3200
