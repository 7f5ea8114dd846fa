"""Everything a configuration decides, built as one `ConfigEpoch` and swapped whole: at
start-up, and on a reload (SIGHUP or `POST /admin/reload`).

A reload builds everything that can fail first (keys, rules, tokenizers): a configuration
that does not load leaves the running epoch untouched. Only then does it touch the
pools, which live on across epochs: a kept model keeps its runtime, a changed one
keeps its pool (its node list updated: new nodes join, removed ones finish their request
and leave) and what its server sets learned of the vLLM servers it still names (their
health, load figures and prefix index). Requests in flight hold their own epoch's objects
and are unaffected.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from router.classify import Classifier
from router.config import ConfigError, GatewayConfig, ModelConfig, compile_rules
from router.gate import Gate
from router.latency.protocol import LatencyDeps
from router.latency.sampling import SamplingDefaults
from router.node import Node, configured_nodes
from router.runtime.auth import Keys
from router.runtime.models import ModelRuntime, build_model
from router.selection import KvEventsHub, ServerSet
from router.tokens.prompt_tokens import PromptCounter
from router.tokens.tokenizer import LoadedTokenizer, load_tokenizer, tokenizer_path


@dataclass(frozen=True, slots=True)
class ConfigEpoch:
    """One configuration's objects: its rules, keys and models, used together by every
    request that starts while it is current."""

    config: GatewayConfig
    classifier: Classifier
    keys: Keys
    models: Mapping[str, ModelRuntime]

    @property
    def gates(self) -> dict[str, Gate]:
        """Each model's TileRT pool, for the models that have one."""
        return {name: m.gate for name, m in self.models.items() if m.gate is not None}

    def server_sets(self) -> dict[str, list[ServerSet]]:
        """The vLLM server sets of every model's paths."""
        return {name: model.server_sets() for name, model in self.models.items()}


@dataclass(slots=True)
class Changes:
    """What a new epoch did to the pools, for the caller to start or stop probers."""

    new_gates: dict[str, Gate] = field(default_factory=dict)
    dropped_gates: dict[str, Gate] = field(default_factory=dict)
    models: dict[str, str] = field(default_factory=dict)  # name -> added/changed/removed


async def build_epoch(
    config: GatewayConfig,
    deps: LatencyDeps,
    previous: ConfigEpoch | None = None,
    *,
    keys: Keys | None = None,
    found: Callable[[str], list[Node]] = lambda model: [],
    kv_events: KvEventsHub | None = None,
) -> tuple[ConfigEpoch, Changes]:
    """Raises ConfigError (before any pool is touched) when `config` cannot be used.
    `keys`: already loaded from `config` (else loaded here); `found`: the nodes discovery
    gave each model's pools, kept in them across a reload."""
    keys = keys if keys is not None else Keys.load(config)
    rules = compile_rules(config)
    old = previous.models if previous is not None else {}
    # One model at a time: transformers' lazy imports are not safe from two threads at once
    # (a chat template's tokenizer class may fail to import).
    loaded = [await _tokenizer(m, config, old.get(m.name)) for m in config.models]
    sampling = {
        m.name: await asyncio.to_thread(_sampling_defaults, m, config) for m in config.models
    }

    changes = Changes()
    models: dict[str, ModelRuntime] = {}
    for model, (tokenizer, counter) in zip(config.models, loaded, strict=True):
        before = old.get(model.name)
        if before is not None and before.config == model and previous is not None:
            if previous.config.gate == config.gate:
                models[model.name] = before
                continue
        gate = before.gate if before is not None and model.latency is not None else None
        if gate is not None and model.latency is not None:
            listed = configured_nodes(model.latency)
            ids = {n.id for n in listed}
            await gate.set_nodes([*listed, *(n for n in found(model.name) if n.id not in ids)])
        runtime = build_model(
            model,
            tokenizer=tokenizer,
            counter=counter,
            gate_config=config.gate,
            deps=deps,
            gate=gate,
            sampling_defaults=sampling[model.name],
            kv_events=kv_events,
        )
        if before is not None:
            runtime.adopt_servers(before)
        models[model.name] = runtime
        changes.models[model.name] = "changed" if before is not None else "added"
        if runtime.gate is not None and runtime.gate is not gate:
            changes.new_gates[model.name] = runtime.gate
        if before is not None and before.gate is not None and runtime.gate is not before.gate:
            changes.dropped_gates[model.name] = before.gate
    for name, before in old.items():
        if name not in models:
            changes.models[name] = "removed"
            if before.gate is not None:
                changes.dropped_gates[name] = before.gate
    counters = {name: m.counter for name, m in models.items()}
    classifier = Classifier(config, rules, counters, deps.facts)
    return ConfigEpoch(config, classifier, keys, models), changes


