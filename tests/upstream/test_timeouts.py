"""The running timeouts are the configuration's: same defaults, every field carried."""

from __future__ import annotations

import dataclasses

from router.config import TimeoutsConfig
from router.upstream import Timeouts


def test_the_defaults_are_the_configurations() -> None:
    assert Timeouts.of(TimeoutsConfig()) == Timeouts()


def test_every_setting_is_carried() -> None:
    fields = [f.name for f in dataclasses.fields(Timeouts)]
    assert fields == list(TimeoutsConfig.model_fields)
    config = TimeoutsConfig(**{name: 1.0 + i for i, name in enumerate(fields)})
    assert dataclasses.astuple(Timeouts.of(config)) == tuple(1.0 + i for i in range(len(fields)))
