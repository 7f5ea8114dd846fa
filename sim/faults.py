"""Fault injection shared by both simulators: named faults, optionally for the next N uses.

Faults given on the command line stay on for the life of the process; faults posted to
``/sim/faults`` may carry ``count`` and are cleared after that many requests they applied to.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

FaultValue = bool | int | float
V = TypeVar("V", bool, int, float)


class FaultError(ValueError):
    """A fault request names an unknown fault or gives a value of the wrong type."""


@dataclass(slots=True)
class _Active:
    value: FaultValue
    remaining: int | None


class FaultBoard:
    """The faults currently armed in one simulator process.

    ``schema`` maps each fault name to its value type (bool, int or float). A false or
    null value disarms a fault. Whoever reads a fault names the type the schema gives it.
    """

    def __init__(self, schema: Mapping[str, type[FaultValue]]) -> None:
        self._schema = schema
        self._active: dict[str, _Active] = {}

    @property
    def names(self) -> tuple[str, ...]:
        """Every fault this board accepts."""
        return tuple(self._schema)

    def arm(self, values: Mapping[str, object], count: object = None) -> None:
        """Arm the given faults, each for ``count`` uses (forever if None)."""
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 1
        ):
            raise FaultError("count must be a positive integer")
        checked = {name: self._check(name, value) for name, value in values.items()}
        for name, value in checked.items():
            if value is None or value is False:
                self._active.pop(name, None)
            else:
                self._active[name] = _Active(value, count)

    def _check(self, name: str, value: object) -> FaultValue | None:
        kind = self._schema.get(name)
        if kind is None:
            raise FaultError(f"unknown fault {name!r}; known: {', '.join(self._schema)}")
        if value is None:
            return None
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
            raise FaultError(f"fault {name!r} takes a {kind.__name__}")
        return value

    def clear(self) -> None:
        """Disarm every fault."""
        self._active.clear()

    def peek(self, name: str, kind: type[V]) -> V | None:
        """The fault's value if armed, without using it up; ``kind`` is its type."""
        active = self._armed(name, kind)
        return None if active is None else self._value(active, kind)

    def take(self, name: str, kind: type[V]) -> V | None:
        """The fault's value if armed (None otherwise), counting one use; ``kind`` is its
        type."""
        active = self._armed(name, kind)
        if active is None:
            return None
        if active.remaining is not None:
            active.remaining -= 1
            if active.remaining <= 0:
                del self._active[name]
        return self._value(active, kind)

    def _armed(self, name: str, kind: type[FaultValue]) -> _Active | None:
        if self._schema.get(name) is not kind:
            raise TypeError(f"fault {name!r} is not a {kind.__name__}")
        return self._active.get(name)

    @staticmethod
    def _value(active: _Active, kind: type[V]) -> V:
        value = active.value
        assert isinstance(value, kind)  # armed values are checked against the schema
        return value

    def snapshot(self) -> dict[str, Any]:
        """Armed faults with their values and remaining uses, for ``GET /sim/faults``."""
        return {
            name: {"value": active.value, "remaining": active.remaining}
            for name, active in self._active.items()
        }
