"""The sampling settings a latency request decodes with, made explicit for both legs.

The prefill (vLLM) samples the first token and the node samples the rest; left to their own
defaults they disagree (vLLM: top_p 1 and no top-k, or the model's generation_config.json;
TileRT 0.1.5: top_p 0.95 and top-k 256; 0.1.6: top_p 1 and no top-k). So every request
names temperature, top_p and top_k to both, resolved from the client's values, else the
model's `generation_config.json` when configured, else vLLM's defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from router.openai.requests import ChatRequest, CompletionRequest

NODE_TOP_K_OFF = 256
"""No top-k on the node: TileRT's sampler pool is 256 wide (0.1.6 reads any value outside
1..255 as off; 0.1.5 applies it as the whole pool)."""
VLLM_TOP_K_OFF = -1


@dataclass(frozen=True, slots=True)
class SamplingDefaults:
    """Used for what a request leaves unset. `top_k` None: off."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None

    @classmethod
    def from_generation_config(cls, path: Path) -> SamplingDefaults:
        """From a model's `generation_config.json` (a file, or a directory holding one);
        keys it lacks keep vLLM's defaults. Raises ValueError if it cannot be read."""
        file = path / "generation_config.json" if path.is_dir() else path
        try:
            data = orjson.loads(file.read_bytes())
        except (OSError, orjson.JSONDecodeError) as exc:
            raise ValueError(f"cannot read {file}: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError(f"{file} is not a JSON object")
        base = cls()
        return cls(
            temperature=float(data.get("temperature", base.temperature)),
            top_p=float(data.get("top_p", base.top_p)),
            top_k=_top_k(data.get("top_k")),
        )


def _top_k(value: Any) -> int | None:
    """-1, 0 and absent all mean off."""
    return value if isinstance(value, int) and value > 0 else None


@dataclass(frozen=True, slots=True)
class Sampling:
    temperature: float
    top_p: float
    top_k: int | None

    def for_prefill(self) -> dict[str, Any]:
        top_k = VLLM_TOP_K_OFF if self.top_k is None else self.top_k
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": top_k}

    def for_node(self) -> dict[str, Any]:
        top_k = self.top_k if self.top_k is not None and self.top_k < NODE_TOP_K_OFF else None
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": NODE_TOP_K_OFF if top_k is None else top_k,
        }


def resolve(parsed: ChatRequest | CompletionRequest, defaults: SamplingDefaults) -> Sampling:
    return Sampling(
        temperature=defaults.temperature if parsed.temperature is None else parsed.temperature,
        top_p=defaults.top_p if parsed.top_p is None else parsed.top_p,
        top_k=defaults.top_k if parsed.top_k is None else _top_k(parsed.top_k),
    )


# Decode-side options the guard lets through only to nodes that report them (0.1.6), sent
# in the node's `sampling` beside the three above.
NODE_OPTIONS = ("repetition_penalty", "presence_penalty", "ignore_eos")


def decode_side_options(parsed: ChatRequest | CompletionRequest) -> dict[str, Any]:
    """The `NODE_OPTIONS` the client set, by the names vLLM and the node both take."""
    return {name: value for name in NODE_OPTIONS if (value := getattr(parsed, name)) is not None}


@dataclass(frozen=True, slots=True)
class DecodeOptions:
    """What a latency request asks of its decode beyond the prompt, resolved once."""

    sampling: Sampling
    node_sampling: dict[str, Any]
    top_logprobs: int | None
    """Logprobs asked for, with this many top candidates per token; None: not asked."""
    grammar_spec: dict[str, Any] | None
    """The node's grammar for `response_format` json_object / json_schema."""
    native_options: dict[str, Any]
    """The decode-side options the client set (`NODE_OPTIONS`), for a vLLM server going on
    with the output."""


def decode_options(
    parsed: ChatRequest | CompletionRequest, body: dict[str, Any], defaults: SamplingDefaults
) -> DecodeOptions:
    sampling = resolve(parsed, defaults)
    native_options = decode_side_options(parsed)
    return DecodeOptions(
        sampling=sampling,
        node_sampling={**sampling.for_node(), **native_options},
        top_logprobs=_top_logprobs(parsed),
        grammar_spec=grammar_spec(body.get("response_format")),
        native_options=native_options,
    )


def _top_logprobs(parsed: ChatRequest | CompletionRequest) -> int | None:
    if isinstance(parsed, ChatRequest):
        return (parsed.top_logprobs or 0) if parsed.logprobs else None
    return parsed.logprobs


def grammar_spec(response_format: Any) -> dict[str, Any] | None:
    """`response_format` as a TileRT 0.1.6 `grammar_spec` (docs/protocols.md §1.6); None for
    plain text (the guard sends other formats to the throughput path)."""
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_object":
        return {"type": "json_object", "value": None}
    if kind == "json_schema":
        # The client's value as sent: a malformed one is the node's to refuse (400
        # invalid_grammar), never an error here.
        json_schema = response_format.get("json_schema")
        schema = json_schema.get("schema") if isinstance(json_schema, dict) else None
        return {"type": "json_schema", "value": schema}
    return None
