"""The rooms of `router/` stand on each other in one order: a module imports only from its
own room or from rooms below it (docs/architecture.md draws the same order);
`policies/` imports nothing from `router/`; and neither imports the test equipment
(`sim/`, `bench/`, `demo/`), by an import statement or by name."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Top to bottom; rooms on one line stand side by side and do not import each other.
LAYERS: list[set[str]] = [
    {"cli"},
    {"commands", "preflight"},
    {"process"},
    {"http"},
    {"runtime"},
    {"latency", "throughput"},
    {"serving"},
    {"capacity"},
    {"objectives", "tenants"},
    {"classify"},
    {"node_lifecycle"},
    {"telemetry"},
    {"gate", "upstream", "openai", "tokens", "selection"},
    {"detokenize"},
    {"node"},
    {"config"},
    {"parsers"},
    {"errors", "version"},
]
LEVEL = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}


def room_of(module: str) -> str:
    """`router.gate.redis.leases` -> `gate`; the package's own `__version__` is `version`."""
    room = module.split(".")[1]
    return "version" if room == "__version__" else room


def imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "router":
                found += [f"router.{alias.name}" for alias in node.names]
            else:
                found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
    return found


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_every_room_has_a_place_in_the_order() -> None:
    rooms = {
        room_of(".".join(p.relative_to(ROOT).with_suffix("").parts)) for p in modules("router")
    }
    rooms.discard("__init__")
    assert rooms - LEVEL.keys() == set()


@pytest.mark.parametrize("path", modules("router"), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_import_runs_back_up(path: Path) -> None:
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    own = room_of(module)
    if own == "__init__":
        return
    upward = [
        target
        for target in imports(path)
        if target.startswith("router.") or target == "router"
        if (room := room_of(target)) != own and LEVEL[room] <= LEVEL[own]
    ]
    assert upward == []


@pytest.mark.parametrize("path", modules("policies"), ids=lambda p: str(p.relative_to(ROOT)))
def test_policies_stand_alone(path: Path) -> None:
    assert [t for t in imports(path) if t.split(".")[0] in ("router", "sim")] == []


EQUIPMENT = ("sim", "bench", "demo")


@pytest.mark.parametrize(
    "path", modules("router") + modules("policies"), ids=lambda p: str(p.relative_to(ROOT))
)
def test_the_product_never_imports_the_test_equipment(path: Path) -> None:
    imported = [t for t in imports(path) if t.split(".")[0] in EQUIPMENT]
    named = [
        node.value
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        if node.value.split(".")[0] in EQUIPMENT and node.value.count(".") <= 2
        if node.value.replace(".", "").isidentifier()
    ]
    assert imported == [] and named == []
