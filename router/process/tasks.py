"""The event loop's task factory: eager tasks where Python has them (3.12+).

An eager task runs its coroutine at once, inside `create_task`, up to its first wait, and
is never scheduled at all if it finishes before one: a stream's small tasks (a header
check, a cached lookup, a release) then cost no trip through the loop's ready queue, and
no wake-up of their own. Elsewhere the loop's default factory stays.

Not `asyncio.eager_task_factory` itself: uvloop hands every factory an `eager_start`
argument (None unless the caller chose), which that factory refuses before Python 3.14.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from contextvars import Context
from typing import Any


def install_eager_tasks(loop: asyncio.AbstractEventLoop) -> bool:
    """Make `loop` start its tasks eagerly; whether this Python can."""
    if sys.version_info >= (3, 12):
        loop.set_task_factory(_eager_task)
        return True
    return False


def _eager_task(
    loop: asyncio.AbstractEventLoop,
    coro: Coroutine[Any, Any, Any],
    *,
    name: str | None = None,
    context: Context | None = None,
    eager_start: bool | None = None,
) -> asyncio.Task[Any]:
    """A task started eagerly unless its creator said `eager_start=False`."""
    eager = True if eager_start is None else eager_start
    if sys.version_info >= (3, 12):
        return asyncio.Task(coro, loop=loop, name=name, context=context, eager_start=eager)
    raise RuntimeError("eager tasks need Python 3.12")  # never installed before 3.12
