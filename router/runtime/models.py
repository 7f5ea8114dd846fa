"""One served model at run time: its tokenizer and prompt counter, its TileRT pool, and the
path that serves each routing decision (the latency path wrapped in the spill fallback when
the model also has a throughput path)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from policies.types import Path
from router.capacity import Sizer
from router.config import GateConfig, ModelConfig, SelectionConfig
from router.gate import Gate, make_gate
from router.latency.path import LatencyPath
from router.latency.prompt_ids import PromptIds
from router.latency.protocol import LatencyDeps
from router.latency.sampling import SamplingDefaults
from router.node import configured_nodes
from router.objectives import Timings
from router.selection import (
    AffinityKeys,
    KvEventsHub,
    PathSelection,
    ServerSet,
    Weights,
    sets_of,
)
from router.serving import Fallback, ServePath
from router.serving.objective import ObjectivePath
from router.throughput import make_throughput_path
from router.throughput.continuation import Continuing
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
    objective: ObjectivePath
    """What serves a request whose rule gives an objective."""

    @property
    def timings(self) -> Timings:
        """What the model's servers and nodes have shown of their speed."""
        return self.objective.timings

    @property
    def sizer(self) -> Sizer:
        """How many nodes and servers the model's load needs."""
        sizer = self.objective.sizer
        assert sizer is not None
        return sizer

    @property
    def gate(self) -> Gate | None:
        return self.latency.gate if self.latency is not None else None

    def server_sets(self) -> list[ServerSet]:
        """The vLLM server sets of the model's paths."""
        return sets_of([self.latency, *self.paths.values()])

    async def read_load(self) -> None:
        """One reading of the model's load for its pools' sizing: the TileRT pool's state,
        and which prefill and native decode servers it has, with this process's requests
        in flight on each."""
        if (gate := self.gate) is not None:
            self.sizer.read_pool(await gate.snapshot())
        prefill: dict[str, None] = {}
        decode: dict[str, None] = {}
        outstanding: dict[str, int] = {}
        for servers in self.server_sets():
            roles = servers.name.split(":")  # latency:prefill:<pool>, pull:decode, proxy, ...
            if "prefill" in roles:
                prefill.update(dict.fromkeys(servers.urls))
            elif roles[-1] == "decode":
                decode.update(dict.fromkeys(servers.urls))
                for url, count in servers.outstanding().items():
                    outstanding[url] = outstanding.get(url, 0) + count
        self.sizer.read_servers(prefill=prefill, decode=decode, outstanding=outstanding)

    def adopt_servers(self, before: ModelRuntime) -> None:
        """On a reload that rebuilt the model: each of its server sets takes over what the
        set of the same name in `before` (`latency:prefill:<pool>`, `pull:decode`, ...)
        learned of the servers both name, so a server that stays keeps its health, load
        figures and prefix index; one the reload added starts fresh."""
        replaced = {servers.name: servers for servers in before.server_sets()}
        for servers in self.server_sets():
            if (old := replaced.get(servers.name)) is not None:
                servers.adopt(old)
        self.timings.adopt(before.timings)
        self.sizer.adopt(before.sizer)


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
    throughput = None
    if config.throughput is not None:
        throughput = paths["throughput"] = make_throughput_path(
            config.throughput,
            upstreams=deps.upstreams,
            selection=path_selection(config.selection_of("throughput"), counter, kv_events),
            metrics=deps.metrics,
            continuing=Continuing(
                config.name,
                tokenizer,
                config.output_parser,
                limit=0,  # the mode's own
                upstreams=deps.upstreams,
                metrics=deps.metrics,
                spawn=deps.spawn,
            ),
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
            selection=path_selection(config.selection_of("latency"), counter, kv_events),
            deps=deps,
            default_wait_ms=gate_config.max_queue_wait_ms,
            sampling_defaults=sampling_defaults,
            prompt_ids=PromptIds(counter) if config.latency.prefill_input == "token_ids" else None,
            native=None if throughput is None else throughput.whole,
        )
        paths["latency"] = (
            latency if throughput is None else Fallback(latency, throughput, metrics=deps.metrics)
        )
    vocab_size = tokenizer.tokenizer.get_vocab_size(with_added_tokens=True)
    objective = ObjectivePath(
        Timings(config.objectives),
        latency=paths.get("latency"),
        nodes=latency,
        throughput=throughput,
        native=throughput,
        metrics=deps.metrics,
        sizer=Sizer(config.sizing),
    )
    return ModelRuntime(
        config, tokenizer, counter, MappingProxyType(paths), latency, vocab_size, objective
    )


def path_selection(
    config: SelectionConfig, counter: PromptCounter, kv_events: KvEventsHub | None = None
) -> PathSelection:
    keys = AffinityKeys(
        counter.ids_now if config.prefix_affinity else None,
        block_size=config.block_size,
        session_header=config.session_header,
        kv_events=kv_events if config.prefix_index == "kv_events" else None,
    )
    return PathSelection(keys, Weights(**config.weights.model_dump()))
