"""The outcome of classifying one request, its explanation and the headers it implies."""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.capabilities import TokenRange
from policies.conditions import Condition
from policies.features import RequestFeatures
from policies.guard import RerouteReason
from policies.objectives import Objective, OnMiss, Way
from policies.ruleset import Rule
from policies.types import OnSaturation, Path

ROUTE_HEADER = "x-pd-route"
RULE_HEADER = "x-pd-rule"
REROUTE_HEADER = "x-pd-reroute-reason"
OBJECTIVE_HEADER = "x-pd-objective"
BYTES_PER_TOKEN = 4
"""A prompt's typical size per token, for an estimate where it was not counted."""


@dataclass(frozen=True, slots=True)
class Trace:
    """What the matcher looked at, kept only to explain the decision."""

    features: RequestFeatures
    tokens: TokenRange
    skipped: tuple[tuple[Rule, Condition], ...] = ()
    """Each rule tried before the match, with the first condition that failed."""
    matched: Rule | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """Where a request goes and how the gateway treats it there.

    `path` is final (after client route request and guard); `rule_path` is what the rule
    said. `unavailable` is set (e.g. `no_throughput_path`) when the model has no such
    path: the gateway answers an error instead of routing. `client_route` is the
    `x-pd-route` value the client sent, `client_route_honoured` whether the rule allowed it.
    """

    path: Path
    rule: str
    priority: int
    on_saturation: OnSaturation
    max_queue_wait_ms: int | None
    reroute_reason: RerouteReason | None = None
    unavailable: str | None = None
    rule_path: Path | None = None
    client_route: str | None = None
    client_route_honoured: bool = False
    objective: Objective | None = None
    """The rule's objective, as the client tightened it; None for a fixed path (a rule
    without one, or a client's honoured `x-pd-route`)."""
    ways: tuple[Way, ...] = ()
    """With an objective: the ways it may be served, cheapest first (those the guard and the
    model's paths leave of the rule's)."""
    on_miss: OnMiss = "best"
    trace: Trace | None = field(default=None, compare=False, repr=False)

    def prompt_tokens_estimate(self) -> int:
        """The prompt's length in tokens as classification bounded it: the count where a
        rule needed it, else its size at four bytes a token within the bounds."""
        trace = self.trace
        if trace is None:
            return 0
        tokens = trace.tokens
        if tokens.exact:
            return tokens.low
        guess = max(tokens.low, trace.features.prompt_bytes // BYTES_PER_TOKEN)
        return guess if tokens.high is None else min(tokens.high, guess)

    def response_headers(self) -> dict[str, str]:
        """`x-pd-route`, `x-pd-rule`, when the guard re-routed `x-pd-reroute-reason`, and
        the objective the request is served to (`x-pd-objective`)."""
        headers = {ROUTE_HEADER: self.path, RULE_HEADER: self.rule}
        if self.reroute_reason is not None:
            headers[REROUTE_HEADER] = self.reroute_reason.value
        if self.objective is not None:
            headers[OBJECTIVE_HEADER] = self.objective.describe()
        return headers

    def explain(self) -> str:
        """A few lines saying which rule matched and why, and what the guard did."""
        lines = []
        trace = self.trace
        if trace is not None:
            lines.append(_describe_request(trace.features, trace.tokens))
            for rule, condition in trace.skipped:
                observed = condition.observe(trace.features, trace.tokens)
                lines.append(
                    f"rule {rule.name!r} skipped: {condition.label} = {observed},"
                    f" wanted {condition.describe()}"
                )
            lines.extend(_describe_match(trace))
        if self.objective is not None:
            lines.append(
                f"action: objective {self.objective.describe()}, ways {', '.join(self.ways)},"
                f" on_miss {self.on_miss}, priority {self.priority},"
                f" max_queue_wait_ms {self.max_queue_wait_ms}"
            )
        else:
            lines.append(
                f"action: path {self.rule_path}, priority {self.priority},"
                f" on_saturation {self.on_saturation}, max_queue_wait_ms {self.max_queue_wait_ms}"
            )
        if self.client_route is not None:
            verdict = "honoured" if self.client_route_honoured else "ignored (not allowed)"
            lines.append(f"client route: {ROUTE_HEADER}: {self.client_route!r} {verdict}")
        if self.reroute_reason is not None:
            lines.append(f"guard: re-routed to throughput ({self.reroute_reason.value})")
        else:
            lines.append("guard: passed")
        result = f"result: {self.path}"
        if self.objective is not None:
            result = f"result: the first of {', '.join(self.ways)} predicted to meet the objective"
        if self.unavailable is not None:
            result += f", unavailable ({self.unavailable})"
        lines.append(result)
        return "\n".join(lines)


def _describe_request(features: RequestFeatures, tokens: TokenRange) -> str:
    if tokens.exact:
        size = f"{tokens.low} prompt tokens"
    else:
        high = "?" if tokens.high is None else str(tokens.high)
        size = f"{features.prompt_bytes} prompt bytes ({tokens.low}..{high} tokens)"
    budget = "unset" if features.max_tokens is None else str(features.max_tokens)
    mode = "stream" if features.stream else "no stream"
    return (
        f"request: model {features.model!r}, {features.endpoint}, {mode}, {size},"
        f" max_tokens {budget}"
    )


def _describe_match(trace: Trace) -> list[str]:
    rule = trace.matched
    if rule is None:
        return ["no rule matched: default"]
    conditions: list[Condition] = list(rule.conditions)
    if rule.prompt_tokens is not None:
        conditions.append(rule.prompt_tokens)
    if not conditions:
        return [f"rule {rule.name!r} matched: it has no conditions"]
    lines = [f"rule {rule.name!r} matched:"]
    for condition in conditions:
        observed = condition.observe(trace.features, trace.tokens)
        lines.append(f"  {condition.label} = {observed}, wanted {condition.describe()}")
    return lines
