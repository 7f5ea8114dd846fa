"""Validated, compiled rules: what `load_rules`/`parse_rules` return and the matcher reads."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.conditions import Condition, PromptTokens
from policies.objectives import ObjectiveAction
from policies.types import OnSaturation, Path


@dataclass(frozen=True, slots=True)
class Action:
    """What a matching rule (or the default) decides.

    `priority`: higher is served first by the TileRT pool's queue. `max_queue_wait_ms`:
    the wait budget for a TileRT slot, None for the gateway's default.
    `allow_client_route`: the paths a client may force with the `x-pd-route` header.
    `objective`: the rule's objective instead of a fixed path (`path` is then the path the
    capability guard checks: `latency` when the objective's ways include a TileRT node).
    """

    name: str
    path: Path
    priority: int = 0
    on_saturation: OnSaturation = "queue"
    max_queue_wait_ms: int | None = None
    allow_client_route: frozenset[Path] = frozenset()
    objective: ObjectiveAction | None = None


@dataclass(frozen=True, slots=True)
class Rule:
    """One ordered rule: all `conditions` and `prompt_tokens` (when set) must hold."""

    action: Action
    conditions: tuple[Condition, ...] = ()
    prompt_tokens: PromptTokens | None = None

    @property
    def name(self) -> str:
        return self.action.name


@dataclass(frozen=True, slots=True)
class RuleSet:
    """Ordered rules, first match wins; `default` decides when none matches."""

    rules: tuple[Rule, ...] = ()
    default: Action = field(default_factory=lambda: Action(name="default", path="throughput"))

    def __post_init__(self) -> None:
        names = [rule.name for rule in self.rules] + [self.default.name]
        if len(set(names)) != len(names):
            raise ValueError("rule names must be unique")
