"""The order xdist hands the suite's units out in: the real_vllm tier first, as one unit,
then the units that start processes (the benchmark scenarios first, those holding a
`serial` test last among them), then the in-process units, the most tests first within
each group, each unit whole and in its own order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.scheduling import (
    SERIAL_SCOPE,
    TIER_SCOPE,
    UnnamedSerialModule,
    in_handout_order,
    scope_of,
)


@dataclass
class Collected:
    nodeid: str
    e2e: bool = False
    serial: bool = False

    def get_closest_marker(self, name: str) -> object:
        marked = (name == "e2e" and (self.e2e or self.serial)) or (name == "serial" and self.serial)
        return object() if marked else None


def test_the_tier_goes_first_then_processes_then_the_serial_modules_then_the_rest() -> None:
    items: list[Any] = [
        Collected("tests/a/test_small.py::test_one"),
        Collected("tests/b/test_big.py::test_one"),
        Collected("tests/b/test_big.py::test_two"),
        Collected("tests/b/test_big.py::test_three"),
        Collected("tests/real_vllm/test_x.py::test_one"),
        Collected("tests/e2e/test_replicas.py::test_one", e2e=True),
        Collected("tests/e2e/test_replicas.py::test_two", serial=True),
        Collected("tests/e2e/test_replicas.py::test_three", e2e=True),
        Collected("tests/c/test_mid.py::Case::test_one"),
        Collected("tests/c/test_mid.py::Case::test_two"),
        Collected("tests/e2e/test_one.py::test_one", e2e=True),
        Collected("tests/real_vllm/test_y.py::test_one"),
        Collected("tests/e2e/test_two.py::test_one", e2e=True),
        Collected("tests/e2e/test_two.py::test_two", e2e=True),
        Collected("tests/bench/test_scenario.py::test_one", e2e=True),
        Collected("tests/bench/test_report.py::test_one"),
    ]
    in_handout_order(items)
    assert [item.nodeid for item in items] == [
        "tests/real_vllm/test_x.py::test_one",
        "tests/real_vllm/test_y.py::test_one",
        "tests/bench/test_scenario.py::test_one",
        "tests/e2e/test_two.py::test_one",
        "tests/e2e/test_two.py::test_two",
        "tests/e2e/test_one.py::test_one",
        "tests/e2e/test_replicas.py::test_one",
        "tests/e2e/test_replicas.py::test_two",
        "tests/e2e/test_replicas.py::test_three",
        "tests/b/test_big.py::test_one",
        "tests/b/test_big.py::test_two",
        "tests/b/test_big.py::test_three",
        "tests/c/test_mid.py::Case::test_one",
        "tests/c/test_mid.py::Case::test_two",
        "tests/a/test_small.py::test_one",
        "tests/bench/test_report.py::test_one",
    ]


def test_every_module_of_the_tier_is_one_unit_and_others_are_their_own() -> None:
    assert scope_of("tests/real_vllm/test_x.py::test_one[a]") == TIER_SCOPE
    assert scope_of("tests/real_vllm/test_y.py::test_two") == TIER_SCOPE
    assert scope_of("tests/e2e/test_z.py::test_one") == "tests/e2e/test_z.py"
    assert scope_of("tests/c/test_mid.py::Case::test_one") == "tests/c/test_mid.py::Case"
    assert scope_of("tests/e2e/test_replicas.py::test_one") == SERIAL_SCOPE
    assert scope_of("tests/sim/test_sim_itl_per_running.py::test_gap[chat]") == SERIAL_SCOPE


def test_a_serial_test_in_a_module_not_named_is_refused() -> None:
    items: list[Any] = [
        Collected("tests/e2e/test_one.py::test_one", e2e=True),
        Collected("tests/e2e/test_new.py::test_timed", serial=True),
    ]
    with pytest.raises(UnnamedSerialModule, match=r"tests/e2e/test_new\.py"):
        in_handout_order(items)
