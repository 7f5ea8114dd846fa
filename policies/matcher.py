"""Classification: first matching rule, client route request, then the capability guard.

Token counting stays off the gateway's event loop and away from requests that do not
need it: `classify` decides on cheap bounds of the token count (`TokenBounds`) and raises
`PromptTokensRequired` only when they leave the decision open; the caller then counts the
prompt off the loop and classifies again:

    try:
        decision = classify(features, rules, capabilities)
    except PromptTokensRequired:
        features.prompt_tokens = await run_in_thread(count_tokens, ...)
        decision = classify(features, rules, capabilities)

`needs_prompt_tokens` runs the same evaluation and says whether the count is needed,
for callers that want to know without deciding.
"""

from __future__ import annotations

from typing import Literal

from policies.capabilities import Capabilities, TokenRange
from policies.conditions import Condition
from policies.decision import ROUTE_HEADER, Decision, Trace
from policies.errors import PromptTokensRequired
from policies.features import RequestFeatures
from policies.guard import GuardResult, apply_guard
from policies.objectives import Objective, Way
from policies.ruleset import Action, Rule, RuleSet
from policies.types import PATHS, Path


def needs_prompt_tokens(
    features: RequestFeatures, rules: RuleSet, capabilities: Capabilities
) -> bool:
    """Whether deciding requires the prompt's token count, which `features` lacks.

    True only if a rule that could still match before the first decisive match has a
    `prompt_tokens` range the cheap bounds leave undecided, or the guard's context check
    is undecided by them.
    """
    return _decide(features, rules, capabilities) is None


def classify(features: RequestFeatures, rules: RuleSet, capabilities: Capabilities) -> Decision:
    """Decide the path, rule and saturation behaviour of one request.

    Raises `PromptTokensRequired` if the decision depends on a count not given.
    """
    decision = _decide(features, rules, capabilities)
    if decision is None:
        raise PromptTokensRequired(
            f"classifying this request for model {features.model!r} needs its prompt token count"
        )
    return decision


def _decide(
    features: RequestFeatures, rules: RuleSet, capabilities: Capabilities
) -> Decision | None:
    tokens = capabilities.bounds_for(features.model).estimate(features)
    skipped: list[tuple[Rule, Condition]] = []
    matched: Rule | None = None
    for rule in rules.rules:
        outcome = _test(rule, features, tokens)
        if outcome is None:
            return None
        if outcome is True:
            matched = rule
            break
        skipped.append((rule, outcome))
    action = matched.action if matched is not None else rules.default
    requested, honoured = _client_route(features, action)
    path: Path = requested if honoured and requested is not None else action.path
    model = capabilities.for_model(features.model)
    guard = apply_guard(path, features, model, tokens)
    if guard is None:
        return None
    objective: Objective | None = None
    ways: tuple[Way, ...] = ()
    if action.objective is not None and not honoured:
        goal = action.objective
        objective = goal.objective.tightened(features.headers, goal.client_floor)
        ways = _ways_left(goal.ways, guard, has_throughput=model.has_throughput)
        if not ways:  # none of the rule's ways can serve it: where the guard sends it
            objective = None
    return Decision(
        path=guard.path,
        rule=action.name,
        priority=action.priority,
        on_saturation=action.on_saturation,
        max_queue_wait_ms=action.max_queue_wait_ms,
        reroute_reason=guard.reason,
        unavailable=guard.unavailable,
        rule_path=action.path,
        client_route=features.headers.get(ROUTE_HEADER),
        client_route_honoured=honoured,
        objective=objective,
        ways=ways,
        on_miss=action.objective.on_miss if action.objective is not None else "best",
        trace=Trace(features, tokens, tuple(skipped), matched),
    )


def _ways_left(
    ways: tuple[Way, ...], guard: GuardResult, *, has_throughput: bool
) -> tuple[Way, ...]:
    """The rule's ways the request may take: a TileRT node only where the guard kept it on
    the latency path, the native ways only where the model has a throughput path."""
    return tuple(
        way for way in ways if (guard.path == "latency" if way == "tilert" else has_throughput)
    )


def _test(
    rule: Rule, features: RequestFeatures, tokens: TokenRange
) -> Condition | Literal[True] | None:
    """True on a match, the failing condition on a miss, None when only the count decides."""
    # Cheap conditions first: one that fails settles the rule without the count.
    for condition in rule.conditions:
        if not condition.test(features, tokens):
            return condition
    if rule.prompt_tokens is None:
        return True
    held = rule.prompt_tokens.test(features, tokens)
    if held is None:
        return None
    return True if held else rule.prompt_tokens


def _client_route(features: RequestFeatures, action: Action) -> tuple[Path | None, bool]:
    value = features.headers.get(ROUTE_HEADER)
    if value is None:
        return None, False
    wanted = value.strip().lower()
    for path in PATHS:
        if wanted == path:
            return path, path in action.allow_client_route
    return None, False
