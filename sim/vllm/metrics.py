"""``GET /metrics``: the server's state in Prometheus text, under vLLM 0.32's metric names.

Every sample carries vLLM's labels ``model_name`` (the first served name) and ``engine``
("0": one engine core). The text reads as ``prometheus_client`` writes it: labels sorted
by name, a counter ``<name>`` as the family ``<name>_total`` followed by the gauge
``<name>_created``, values as Go formats floats.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from sim.vllm.load import EngineLoad

FINISHED_REASONS = ("stop", "length", "abort", "error", "repetition")


@dataclass
class ServerCounters:
    """Monotonic counts since the server started (``/sim/reset`` leaves them)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prompt_tokens_cached: int = 0
    request_success: Counter[str] = field(default_factory=Counter)
    created: float = field(default_factory=time.time)


def _labels(pairs: list[tuple[str, str]]) -> str:
    def quote(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{name}="{quote(value)}"' for name, value in sorted(pairs)) + "}"


def _value(value: float) -> str:
    text = repr(float(value))
    digits, _, fraction = text.partition(".")
    if value >= 1e6 and "e" not in text:  # Go writes large floats with an exponent
        mantissa = (digits[0] + "." + digits[1:] + fraction).rstrip("0").rstrip(".")
        return f"{mantissa}e+{len(digits) - 1:02d}"
    return text


def render(model_name: str, load: EngineLoad, counters: ServerCounters) -> str:
    """The exposition text of every metric the simulator keeps."""
    base = [("model_name", model_name), ("engine", "0")]
    labels = _labels(base)
    lines: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"])
        lines.extend(f"{name}{sample_labels} {_value(value)}" for sample_labels, value in samples)

    def gauge(name: str, help_text: str, value: float) -> None:
        family(name, "gauge", help_text, [(labels, value)])

    def counter(name: str, help_text: str, values: list[tuple[str, float]]) -> None:
        family(f"{name}_total", "counter", help_text, values)
        created = [(sample_labels, counters.created) for sample_labels, _ in values]
        family(f"{name}_created", "gauge", help_text, created)

    gauge(
        "vllm:num_requests_running", "Number of requests in model execution batches.", load.running
    )
    gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", load.waiting)
    gauge(
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        load.kv_cache_usage,
    )
    counter(
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        [(labels, counters.prefix_cache_queries)],
    )
    counter(
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        [(labels, counters.prefix_cache_hits)],
    )
    counter(
        "vllm:num_preemptions", "Cumulative number of preemption from the engine.", [(labels, 0)]
    )
    counter(
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        [(labels, counters.prompt_tokens)],
    )
    counter(
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        [(labels, counters.prompt_tokens_cached)],
    )
    counter(
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        [(labels, counters.generation_tokens)],
    )
    counter(
        "vllm:request_success",
        "Count of successfully processed requests.",
        [
            (_labels([*base, ("finished_reason", reason)]), counters.request_success[reason])
            for reason in FINISHED_REASONS
        ],
    )
    return "\n".join(lines) + "\n"