def _sampling_defaults(model: ModelConfig, config: GatewayConfig) -> SamplingDefaults:
    if model.generation_config is None:
        return SamplingDefaults()
    path = Path(model.generation_config)
    try:
        return SamplingDefaults.from_generation_config(
            path if path.is_absolute() else config.base_dir / path
        )
    except ValueError as exc:
        where = model_field(config.models.index(model), model, "generation_config")
        raise ConfigError(f"{config.source}: {where}: {exc}") from None


def check_tokenizer_files(config: GatewayConfig) -> None:
    """Every model's tokenizer file exists (a quick look, before anything loads);
    ConfigError names the file and field."""
    for i, model in enumerate(config.models):
        _tokenizer_file(config, i, model)


def _tokenizer_file(config: GatewayConfig, index: int, model: ModelConfig) -> Path:
    field = model_field(index, model, "tokenizer")
    try:
        path = tokenizer_path(model.tokenizer, base_dir=config.base_dir)
    except FileNotFoundError as exc:
        raise ConfigError(f"{config.source}: {field}: {exc}") from None
    if not path.is_file():
        raise ConfigError(f"{config.source}: {field}: no tokenizer.json at {path}")
    return path


def model_field(index: int, model: ModelConfig, field: str) -> str:
    """A model's field as the file's reader finds it: `models[0] (ds).tokenizer`."""
    return f"models[{index}] ({model.name}).{field}"


async def _tokenizer(
    model: ModelConfig, config: GatewayConfig, before: ModelRuntime | None
) -> tuple[LoadedTokenizer, PromptCounter]:
    """The model's tokenizer and prompt counter: the running ones if the tokenizer is the
    same, else loaded off the event loop (about a second each). ConfigError names the file
    and field when the tokenizer or the chat template a setting needs cannot be used."""
    if before is not None and before.config.tokenizer == model.tokenizer:
        return before.tokenizer, before.counter
    index = config.models.index(model)
    path = _tokenizer_file(config, index, model)
    try:
        tokenizer = await asyncio.to_thread(
            load_tokenizer, model.tokenizer, base_dir=config.base_dir
        )
        counter = await asyncio.to_thread(PromptCounter, tokenizer, path)
    except Exception as exc:  # any failure of a third-party loader is the file's fault
        where = model_field(index, model, "tokenizer")
        raise ConfigError(
            f"{config.source}: {where}: cannot load {model.tokenizer!r}: {_first_line(exc)}"
        ) from None
    latency = model.latency
    if (
        latency is not None
        and latency.prefill_input == "token_ids"
        and not counter.has_chat_template
    ):
        raise ConfigError(
            f"{config.source}: {model_field(index, model, 'latency.prefill_input')}: token_ids"
            f" needs the model's own chat template, and {path.parent / 'tokenizer_config.json'}"
            " has no chat_template: the gateway's rendering would only approximate vLLM's"
            " (set `tokenizer` to the model's folder, or use text)"
        )
    return tokenizer, counter


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__
