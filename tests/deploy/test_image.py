"""The container image (deploy/Dockerfile) is reproducible and lean: a pinned base, locked
dependencies installed before the code is copied, a build context of only what it needs,
a final stage of the environment alone, labels and a health check; and the wheel it
installs holds the whole gateway. No Docker here: the Dockerfile is read, the build
context worked out from .dockerignore, and the wheel built as the Dockerfile builds it."""

from __future__ import annotations

import fnmatch
import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.newer_python.install import RELEASE, VENV
from tests.support.locks import BUILD_LOCK, RUNTIME_LOCK, read_lock

pytestmark = pytest.mark.e2e  # git, pip and Python 3.13 run as processes

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CONFIG = "/etc/pd-gateway/router.yaml"


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str


def instructions() -> list[Instruction]:
    """The Dockerfile's instructions, continuation lines joined, comments left out."""
    joined = re.sub(r"\\\n", " ", DOCKERFILE.read_text(encoding="utf-8"))
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, arguments = line.partition(" ")
            found.append(Instruction(keyword.upper(), " ".join(arguments.split())))
    return found


def stages() -> list[list[Instruction]]:
    """The instructions of each stage, its FROM first."""
    split: list[list[Instruction]] = []
    for instruction in instructions():
        if instruction.keyword == "FROM":
            split.append([])
        if split:
            split[-1].append(instruction)
    return split


def position(stage: list[Instruction], keyword: str, needle: str) -> int:
    return next(i for i, s in enumerate(stage) if s.keyword == keyword and needle in s.arguments)


def copied_sources(stage: list[Instruction]) -> list[str]:
    """What the stage's COPY instructions take from the build context."""
    sources = []
    for instruction in stage:
        if instruction.keyword == "COPY" and "--from=" not in instruction.arguments:
            sources += shlex.split(instruction.arguments)[:-1]
    return sources


