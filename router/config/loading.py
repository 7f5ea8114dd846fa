"""Loading `router.yaml`: read the file, apply environment overrides, validate, and
compile the classification rules, so that a configuration that loads can be served."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from policies import Action, RulesError, RuleSet, load_rules, parse_rules
from router.config.environment import apply_environment
from router.config.errors import ConfigError, describe
from router.config.settings import GatewayConfig


def parse_config(
    data: Any, *, base_dir: Path = Path("."), source: str = "router.yaml"
) -> GatewayConfig:
    """Validate an already-parsed router.yaml document, its rules included; `source` names
    the file in messages."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    try:
        config = GatewayConfig.model_validate({**data, "base_dir": base_dir, "source": source})
    except ValidationError as exc:
        raise ConfigError(describe(exc, source, data)) from None
    compile_rules(config)
    return config


def compile_rules(config: GatewayConfig) -> RuleSet:
    """The classification rules of `config`; ConfigError names the rule and field."""
    source = config.classification
    try:
        if source.rules_file is not None:
            path = Path(source.rules_file)
            return load_rules(path if path.is_absolute() else config.base_dir / path)
        if source.rules is not None:
            return parse_rules(source.rules, source="classification.rules")
    except RulesError as exc:
        # On one line, as every configuration error (a YAML error spans several).
        where = f"{exc.source}: " if exc.source else ""
        problems = "; ".join(where + " ".join(problem.split()) for problem in exc.problems)
        raise ConfigError(f"{config.source}: classification: {problems}") from None
    return RuleSet(default=Action(name="default", path="latency"))


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> GatewayConfig:
    """The file at `path`, with `PDGW_...` overrides from `environ` (the process's own by
    default) applied before validation."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: {yaml_problem(exc)}") from None
    if isinstance(data, dict):
        data = apply_environment(data, os.environ if environ is None else environ)
    return parse_config(data, base_dir=path.resolve().parent, source=str(path))


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML syntax error on one line, at its line and column in the file."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        problem = exc.problem or exc.context or "not valid YAML"
        return f"line {mark.line + 1}, column {mark.column + 1}: not valid YAML: {problem}"
    return f"not valid YAML: {' '.join(str(exc).split())}"
