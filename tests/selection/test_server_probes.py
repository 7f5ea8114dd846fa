"""Active probes: each server once a round, however many sets name it."""

from __future__ import annotations

import asyncio

from router.selection import (
    HealthBook,
    default_set,
    probe_servers_forever,
    probe_servers_once,
    sets_of,
)

A, B = "http://a", "http://b"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Answers:
    def __init__(self, alive: set[str]) -> None:
        self.alive = alive
        self.asked: list[str] = []

    async def __call__(self, url: str) -> bool:
        self.asked.append(url)
        return url in self.alive


async def test_a_server_in_two_sets_is_probed_once_and_both_hear_it() -> None:
    clock = Clock()
    first = default_set([A, B], health=HealthBook([A, B], clock=clock))
    second = default_set([A], health=HealthBook([A], clock=clock))
    answers = Answers({B})
    assert await probe_servers_once([first, second], answers) == {A: False, B: True}
    assert answers.asked == [A, B]
    assert first.snapshot()[A]["last_failure"] == "probe_failed"
    assert second.snapshot()[A]["failures"] == 1


async def test_failing_probes_eject_and_an_answer_readmits_early() -> None:
    clock = Clock()
    servers = default_set([A, B], health=HealthBook([A, B], clock=clock))
    answers = Answers({B})
    for _ in range(5):
        await probe_servers_once([servers], answers)
    assert servers.snapshot()[A]["state"] == "ejected"
    await probe_servers_once([servers], answers)  # still dead: the back-off is not lengthened
    assert servers.snapshot()[A]["ejected_for_s"] == 10.0
    answers.alive.add(A)
    await probe_servers_once([servers], answers)
    assert servers.snapshot()[A]["state"] == "probation"
    assert servers.pick(exclude=[B]).url == A


class Path:
    def __init__(self, *sets: object) -> None:
        self._sets = list(sets)

    def server_sets(self) -> list[object]:
        return self._sets


def test_the_sets_of_paths_are_listed_once() -> None:
    shared, other = default_set([A]), default_set([B])
    assert sets_of([Path(shared), None, Path(shared, other), "not a path"]) == [shared, other]


async def test_the_prober_survives_a_failing_round_and_stops_when_cancelled() -> None:
    rounds: list[int] = []
    done = asyncio.Event()

    def sets() -> list[object]:
        rounds.append(1)
        if len(rounds) == 3:
            done.set()
        if len(rounds) == 1:
            raise RuntimeError("a bug")
        return []

    task = asyncio.create_task(probe_servers_forever(sets, Answers(set()), interval_s=0))  # type: ignore[arg-type]
    await done.wait()
    task.cancel()
    await asyncio.wait([task])
    assert task.cancelled() and len(rounds) >= 3
