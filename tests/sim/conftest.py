"""What the simulator tests share: each module starts its own `stack` (a SimStack)."""

from collections.abc import AsyncIterator

import httpx
import pytest

from sim.stack import SimStack

from .sim_support import reset_stack


@pytest.fixture
async def client(stack: SimStack) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client for the simulators, every one of `stack` reset first (nodes idle)."""
    async with httpx.AsyncClient(timeout=30) as http:
        await reset_stack(http, stack)
        yield http
