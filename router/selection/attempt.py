"""One call to a server of a set: pick, hold, call, report how it went; a call that failed
before anything was sent (the server unreachable) is made once more on another server.

A call that was sent and then failed is never repeated: the server may have acted on it
(a prefill may have pushed its KV state), so it is in doubt and the error is the client's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack, ExitStack
from typing import TypeVar

from router.selection.affinity import Affinity
from router.selection.ejection import Outcome, outcome_of
from router.selection.server_set import Choice, ServerSet

T = TypeVar("T")


async def call_on(
    servers: ServerSet,
    call: Callable[[Choice], Awaitable[T]],
    *,
    hold_on: AsyncExitStack | None = None,
    judge: Callable[[T], Outcome] | None = None,
    request: Affinity | None = None,
    first: Choice | None = None,
) -> T:
    """`call` on the chosen server. The server stays held until `hold_on` closes (for an
    answer still being relayed), else until the call returns. `judge` says what a returned
    value tells of the server (an error status relayed as it came); by default, success.
    `request`: what the request offers request-aware scorers. `first`: the server already
    chosen for it."""
    choice = first or servers.pick(request=request)
    tried: list[str] = []
    while True:
        hold = ExitStack()
        hold.enter_context(servers.hold(choice.url, request))
        try:
            result = await call(choice)
        except BaseException as exc:
            hold.close()
            outcome = outcome_of(exc)
            if outcome is not None:
                servers.report(choice.url, outcome)
            tried.append(choice.url)
            if outcome != "unreachable" or len(tried) > 1:
                raise
            retry = servers.pick(exclude=tried, request=request)
            if retry.url in tried:
                raise
            choice = retry
            continue
        servers.report(choice.url, judge(result) if judge is not None else "ok")
        if hold_on is None:
            hold.close()
        else:
            hold_on.callback(hold.close)
        return result
