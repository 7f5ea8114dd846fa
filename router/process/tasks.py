"""The event loop's task factory: eager tasks where Python has them (3.12+).

An eager task runs its coroutine at once, inside `create_task`, up to its first wait, and
is never scheduled at all if it finishes before one: a stream's small tasks (a header
check, a cached lookup, a release) then cost no trip through the loop's ready queue, and
no wake-up of their own. Elsewhere the loop's default factory stays.
"""

from __future__ import annotations

import asyncio


def install_eager_tasks(loop: asyncio.AbstractEventLoop) -> bool:
    """Make `loop` start its tasks eagerly; whether this Python can."""
    factory = getattr(asyncio, "eager_task_factory", None)
    if factory is None:
        return False
    loop.set_task_factory(factory)
    return True