def build_context() -> list[str]:
    """The repository's files a build from its root sends, as .dockerignore leaves them:
    the last pattern a path (or a folder above it) matches decides, `!` letting it in."""
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    tracked = subprocess.run(  # and new files git does not ignore
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()

    def sent(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
        verdict = True
        for pattern in patterns:
            keep = pattern.startswith("!")
            glob = pattern.lstrip("!").rstrip("/")
            if any(fnmatch.fnmatchcase(prefix, glob) for prefix in prefixes):
                verdict = keep
        return verdict

    return [path for path in tracked if sent(path)]


def test_the_base_image_is_pinned_to_a_patch_release_of_the_tested_python() -> None:
    [default] = [
        s.arguments for s in instructions() if s.keyword == "ARG" and "PYTHON_IMAGE=" in s.arguments
    ]
    image = default.split("=", 1)[1]
    match = re.fullmatch(r"python:(\d+\.\d+)\.\d+-slim-[a-z]+(@sha256:[0-9a-f]{64})?", image)
    assert match, f"{image} is not a patch release of a slim image"
    assert match[1] == RELEASE
    build, final = stages()
    assert build[0].arguments == "${PYTHON_IMAGE} AS build"
    assert final[0].arguments == "${PYTHON_IMAGE}"


def test_the_dependencies_are_installed_from_the_locks_before_the_code_is_copied() -> None:
    build, _ = stages()
    locks = position(build, "COPY", "deploy/requirements.lock")
    assert "deploy/build.lock" in build[locks].arguments
    install = position(build, "RUN", "-r /locks/requirements.lock")
    code = min(position(build, "COPY", name) for name in ("pyproject.toml", "router", "policies"))
    assert locks < install < code
    installs = build[install].arguments
    assert installs.count("--require-hashes --no-deps -r /locks/") == 2
    wheel = position(build, "RUN", "pip wheel")
    assert wheel > code
    assert "--no-build-isolation" in build[wheel].arguments  # the locked tools, no others
    assert "install --no-deps /wheels/" in build[wheel].arguments


def test_the_final_stage_is_the_environment_a_user_a_label_set_and_a_health_check() -> None:
    _, final = stages()
    assert copied_sources(final) == []
    [environment] = [s for s in final if s.keyword == "COPY"]
    assert environment.arguments == "--from=build /opt/pd-gateway /opt/pd-gateway"
    [user] = [s.arguments for s in final if s.keyword == "USER"]
    assert not user.startswith(("0", "root"))
    labels = " ".join(s.arguments for s in final if s.keyword == "LABEL")
    for name in ("title", "description", "version", "revision", "base.name"):
        assert f"org.opencontainers.image.{name}=" in labels
    [version] = [s.arguments for s in final if s.arguments.startswith("VERSION=")]
    assert version == f"VERSION={PYPROJECT['project']['version']}"
    [check] = [s.arguments for s in final if s.keyword == "HEALTHCHECK"]
    assert check.endswith(f'CMD ["pd-gateway", "health", "--config", "{CONFIG}"]')
    [command] = [s.arguments for s in final if s.keyword == "CMD"]
    assert CONFIG in command  # the health check asks the configuration the gateway runs
    # Exec form: the gateway is PID 1 and gets SIGTERM itself (graceful shutdown).
    assert [(s.keyword, s.arguments) for s in final[-2:]] == [
        ("ENTRYPOINT", '["pd-gateway"]'),
        ("CMD", f'["serve", "--config", "{CONFIG}"]'),
    ]


def test_the_build_context_is_what_the_image_copies_and_nothing_else() -> None:
    context = build_context()
    build, _ = stages()
    for source in copied_sources(build):
        assert any(p == source or p.startswith(source.rstrip("/") + "/") for p in context), source
    tops = {path.split("/")[0] for path in context}
    assert tops == {"pyproject.toml", "README.md", "router", "policies", "deploy"}
    assert {p for p in context if p.startswith("deploy/")} == {
        "deploy/requirements.lock",
        "deploy/build.lock",
    }


def test_the_lock_pins_every_dependency_within_its_bounds_with_hashes() -> None:
    pins = read_lock(RUNTIME_LOCK)
    for line in PYPROJECT["project"]["dependencies"]:
        requirement = Requirement(line)
        pin = pins.get(canonicalize_name(requirement.name))
        assert pin is not None, f"{requirement.name} is not in {RUNTIME_LOCK.name}"
        assert requirement.specifier.contains(pin.version, prereleases=True), (line, pin)
    assert all(pin.hashes for pin in pins.values())
    extras = PYPROJECT["project"]["optional-dependencies"]["test"]
    assert "pytest" not in pins and not {
        canonicalize_name(Requirement(e).name) for e in extras
    } <= set(pins)
    tools = read_lock(BUILD_LOCK)
    for line in PYPROJECT["build-system"]["requires"]:
        requirement = Requirement(line)
        pin = tools[canonicalize_name(requirement.name)]
        assert requirement.specifier.contains(pin.version) and pin.hashes


def test_the_wheel_holds_the_whole_gateway(tmp_path: Path) -> None:
    """Built from the build context's copy of the code, as the image builds it."""
    source = tmp_path / "src"
    for path in build_context():
        if not path.startswith("deploy/"):
            (source / path).parent.mkdir(parents=True, exist_ok=True)
            (source / path).write_bytes((ROOT / path).read_bytes())
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path / "wheels"),
            str(source),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = (tmp_path / "wheels").glob("pd_gateway-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        console = archive.read(entry_points).decode()
    code = {p for p in build_context() if p.startswith(("router/", "policies/"))}
    assert code and code <= names, sorted(code - names)
    assert not any(n.startswith(("sim/", "bench/", "demo/", "tests/")) for n in names)
    assert "pd-gateway = router.cli:main" in console


def test_the_python_3_13_environment_runs_the_locked_versions() -> None:
    """The suite runs the gateway on `.venv-3.13`: there, the image's versions."""
    python = VENV / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{VENV} is missing: python -m tests.newer_python.install makes it")
    listing = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.metadata as m\n"
            "for d in m.distributions(): print(d.metadata['Name'], d.version)",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    installed = dict(line.rsplit(" ", 1) for line in listing.splitlines())
    installed = {canonicalize_name(name): version for name, version in installed.items()}
    pins = read_lock(RUNTIME_LOCK)
    differing = {
        name: (pin.version, installed.get(name))
        for name, pin in pins.items()
        if pin.marker is None and installed.get(name) != pin.version
    }
    assert differing == {}
