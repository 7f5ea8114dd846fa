"""One served model at run time: its tokenizer and prompt counter, its TileRT pool, and the
path that serves each routing decision (the latency path wrapped in the spill fallback when
the model also has a throughput path)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from policies.types import Path
from router.config import GateConfig, ModelConfig
from router.gate import Gate, make_gate
from router.latency.path import LatencyPath
from router.latency.protocol import LatencyDeps
from router.latency.sampling import SamplingDefaults
from router.node import configured_nodes
from router.selection import AffinityKeys, KvEventsHub
from router.serving import Fallback, ServePath
from router.throughput import make_throughput_path
from router.tokens.prompt_tokens import PromptCounter
from router.tokens.tokenizer import LoadedTokenizer


@dataclass(frozen=True, slots=True)
class ModelRuntime:
    config: ModelConfig
    tokenizer: LoadedTokenizer
    counter: PromptCounter
    paths: Mapping[Path, ServePath]
    """The path serving each decision; a model lacks the paths it has no section for."""
    latency: LatencyPath | None
    vocab_size: int
    """Token ids a request may name: 0 to vocab_size - 1 (asked of the tokenizer once: it
    counts its added tokens on every call)."""

    @property
    def gate(self) -> Gate | None:
        return self.latency.gate if self.latency is not None else None


def build_model(
    config: ModelConfig,
    *,
    tokenizer: LoadedTokenizer,
    counter: PromptCounter,
    gate_config: GateConfig,
    deps: LatencyDeps,
    gate: Gate | None = None,
    sampling_defaults: SamplingDefaults | None = None,
    kv_events: KvEventsHub | None = None,
) -> ModelRuntime:
    """`gate`: the model's pool from before a reload, to keep (a new one otherwise);
    `kv_events`: the servers' KV-cache events, for `selection.prefix_index: kv_events`."""
    paths: dict[Path, ServePath] = {}
    selection = config.selection
    keys = AffinityKeys(
        counter.ids_now if selection.prefix_affinity else None,
        block_size=selection.block_size,
        session_header=selection.session_header,
        kv_events=kv_events if selection.prefix_index == "kv_events" else None,
    )
    throughput = None
    if config.throughput is not None:
        throughput = paths["throughput"] = make_throughput_path(
            config.throughput, upstreams=deps.upstreams, keys=keys
        )
    latency = None
    sampling_defaults = sampling_defaults or SamplingDefaults()
    if config.latency is not None:
        latency = LatencyPath(
            config.name,
            config.latency,
            output_parser=config.output_parser,
            gate=gate
            or make_gate(
                gate_config,
                configured_nodes(config.latency),
                deps.metrics.gate,
                pool_id=config.name,
            ),
            tokenizer=tokenizer,
            keys=keys,
            deps=deps,
            default_wait_ms=gate_config.max_queue_wait_ms,
            sampling_defaults=sampling_defaults,
        )
        paths["latency"] = (
            latency if throughput is None else Fallback(latency, throughput, metrics=deps.metrics)
        )
    vocab_size = tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    return ModelRuntime(config, tokenizer, counter, MappingProxyType(paths), latency, vocab_size)
