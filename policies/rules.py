"""The rules file: its schema, validation with errors that name rule and field, loading.

    default: {path: throughput}            # optional; name defaults to "default"
    rules:                                 # ordered, first match wins
      - name: agents
        match: {headers: {x-workload: [agent, voice]}, prompt_tokens: {max: 100000}}
        path: latency
        priority: 10
        on_saturation: spill
        max_queue_wait_ms: 250
        allow_client_route: [throughput]

The file may also be a bare list of rules. See `MatchSpec` for the conditions. A rule may give
an `objective` instead of a `path` (`policies.objectives`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any, TypeVar

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from policies.conditions import (
    Condition,
    EndpointCondition,
    FlagCondition,
    IntRange,
    MaxTokensCondition,
    PromptTokens,
    TextCondition,
    TextMatch,
    read_header,
    read_metadata,
)
from policies.errors import RulesError
from policies.features import RequestFeatures
from policies.objectives import MAX_OBJECTIVE_MS, WAYS, Objective, ObjectiveAction, OnMiss, Way
from policies.operators import EndpointSpec, TextSpec
from policies.ruleset import Action, Rule, RuleSet
from policies.types import OnSaturation, Path

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9a-z-]+$")
_Spec = TypeVar("_Spec", bound="ActionSpec")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class RangeSpec(_Strict):
    """An inclusive integer range; give `min`, `max` or both."""

    min: int | None = Field(default=None, ge=0)
    max: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _check(self) -> RangeSpec:
        if self.min is None and self.max is None:
            raise ValueError("give min, max or both")
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min {self.min} > max {self.max}")
        return self


class MatchSpec(_Strict):
    """Conditions, all optional and ANDed; an empty `match` matches every request.

    `model`, `api_key_name`, `tenant`, `user`, `service_tier`, each header (name → condition)
    and each metadata field take a value, a list of values, or operators `present`,
    `prefix`, `regex`.
    `prompt_tokens` and `max_tokens` take `{min, max}`; `stream` and `tools` a boolean.
    """

    model: TextSpec | None = None
    endpoint: EndpointSpec | None = None
    headers: dict[str, TextSpec] | None = None
    api_key_name: TextSpec | None = None
    user: TextSpec | None = None
    tenant: TextSpec | None = None
    """Who the request is from, as `tenants.identify` names it (docs/tenants.md)."""
    service_tier: TextSpec | None = None
    """OpenAI's `service_tier` as the client sent it (`priority`, `flex`, `auto`, `default`,
    `scale`); a request without one has none (`present: false` matches it)."""
    metadata: dict[str, TextSpec] | None = None
    stream: bool | None = None
    prompt_tokens: RangeSpec | None = None
    max_tokens: RangeSpec | None = None
    tools: bool | None = None

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, value: dict[str, TextMatch] | None) -> dict[str, TextMatch] | None:
        seen: set[str] = set()
        for name in value or {}:
            lower = name.lower()
            if not HEADER_NAME.match(lower):
                raise ValueError(f"{name!r} is not a valid header name")
            if lower in seen:
                raise ValueError(f"{name!r} given twice (header names ignore case)")
            seen.add(lower)
        return value

    def compile(self) -> tuple[tuple[Condition, ...], PromptTokens | None]:
        """The cheap conditions, in file order, and the prompt-length condition."""
        out: list[Condition] = []
        if self.model is not None:
            out.append(TextCondition("model", _read_model, self.model))
        if self.endpoint is not None:
            out.append(EndpointCondition("endpoint", self.endpoint))
        for name, match in (self.headers or {}).items():
            out.append(TextCondition(f"headers.{name.lower()}", read_header(name.lower()), match))
        if self.api_key_name is not None:
            out.append(TextCondition("api_key_name", _read_api_key, self.api_key_name))
        if self.user is not None:
            out.append(TextCondition("user", _read_user, self.user))
        if self.tenant is not None:
            out.append(TextCondition("tenant", _read_tenant, self.tenant))
        if self.service_tier is not None:
            out.append(TextCondition("service_tier", _read_service_tier, self.service_tier))
        for key, match in (self.metadata or {}).items():
            out.append(TextCondition(f"metadata.{key}", read_metadata(key), match))
        if self.stream is not None:
            out.append(FlagCondition("stream", _read_stream, self.stream))
        if self.tools is not None:
            out.append(FlagCondition("tools", _read_tools, self.tools))
        if self.max_tokens is not None:
            out.append(MaxTokensCondition("max_tokens", _range(self.max_tokens)))
        tokens = self.prompt_tokens
        return tuple(out), PromptTokens("prompt_tokens", _range(tokens)) if tokens else None


def _read_model(features: RequestFeatures) -> str | None:
    return features.model


def _read_api_key(features: RequestFeatures) -> str | None:
    return features.api_key_name


def _read_user(features: RequestFeatures) -> str | None:
    return features.user


def _read_tenant(features: RequestFeatures) -> str | None:
    return features.tenant


def _read_service_tier(features: RequestFeatures) -> str | None:
    return features.service_tier


def _read_stream(features: RequestFeatures) -> bool:
    return features.stream


def _read_tools(features: RequestFeatures) -> bool:
    return features.has_tools


def _range(spec: RangeSpec) -> IntRange:
    return IntRange(min=spec.min, max=spec.max)


class ObjectiveSpec(_Strict):
    """Time to first token and mean gap between tokens, in milliseconds (either or both)."""

    ttft_ms: int | None = Field(default=None, gt=0, le=MAX_OBJECTIVE_MS)
    itl_ms: int | None = Field(default=None, gt=0, le=MAX_OBJECTIVE_MS)

    @model_validator(mode="after")
    def _check(self) -> ObjectiveSpec:
        if self.ttft_ms is None and self.itl_ms is None:
            raise ValueError("give ttft_ms, itl_ms or both")
        return self

    def objective(self) -> Objective:
        return Objective(self.ttft_ms, self.itl_ms)


class ActionSpec(_Strict):
    """What a rule decides. See `ruleset.Action` for the meaning of each field; a rule gives
    a `path` or an `objective` (with `ways`, `on_miss`, `allow_client_objective`)."""

    name: str = Field(pattern=NAME_PATTERN)
    path: Path | None = None
    priority: int = 0
    on_saturation: OnSaturation = "queue"
    max_queue_wait_ms: int | None = Field(default=None, ge=0)
    allow_client_route: list[Path] = Field(default_factory=list)
    objective: ObjectiveSpec | None = None
    ways: list[Way] | None = None
    on_miss: OnMiss | None = None
    allow_client_objective: ObjectiveSpec | None = None

    @model_validator(mode="after")
    def _check_objective(self) -> ActionSpec:
        if self.objective is None:
            if self.path is None:
                raise ValueError("give a path or an objective")
            extra = [
                name
                for name in ("ways", "on_miss", "allow_client_objective")
                if getattr(self, name) is not None
            ]
            if extra:
                verb = "needs" if len(extra) == 1 else "need"
                raise ValueError(f"{', '.join(extra)} {verb} an objective")
            return self
        if self.path is not None:
            raise ValueError("give a path or an objective, not both")
        if "on_saturation" in self.model_fields_set:
            raise ValueError("on_saturation does not apply with an objective: on_miss says")
        floor = self.allow_client_objective
        for bound in ("ttft_ms", "itl_ms") if floor is not None else ():
            wanted, tightest = getattr(self.objective, bound), getattr(floor, bound)
            if wanted is not None and tightest is not None and tightest > wanted:
                raise ValueError(
                    f"allow_client_objective.{bound} {tightest} is looser than the"
                    f" objective's {wanted}: a client may only tighten it"
                )
        if self.ways is not None:
            if not self.ways:
                raise ValueError("ways: name at least one way")
            if len(set(self.ways)) != len(self.ways):
                raise ValueError("ways: each way once")
        return self

    def action(self) -> Action:
        objective = None
        path: Path = self.path or "throughput"
        if self.objective is not None:
            ways = tuple(self.ways) if self.ways is not None else WAYS
            floor = self.allow_client_objective
            objective = ObjectiveAction(
                self.objective.objective(),
                ways=ways,
                on_miss=self.on_miss or "best",
                client_floor=floor.objective() if floor is not None else None,
            )
            path = "latency" if "tilert" in ways else "throughput"
        return Action(
            name=self.name,
            path=path,
            priority=self.priority,
            on_saturation=self.on_saturation,
            max_queue_wait_ms=self.max_queue_wait_ms,
            allow_client_route=frozenset(self.allow_client_route),
            objective=objective,
        )


class RuleSpec(ActionSpec):
    """One rule: `match` conditions plus the action."""

    match: MatchSpec = Field(default_factory=MatchSpec)


class DefaultSpec(ActionSpec):
    """The action when no rule matches (the throughput path unless it says otherwise)."""

    name: str = Field(default="default", pattern=NAME_PATTERN)

    @model_validator(mode="before")
    @classmethod
    def _throughput_unless_said(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "path" not in data and "objective" not in data:
            return {**data, "path": "throughput"}
        return data


_TOP_LEVEL = ("rules", "default")


def load_rules(path: str | os.PathLike[str]) -> RuleSet:
    """Read and validate a YAML rules file; `RulesError` names the file, rule and field."""
    source = os.fspath(path)
    try:
        with open(path, encoding="utf-8") as file:
            data = yaml.safe_load(file)
    except OSError as exc:
        raise RulesError([f"cannot read: {exc.strerror or exc}"], source) from None
    except yaml.YAMLError as exc:
        raise RulesError([f"not valid YAML: {exc}"], source) from None
    return parse_rules(data, source=source)


def parse_rules(data: Any, *, source: str | None = None) -> RuleSet:
    """Validate already-parsed rules (a mapping with `rules`/`default`, or a bare list).

    Every problem is reported, each naming the rule (`rule 'name'`, or `rule #n` counting
    from 1 when it has no usable name) and the field.
    """
    if data is None:
        data = {}
    if isinstance(data, list):
        data = {"rules": data}
    if not isinstance(data, Mapping):
        raise RulesError(
            ["expected a mapping with 'rules' and 'default', or a list of rules"], source
        )
    problems = [
        f"unknown field {key!r} (expected rules, default)" for key in data if key not in _TOP_LEVEL
    ]
    raw_rules = data.get("rules") or []
    if not isinstance(raw_rules, list):
        problems.append("rules: expected a list")
        raw_rules = []
    rules: list[Rule] = []
    first_use: dict[str, str] = {}
    for index, raw in enumerate(raw_rules, start=1):
        label = _label(raw, index)
        _check_unique(raw, label, f"rule #{index}", first_use, problems)
        spec = _validate(RuleSpec, raw, label, problems)
        if spec is not None:
            conditions, tokens = spec.match.compile()
            rules.append(Rule(spec.action(), conditions, tokens))
    raw_default = data.get("default") or {}
    default = _validate(DefaultSpec, raw_default, "default", problems)
    if default is not None:
        _check_unique({"name": default.name}, "default", "default", first_use, problems)
    if problems:
        raise RulesError(problems, source)
    assert default is not None
    return RuleSet(rules=tuple(rules), default=default.action())


def _label(raw: Any, index: int) -> str:
    name = raw.get("name") if isinstance(raw, Mapping) else None
    if isinstance(name, str) and re.match(NAME_PATTERN, name):
        return f"rule {name!r}"
    return f"rule #{index}"


def _validate(model: type[_Spec], raw: Any, label: str, problems: list[str]) -> _Spec | None:
    if not isinstance(raw, Mapping):
        problems.append(f"{label}: expected a mapping")
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        details = "; ".join(_describe(error) for error in exc.errors())
        problems.append(f"{label}: {details}")
        return None


def _describe(error: Any) -> str:
    where = ".".join(str(part) for part in error["loc"])
    kind, message = error["type"], error["msg"]
    if kind == "extra_forbidden":
        message = "unknown field"
    elif kind == "missing":
        message = "required"
    elif message.startswith("Value error, "):
        message = message.removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def _check_unique(
    raw: Any, label: str, position: str, first_use: dict[str, str], problems: list[str]
) -> None:
    name = raw.get("name") if isinstance(raw, Mapping) else None
    if not isinstance(name, str):
        return
    if name in first_use:
        problems.append(f"{label}: name: {name!r} is already used by {first_use[name]}")
    else:
        first_use[name] = position
