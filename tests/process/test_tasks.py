"""Eager tasks on the gateway's event loop where Python has them (3.12+), the default
factory elsewhere; on uvloop as on asyncio's own loop. On pytest's Python, and on the
Python the gateway's processes run on (the container image's 3.13 where installed)."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import uvloop

from router.process.tasks import install_eager_tasks
from tests.support.gateway_python import gateway_python, gateway_python_version
from tests.support.processes import run_in_group

ROOT = Path(__file__).resolve().parents[2]
EAGER_PYTHON = sys.version_info >= (3, 12)


async def started_at_creation(create: Callable[[asyncio.AbstractEventLoop], None]) -> bool:
    """Whether a task had run up to its first wait when `create_task` returned, once
    `create` set the loop up; the task's result comes back either way."""
    loop = asyncio.get_running_loop()
    create(loop)
    started: list[str] = []

    async def note() -> str:
        started.append("ran")
        await asyncio.sleep(0)
        return "done"

    task = asyncio.create_task(note(), name="noted")
    eager = started == ["ran"]
    assert await task == "done" and started == ["ran"] and task.get_name() == "noted"
    return eager


def install(loop: asyncio.AbstractEventLoop) -> None:
    assert install_eager_tasks(loop) is EAGER_PYTHON


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_task_starts_inside_create_task_where_python_has_eager_tasks(
    run: Callable[..., bool],
) -> None:
    assert run(started_at_creation(install)) is EAGER_PYTHON
    assert run(started_at_creation(lambda loop: None)) is False


def test_a_creator_that_asks_for_a_lazy_start_gets_one() -> None:
    async def main() -> bool:
        loop = asyncio.get_running_loop()
        install_eager_tasks(loop)
        started: list[str] = []

        async def note() -> None:
            started.append("ran")

        factory = loop.get_task_factory()
        if factory is None:  # before 3.12: every task starts lazily
            return not EAGER_PYTHON
        task = factory(loop, note(), eager_start=False)  # type: ignore[call-arg]
        lazy = started == []
        await task
        return lazy

    assert uvloop.run(main())


@pytest.mark.e2e
def test_the_gateways_python_passes_these_tests_too() -> None:
    """The gateway runs as a process on another Python than pytest's where the container
    image's is installed (tests.support.gateway_python): the tests above, run there."""
    others = ["-k", "not test_the_gateways_python_passes_these_tests_too"]
    done = run_in_group(
        [gateway_python(), "-m", "pytest", __file__, "-n0", "-p", "no:cacheprovider", *others],
        cwd=ROOT,
        timeout_s=120,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"Python {gateway_python_version()}," in done.stdout
    assert "3 passed, 1 deselected" in done.stdout
