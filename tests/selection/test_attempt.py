"""One call on a server of a set: held while it runs, judged, and sent once more elsewhere
only when nothing was sent."""

from __future__ import annotations

from contextlib import AsyncExitStack

import pytest

from router.errors import PrefillError
from router.selection import Choice, ServerSet, call_on, default_set, status_outcome

A, B = "http://a", "http://b"


def unreachable() -> PrefillError:
    return PrefillError("refused", code="prefill_unreachable")


class Calls:
    """A scripted upstream: each URL fails with its error, or answers with its value."""

    def __init__(self, servers: ServerSet, script: dict[str, object]) -> None:
        self.servers, self.script = servers, script
        self.made: list[Choice] = []
        self.held: list[dict[str, int]] = []

    async def __call__(self, choice: Choice) -> object:
        self.made.append(choice)
        self.held.append(self.servers.outstanding())
        result = self.script[choice.url]
        if isinstance(result, BaseException):
            raise result
        return result


async def test_an_unreachable_server_is_tried_once_and_another_answers() -> None:
    servers = default_set([A, B])
    calls = Calls(servers, {A: unreachable(), B: "answer"})
    assert await call_on(servers, calls) == "answer"
    assert calls.made == [Choice(A, "rotation"), Choice(B, "retry_only_other")]
    assert calls.held == [{A: 1, B: 0}, {A: 0, B: 1}]
    assert servers.outstanding() == {A: 0, B: 0}
    snapshot = servers.snapshot()
    assert snapshot[A]["consecutive_failures"] == 1 and snapshot[B]["state"] == "healthy"


@pytest.mark.parametrize(
    "error",
    [
        PrefillError("timed out", code="prefill_timeout", status=504, in_doubt=True),
        PrefillError("broke off", code="prefill_failed", in_doubt=True),
        PrefillError("answered 500", code="prefill_failed"),
    ],
)
async def test_a_call_that_was_sent_is_never_repeated(error: PrefillError) -> None:
    servers = default_set([A, B])
    calls = Calls(servers, {A: error, B: "answer"})
    with pytest.raises(PrefillError):
        await call_on(servers, calls)
    assert [c.url for c in calls.made] == [A]
    assert servers.snapshot()[A]["consecutive_failures"] == 1


async def test_only_one_retry() -> None:
    servers = default_set([A, B, "http://c"])
    calls = Calls(servers, dict.fromkeys(servers.urls, unreachable()))
    with pytest.raises(PrefillError):
        await call_on(servers, calls)
    assert len(calls.made) == 2 and calls.made[0].url != calls.made[1].url


async def test_a_set_of_one_has_nowhere_else_to_go() -> None:
    servers = default_set([A])
    calls = Calls(servers, {A: unreachable()})
    with pytest.raises(PrefillError):
        await call_on(servers, calls)
    assert len(calls.made) == 1


async def test_the_hold_lasts_as_long_as_the_stack() -> None:
    servers = default_set([A, B])
    async with AsyncExitStack() as stack:
        await call_on(servers, Calls(servers, {A: "x", B: "y"}), hold_on=stack)
        assert servers.outstanding() == {A: 1, B: 0}
    assert servers.outstanding() == {A: 0, B: 0}


async def test_a_relayed_error_status_counts_against_its_server() -> None:
    servers = default_set([A, B])
    calls = Calls(servers, {A: 502, B: 200})
    for _ in range(10):
        await call_on(servers, calls, judge=status_outcome)  # type: ignore[arg-type]
    assert servers.snapshot()[A]["state"] == "ejected"
    assert await call_on(servers, calls) == 200
    assert calls.made[-1] == Choice(B, "only_healthy")
