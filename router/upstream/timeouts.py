"""How long the gateway waits on each step of a call to an upstream: the running form of
router.yaml's `timeouts` section (docs/configuration.md says what each bounds), built once
at start-up, since it changes only on a restart. Its defaults are the section's."""

from __future__ import annotations

from dataclasses import dataclass

from router.config import TimeoutsConfig


@dataclass(frozen=True, slots=True)
class Timeouts:
    connect_s: float = 5.0
    prefill_s: float = 600.0
    kv_transfer_s: float = 120.0
    kv_admission_s: float = 10.0
    decode_stall_s: float = 30.0
    cancel_s: float = 5.0

    @classmethod
    def of(cls, config: TimeoutsConfig) -> Timeouts:
        return cls(**config.model_dump())
