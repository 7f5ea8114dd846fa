"""Interleaved rounds: at each level, every method in turn, round after round, so that the
noise of other processes on the machine hits them all alike."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from bench.batch_latency import Relays
from bench.processes import cpu_s, reset_peak_rss, rss_mb, running
from bench.scenarios import Level, Method
from bench.streams import BenchFailure, Sample


@dataclass(slots=True)
class Measured:
    """One method at one level: its samples, and its router's CPU time (over all rounds)
    and resident memory: with one stream open (in the warm-up, before the first time this
    level's streams were open at once), and before and at the peak of each round."""

    samples: list[Sample] = field(default_factory=list)
    handoffs_s: list[float] = field(default_factory=list)
    relays: Relays = field(default_factory=Relays)
    cpu_s: float = 0.0
    rss_one_stream_mb: float = 0.0
    rss_before_mb: list[float] = field(default_factory=list)
    rss_peak_mb: list[float] = field(default_factory=list)


async def run_load(
    requests: int,
    concurrency: int,
    send: Callable[[int], Awaitable[Sample]],
    done: Callable[[], None] = lambda: None,
) -> list[Sample]:
    """`requests` calls of `send(worker)` from `concurrency` workers, each one at a time."""
    remaining = iter(range(requests))
    samples: list[Sample] = []

    async def worker(index: int) -> None:
        for _ in remaining:
            samples.append(await send(index))
            done()

    async with asyncio.TaskGroup() as group:
        for index in range(concurrency):
            group.create_task(worker(index))
    return samples


async def _warm_up(level: Level, measured: dict[str, Measured]) -> None:
    """Connections, tokenizers and every node, before anything is measured: one request,
    then as many at once as the level runs (its streams' memory is counted from there, as
    the peak over the resident size with one stream)."""
    for method in level.methods:
        await level.settle()
        await run_load(1, 1, method.send)
        if method.pids:
            measured[method.label].rss_one_stream_mb = _rss_mb(method.pids)
            _reset_peak_rss(method.pids)
        await run_load(level.concurrency, level.concurrency, method.send)
        if method.pids:
            measured[method.label].rss_peak_mb.append(_rss_mb(method.pids, "VmHWM"))


async def measure(
    level: Level, rounds: int, started: Callable[[str], None], done: Callable[[], None]
) -> dict[str, Measured]:
    """A warm-up, then `rounds` rounds of the level's requests for each method; round r
    starts with method r (mod their count), so no method always follows the same one."""
    measured = {method.label: Measured() for method in level.methods}
    started("warming up")
    await _warm_up(level, measured)
    for index in range(rounds):
        shift = index % len(level.methods)
        for method in (*level.methods[shift:], *level.methods[:shift]):
            started(f"{method.label}, round {index + 1}/{rounds}")
            await level.settle()
            await _round(method, level, measured[method.label], done)
            if level.handoffs is not None:
                measured[method.label].handoffs_s += await level.handoffs()
    return measured


async def _round(method: Method, level: Level, into: Measured, done: Callable[[], None]) -> None:
    requests, concurrency = level.per_round, level.concurrency
    if not method.pids:
        samples = await run_load(requests, concurrency, method.send, done)
    else:
        for pid in method.pids:
            if not running(pid):
                raise BenchFailure(f"{method.label} (pid {pid}) has exited: see its log")
        into.rss_before_mb.append(_rss_mb(method.pids))
        _reset_peak_rss(method.pids)
        before = _cpu_s(method.pids)
        samples = await run_load(requests, concurrency, method.send, done)
        into.cpu_s += _cpu_s(method.pids) - before
        into.rss_peak_mb.append(_rss_mb(method.pids, "VmHWM"))
    into.samples += samples
    if level.relays is not None:
        found = await level.relays(samples)
        into.relays.latencies_s += found.latencies_s
        into.relays.unpaired += found.unpaired


def _cpu_s(pids: tuple[int, ...]) -> float:
    return sum(cpu_s(pid) for pid in pids)


def _rss_mb(pids: tuple[int, ...], field: str = "VmRSS") -> float:
    return sum(rss_mb(pid, field) for pid in pids)


def _reset_peak_rss(pids: tuple[int, ...]) -> None:
    for pid in pids:
        reset_peak_rss(pid)
