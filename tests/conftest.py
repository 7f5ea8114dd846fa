"""Suite-wide test set-up: the `e2e` marker, and the fixtures end-to-end modules share.

A test is `e2e` when it starts real processes (simulators, the gateway, the CLI): every
test under tests/e2e/ is marked here, other modules mark themselves (`pytestmark`).
`pytest -m "not e2e"` is then the fast in-process loop, and a test that starts a process
without the marker fails at once, so nothing slow slips into that loop unnoticed.

pytest-xdist runs the suite on half again as many workers as CPUs, a module at a time per
worker (the real_vllm tier as one unit, on one worker, from the run's start:
tests.support.scheduling); the call of a test marked `serial` (it asserts timings) runs
while no other test does. Gateway processes run on the container image's Python where it
is installed (tests.support.gateway_python), which the run's header names.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import AsyncIterator, Generator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from sim.stack import SimStack
from tests.support import scheduling, serial
from tests.support.classify_fixtures import Sims, observed
from tests.support.deployment import TILERT_VERSIONS, corruptions, reset
from tests.support.gateway import GatewayProcess
from tests.support.gateway_python import report_header
from tests.support.stacks import StackPool

E2E_DIR = Path(__file__).resolve().parent / "e2e"


def pytest_report_header() -> str:
    """Which Python the gateway's processes run on (tests.support.gateway_python)."""
    return report_header()


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """Half again as many workers as CPUs, unless PYTEST_XDIST_AUTO_NUM_WORKERS says."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own reads it
    return scheduling.worker_count()


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """A module per worker at a time; the real_vllm tier as one, handed out first."""
    return scheduling.make_scheduler(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.is_relative_to(E2E_DIR):
            item.add_marker(pytest.mark.e2e)
    scheduling.in_handout_order(items)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker tells the controller how long its tests waited for their turn."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["waited_s"] = dict(serial.WAITED_S)
        workeroutput["long_waits"] = list(serial.LONG_WAITS)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """(xdist's controller) A worker's waits, added up for the summary."""
    output = getattr(node, "workeroutput", {})
    for kind, seconds in output.get("waited_s", {}).items():
        WAITED_S[kind] = WAITED_S.get(kind, 0.0) + seconds
    LONG_WAITS.extend((seconds, test) for seconds, test in output.get("long_waits", []))


WAITED_S: dict[str, float] = {}  # the controller's sum of the workers' waits
LONG_WAITS: list[tuple[float, str]] = []  # and their longest


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How long the workers' tests waited for a turn: a `serial` test waits for the tests
    running beside it to end, and the others for the `serial` one; each a worker idle."""
    if WAITED_S:
        terminalreporter.write_line(
            f"waiting for a turn: serial tests {WAITED_S.get('serial', 0):.0f} s,"
            f" the others {WAITED_S.get('other', 0):.0f} s (worker-seconds idle)"
        )
    for seconds, test in sorted(LONG_WAITS, reverse=True)[:5]:
        terminalreporter.write_line(f"  {seconds:5.1f} s before {test}")


TURN = pytest.StashKey[serial.Turn]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """Outside `e2e` tests (their fixtures included), starting a process is an error.
    A `serial` test's call runs while no other test does (see tests.support.serial)."""
    is_serial = item.get_closest_marker("serial") is not None
    with serial.Turn(item.nodeid, serial=is_serial) as turn:
        item.stash[TURN] = turn
        if item.get_closest_marker("e2e") is not None:
            return (yield)
        with processes_refused(item.nodeid):
            return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    """A `serial` test's fixtures are set up beside the other workers' tests; its call
    waits for the run alone."""
    item.stash[TURN].call()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """A `serial` test's teardown (stopping its processes, a module's at its last test)
    runs beside the other workers' tests: they no longer wait for it."""
    item.stash[TURN].teardown()


class UnmarkedProcessError(AssertionError):
    """A test without the `e2e` marker tried to start a process."""


@contextmanager
def processes_refused(nodeid: str) -> Iterator[None]:
    original = subprocess.Popen.__init__

    def refuse(popen: subprocess.Popen[Any], args: Any, *more: Any, **options: Any) -> None:
        raise UnmarkedProcessError(
            f"{nodeid} starts a process ({args!r}) without the e2e marker: "
            "mark it (or its module: `pytestmark = pytest.mark.e2e`)"
        )

    subprocess.Popen.__init__ = refuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = original  # type: ignore[method-assign]


# End-to-end fixtures. They work over two fixtures each module defines: `stack`, its
# SimStack (most from `sim_stacks`), and `gateway`, its GatewayProcess (from
# tests.support.gateway.start_gateway).


@pytest.fixture(scope="session")
def sim_stacks() -> Iterator[StackPool]:
    """The run's simulated stacks, one per shape, shared by the modules asking for it."""
    pool = StackPool()
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def fresh_sims(stack: SimStack) -> Iterator[None]:
    """Before the test: faults cleared and records emptied on every simulator of `stack`.
    After it: no node's receive buffer was written while it held another transfer."""
    reset(stack)
    yield
    assert corruptions(stack) == []


@pytest.fixture(scope="module", params=TILERT_VERSIONS)
def tilert_version(request: pytest.FixtureRequest) -> str:
    """The TileRT release a module's simulated nodes and prefill servers speak."""
    version: str = request.param
    return version


@pytest.fixture
def all_slots_free(gateway: GatewayProcess) -> Iterator[None]:
    """After the test: the gateway holds no slot, runs no cleanup, has every node in service."""
    yield
    gateway.wait_all_free()


@pytest.fixture
async def sims(stack: SimStack, gateway: GatewayProcess) -> AsyncIterator[Sims]:
    """Clean simulators before the test; after it, every slot free and no node double-booked."""
    async with observed(stack, gateway) as watching:
        yield watching


@pytest.fixture
def client(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    """The OpenAI SDK pointed at the gateway, without retries (every status as sent)."""
    # Plain HTTP: no TLS context to build for each test (see tests.support.http).
    http = openai.DefaultHttpxClient(verify=False)
    with openai.OpenAI(
        base_url=gateway.base_url, api_key="unused", max_retries=0, http_client=http
    ) as sdk:
        yield sdk


@pytest.fixture
async def aclient(gateway: GatewayProcess) -> AsyncIterator[openai.AsyncOpenAI]:
    """The async OpenAI SDK pointed at the gateway, without retries."""
    http = openai.DefaultAsyncHttpxClient(verify=False)
    async with openai.AsyncOpenAI(
        base_url=gateway.base_url, api_key="unused", max_retries=0, http_client=http
    ) as sdk:
        yield sdk
