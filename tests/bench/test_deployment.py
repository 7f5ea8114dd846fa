"""The bench's systems under test start side by side, and the first that cannot start
ends the wait at once: a peer that dies at start is not reported after every gateway has
started."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from bench.deployment import all_ready
from bench.processes import StartFailure


class Starting:
    """Ready once `ready` is set."""

    def __init__(self, log_path: Path, ready: threading.Event) -> None:
        self.log_path, self._ready = log_path, ready

    def wait_ready(self) -> str:
        self._ready.wait()
        return "http://starting"


class Dying:
    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path

    def wait_ready(self) -> str:
        raise StartFailure("vllm-router did not start", self.log_path)


def test_every_child_ready_is_the_end_of_the_wait(tmp_path: Path) -> None:
    ready = threading.Event()
    ready.set()
    all_ready([Starting(tmp_path / "a.log", ready), Starting(tmp_path / "b.log", ready)])


def test_the_first_child_that_cannot_start_ends_the_wait_at_once(tmp_path: Path) -> None:
    for name in ("gateway.log", "vllm-router.log"):
        (tmp_path / name).write_text(f"{name} says why\n")
    never = threading.Event()  # the gateway is still starting when the peer dies
    try:
        with pytest.raises(StartFailure) as failure:
            all_ready(
                [Starting(tmp_path / "gateway.log", never), Dying(tmp_path / "vllm-router.log")]
            )
    finally:
        never.set()
    assert "vllm-router did not start" in str(failure.value)
    assert "vllm-router.log says why" in str(failure.value)
