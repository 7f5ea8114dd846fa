"""`pd-gateway demo` leaves nothing behind however it ends: killed outright (SIGKILL, no
teardown runs: every child dies with it, and the next demo removes its temporary
directory) or hung up on (SIGHUP, the terminal closed: the ordinary teardown)."""

from __future__ import annotations

import os
import signal
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from demo.workdirs import remove_stale_dirs
from router.process.server import READY_PREFIX
from tests.cli.test_demo_e2e import CONFIG_PREFIX, START_TIMEOUT_S, USAGE_END
from tests.support.demo import Demo, bindable, ports_of, running_demo
from tests.support.processes import running


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    with running_demo(tmp_path / "demo.err", ready=USAGE_END, timeout_s=START_TIMEOUT_S) as running:
        yield running


def wait_for(condition: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)  # polling processes and ports that go away on their own
    return False


@pytest.mark.timeout(180)
def test_sigkill_takes_every_child_and_the_next_demo_removes_the_directory(demo: Demo) -> None:
    config_file = Path(demo.announced(CONFIG_PREFIX))
    ports = ports_of(str(config_file), demo.announced(READY_PREFIX))
    children = demo.children
    assert len(children) == 8
    assert config_file.parent.name.startswith(f"pd-gateway-demo-{demo.popen.pid}-")

    demo.popen.kill()
    demo.popen.wait(timeout=10)
    assert wait_for(lambda: not [pid for pid in children if running(pid)], 15), [
        pid for pid in children if running(pid)
    ]
    assert wait_for(lambda: all(bindable(port) for port in ports), 15)
    assert config_file.parent.is_dir()  # nobody was left to remove it ...
    assert config_file.parent in remove_stale_dirs(Path(tempfile.gettempdir()))  # ... until now
    assert not config_file.parent.exists()


@pytest.mark.timeout(180)
def test_sighup_stops_everything(demo: Demo) -> None:
    config_file = Path(demo.announced(CONFIG_PREFIX))
    ports = ports_of(str(config_file), demo.announced(READY_PREFIX))
    children = demo.children

    demo.popen.send_signal(signal.SIGHUP)
    assert demo.popen.wait(timeout=60) == 0
    assert not [pid for pid in children if running(pid)]
    assert [port for port in ports if not bindable(port)] == []
    assert not config_file.parent.exists()


def test_stale_directories_of_running_demos_stay(tmp_path: Path) -> None:
    mine = tmp_path / f"pd-gateway-demo-{os.getpid()}-abc"
    gone = tmp_path / "pd-gateway-redis-999999999-abc"  # beyond any pid_max
    other = tmp_path / "unrelated-999999999-abc"
    for folder in (mine, gone, other):
        folder.mkdir()
    assert remove_stale_dirs(tmp_path) == [gone]
    assert mine.is_dir() and other.is_dir()
