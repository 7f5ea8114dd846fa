"""The connection bound fits the open-file limit it is given."""

from __future__ import annotations

import resource

import pytest

from router.process.front_door import (
    FD_HEADROOM,
    OVERFLOW_RESERVE,
    connection_limit,
    raise_fd_limit,
)


@pytest.mark.parametrize(
    ("configured", "fd_limit", "expected"),
    [
        (4096, 1_048_576, 4096),
        (4096, 1024, 1024 - FD_HEADROOM - OVERFLOW_RESERVE),
        (4096, 100, 1),
    ],
)
def test_the_bound_is_lowered_to_what_descriptors_allow(
    configured: int, fd_limit: int, expected: int
) -> None:
    assert connection_limit(configured, fd_limit) == expected


def test_the_soft_descriptor_limit_is_raised_to_the_hard_one() -> None:
    before = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, before[1]), before[1]))
        assert raise_fd_limit() == before[1]
        assert resource.getrlimit(resource.RLIMIT_NOFILE) == (before[1], before[1])
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, before)
