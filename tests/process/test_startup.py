"""The exit status and line of a start-up that failed, by what it raised."""

from __future__ import annotations

from router.config import ConfigError
from router.process.startup import failure_of


def test_what_the_start_up_raised_decides_the_status() -> None:
    assert failure_of(ConfigError("router.yaml: x: bad")).status == 2
    denied = failure_of(OSError(13, "Permission denied", "/srv/key"))
    assert (str(denied), denied.status) == (
        "start-up: PermissionError: /srv/key: Permission denied",
        1,
    )
