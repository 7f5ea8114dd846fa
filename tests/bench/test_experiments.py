"""bench/experiments/: each module opens with the question it answers, and the commands
docs/benchmarks.md gives run modules that exist; the page keeps the place
`pd-gateway bench --report docs/benchmarks.md` writes its table into."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from bench.report import embedded

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = ROOT / "bench" / "experiments"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
SHARED = {"__init__", "harness"}


def experiments() -> list[Path]:
    return sorted(p for p in EXPERIMENTS.glob("*.py") if p.stem not in SHARED)


@pytest.mark.parametrize("module", experiments(), ids=lambda p: p.stem)
def test_an_experiment_opens_with_its_question_and_how_to_run_it(module: Path) -> None:
    docstring = ast.get_docstring(ast.parse(module.read_text(encoding="utf-8")))
    assert docstring is not None
    first = docstring.split("\n\n")[0]
    assert "?" in first, f"{module.name}: the first paragraph asks no question"
    assert f"python -m bench.experiments.{module.stem}" in docstring


def test_every_experiment_is_on_the_benchmarks_page_and_every_command_there_exists() -> None:
    page = BENCHMARKS.read_text(encoding="utf-8")
    named = set(re.findall(r"python -m bench\.experiments\.([a-z_]+)", page))
    assert named == {p.stem for p in experiments()}


def test_the_benchmarks_page_has_the_tables_place() -> None:
    page = BENCHMARKS.read_text(encoding="utf-8")
    marked = "<the table of a run>\n"
    rewritten = embedded(page, marked)
    assert rewritten.count(marked) == 1
    before, after = rewritten.split(marked)
    assert page.startswith(before) and page.endswith(after)  # the text around it is kept
    assert "| target | measure |" not in before + after  # the old table is gone
