"""Eager tasks on the gateway's event loop where Python has them (3.12+), the default
factory elsewhere."""

from __future__ import annotations

import asyncio
import sys

from router.process.tasks import install_eager_tasks

EAGER_PYTHON = sys.version_info >= (3, 12)


async def test_a_task_starts_inside_create_task_where_python_has_eager_tasks() -> None:
    loop = asyncio.get_running_loop()
    started: list[str] = []

    async def note() -> str:
        started.append("ran")
        await asyncio.sleep(0)
        return "done"

    previous = loop.get_task_factory()
    try:
        assert install_eager_tasks(loop) is EAGER_PYTHON
        task = asyncio.create_task(note())
        assert started == (["ran"] if EAGER_PYTHON else [])
        assert await task == "done" and started == ["ran"]
    finally:
        loop.set_task_factory(previous)


async def test_without_eager_tasks_the_loop_keeps_its_factory() -> None:
    loop = asyncio.get_running_loop()
    previous = loop.get_task_factory()
    try:
        install_eager_tasks(loop)
        expected = asyncio.eager_task_factory if EAGER_PYTHON else previous  # type: ignore[attr-defined]
        assert loop.get_task_factory() is expected
    finally:
        loop.set_task_factory(previous)
