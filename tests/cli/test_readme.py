"""README.md and docs/: the quick start's test command is the one CI runs, and every
relative link (file and heading) leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.report import markers

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # no headings in code
    return {slug(m) for m in re.findall(r"^#+ (.+)$", text, flags=re.M)}


def test_the_quick_start_test_command_is_what_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (ci,) = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if "pytest" in line]
    assert f"\n{ci}\n" in readme


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):
            continue  # another site
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target}"
        if anchor:
            assert anchor in anchors(linked), f"{page.name}: {target}"


def test_the_readmes_performance_figures_are_those_of_the_benchmarks_page() -> None:
    """Regenerating docs/benchmarks.md makes the README's summary wrong until it is
    updated: each measured figure there must be one of the page's."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Performance\n")[1].split("\n## ")[0]
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    tables = [
        page.split(f"\n{start}\n")[1].split(f"\n{end}")[0]
        for start, end in (
            markers("paths"),
            markers("agents"),
            markers("objectives"),
            markers("tenants"),
        )
    ]
    table = "\n".join(tables)
    figures = re.findall(r"[-+]?\d+\.\d+", section)
    assert len(figures) > 10
    assert [f for f in figures if f not in table] == []
