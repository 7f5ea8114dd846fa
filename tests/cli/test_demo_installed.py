"""`pd-gateway demo` from an installed wheel, outside the checkout: its configuration comes
from the package. Built from the container image's sources (the Dockerfile's COPY lines),
the gateway says in one line that demo and bench need what the image leaves out."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from demo.plan import plan_stacks
from demo.run import bundled_config
from router.config import load_config
from tests.support.demo import as_a_background_job
from tests.support.gateway_python import gateway_python
from tests.support.processes import process_group

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
USAGE_END = "Ctrl-C stops the gateway and every simulator."
PURELIB = "import sysconfig; print(sysconfig.get_path('purelib'))"
Install = Callable[[list[str]], Path]


def image_sources() -> list[str]:
    """What the Dockerfile copies into the folder it builds the wheel in (not the locks,
    copied elsewhere, nor what a stage takes from another)."""
    sources = []
    for line in (ROOT / "deploy" / "Dockerfile").read_text(encoding="utf-8").splitlines():
        words = line.split()
        if words[:1] == ["COPY"] and "--from=" not in line and not words[-1].startswith("/"):
            sources += words[1:-1]
    return sources


@pytest.fixture(scope="module")
def install(tmp_path_factory: pytest.TempPathFactory) -> Install:
    """A wheel built from a copy of `sources` alone, installed in a venv of its own (the
    dependencies seen from this one's, not the checkout); returns the venv's bin folder."""

    def installed(sources: list[str]) -> Path:
        where = tmp_path_factory.mktemp("wheel")
        (where / "src").mkdir()
        for name in sources:
            if (ROOT / name).is_dir():
                ignore = shutil.ignore_patterns("__pycache__")
                shutil.copytree(ROOT / name, where / "src" / name, ignore=ignore)
            else:
                shutil.copy(ROOT / name, where / "src" / name)
        pip = [gateway_python(), "-m", "pip", "-q", "--disable-pip-version-check"]
        run([*pip, "wheel", "--no-deps", "-w", str(where / "dist"), str(where / "src")])
        run([gateway_python(), "-m", "venv", "--without-pip", str(where / "venv")])
        python = where / "venv" / "bin" / "python"
        # A path in a .pth file: the gateway's venv's dependencies, without its own .pth
        # files (the editable install of the checkout among them).
        dependencies = run([gateway_python(), "-c", PURELIB]).strip()
        Path(run([str(python), "-c", PURELIB]).strip(), "dependencies.pth").write_text(
            dependencies + "\n"
        )
        (wheel,) = (where / "dist").glob("*.whl")
        run([*pip, "--python", str(python), "install", "--no-deps", "--no-index", str(wheel)])
        return python.parent

    return installed


@pytest.fixture(scope="module")
def image(install: Install) -> Path:
    """The gateway as the container image installs it."""
    sources = image_sources()
    assert "router" in sources and not {"sim", "bench", "demo"} & set(sources)
    return install(sources)


def outside() -> dict[str, object]:
    """How a command runs away from the checkout: in another folder, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {"cwd": tempfile.gettempdir(), "env": env}


def run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, **outside())
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_the_bundled_configuration_is_the_repositorys_router_yaml() -> None:
    """The package's copy and the checkout's name the same deployment (their comments and
    the relative path to the test tokenizer aside)."""
    with bundled_config() as path:
        bundled = load_config(path, environ={})
    repository = load_config(ROOT / "router.yaml", environ={})
    exclude = {"base_dir", "source"}
    assert bundled.model_dump(exclude=exclude | {"models"}) == repository.model_dump(
        exclude=exclude | {"models"}
    )
    for ours, theirs in zip(plan_stacks(bundled), plan_stacks(repository), strict=True):
        assert ours.tokenizer == theirs.tokenizer
        assert ours.model.model_dump(exclude={"tokenizer"}) == theirs.model.model_dump(
            exclude={"tokenizer"}
        )


@pytest.fixture(scope="module")
def wheel(install: Install) -> Path:
    """The gateway installed from a wheel of the whole project, outside the checkout."""
    return install(["pyproject.toml", "README.md", "router", "policies", "sim", "bench", "demo"])


def test_the_wheel_runs_from_another_folder(wheel: Path) -> None:
    imported = run([str(wheel / "python"), "-c", "import router, sim; print(router.__file__)"])
    assert not Path(imported.strip()).is_relative_to(ROOT)
    assert "--config" in run([str(wheel / "pd-gateway"), "demo", "--help"])


# A whole demo stack starting beside other tests' load: its start is allowed for.
@pytest.mark.timeout(240)
def test_the_demo_runs_from_a_wheel_in_another_folder(wheel: Path, tmp_path: Path) -> None:
    out = tmp_path / "demo.out"
    with out.open("w") as sink:
        demo = subprocess.Popen(
            [str(wheel / "pd-gateway"), "demo", "--free-ports"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=as_a_background_job,
            **outside(),
        )
    # Stopped or not, nothing of it is left: its group is killed, its children die with it.
    with process_group(demo, sig=signal.SIGKILL):
        deadline = time.monotonic() + 120
        while USAGE_END not in out.read_text() and demo.poll() is None:
            assert time.monotonic() < deadline, out.read_text()[-3000:]
            time.sleep(0.2)
        text = out.read_text()
        assert USAGE_END in text, text[-3000:]
        assert "Base URL: http://127.0.0.1:" in text
        demo.send_signal(signal.SIGINT)
        try:
            code = demo.wait(timeout=60)
        except subprocess.TimeoutExpired:
            raise AssertionError("the demo had not stopped:\n" + out.read_text()[-3000:]) from None
        assert code == 0, out.read_text()[-3000:]


@pytest.mark.parametrize(
    ("command", "needs"),
    [
        (["demo"], "pd-gateway demo needs the demo package"),
        (["bench", "--quick"], "pd-gateway bench needs the bench package"),
    ],
)
def test_the_image_says_what_demo_and_bench_need(
    image: Path, command: list[str], needs: str
) -> None:
    done = subprocess.run(
        [str(image / "pd-gateway"), *command],
        capture_output=True,
        text=True,
        timeout=60,
        **outside(),
    )
    assert done.returncode == 2
    assert done.stderr.startswith(f"error: {needs}, which this installation leaves out")
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
