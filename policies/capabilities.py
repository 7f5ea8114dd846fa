"""What each model's deployment can do, and the cheap bounds on a prompt's token count.

The gateway builds one `Capabilities` from its config at startup (and again on reload);
the matcher and the guard only read it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from policies.features import RequestFeatures


@dataclass(frozen=True, slots=True)
class TokenRange:
    """Inclusive bounds on a prompt's token count; `high` is None when unbounded."""

    low: int
    high: int | None

    @property
    def exact(self) -> bool:
        return self.high == self.low


@dataclass(frozen=True, slots=True)
class TokenBounds:
    """Bounds on the templated prompt's token count from its byte size, for byte-level BPE.

    Upper: every token of a byte-level BPE covers at least one byte of text, so the text
    yields at most `prompt_bytes + prompt_optional_bytes` tokens; the chat template adds
    at most `overhead_tokens` (system preamble, tool-use instructions, generation prompt)
    plus `overhead_tokens_per_item` for each message, content part and tool (role markers,
    separators, JSON indentation). Opaque parts (images, audio) leave it unbounded.

    Lower: no token covers more than `max_bytes_per_token` bytes, so the rendered text
    yields at least `ceil(prompt_bytes / max_bytes_per_token)` tokens. The default, 128, is
    the longest token of the DeepSeek-V3 vocabulary (runs of spaces and dots); compute it
    for another vocabulary with `max_token_bytes`. A smaller value (typical prose is 3-5
    bytes a token) lets more decisions skip the count, at the price of misjudging prompts
    made of long whitespace or punctuation runs.
    """

    max_bytes_per_token: float = 128.0
    overhead_tokens: int = 1024
    overhead_tokens_per_item: int = 32

    def __post_init__(self) -> None:
        if self.max_bytes_per_token < 1:
            raise ValueError("max_bytes_per_token must be at least 1")
        if self.overhead_tokens < 0 or self.overhead_tokens_per_item < 0:
            raise ValueError("token overheads must not be negative")

    def estimate(self, features: RequestFeatures) -> TokenRange:
        """Bounds on `features`' prompt tokens; exact when `prompt_tokens` is set."""
        if features.prompt_tokens is not None:
            return TokenRange(features.prompt_tokens, features.prompt_tokens)
        low = math.ceil(features.prompt_bytes / self.max_bytes_per_token)
        if features.prompt_opaque:
            return TokenRange(low, None)
        high = (
            features.prompt_bytes
            + features.prompt_optional_bytes
            + self.overhead_tokens
            + self.overhead_tokens_per_item * features.prompt_items
        )
        return TokenRange(low, high)


def max_token_bytes(vocab: Iterable[str], added_tokens: Iterable[str] = ()) -> int:
    """The longest token, in bytes, of a byte-level BPE vocabulary.

    `vocab` holds the byte-level token strings (one character per byte, as in a
    `tokenizer.json` model vocabulary); `added_tokens` holds special and added tokens as
    plain text, which a prompt may contain literally.
    """
    longest = max((len(token) for token in vocab), default=1)
    added = max((len(token.encode("utf-8")) for token in added_tokens), default=1)
    return max(longest, added)


@dataclass(frozen=True, slots=True)
class ModelCapabilities:
    """The paths one served model has, its TileRT pool's context limit and features.

    `max_seq_len` bounds prompt plus completion tokens on the latency path (None: no
    limit known). `bounds` overrides the deployment-wide token bounds for this model's
    tokenizer.
    """

    has_latency_pool: bool
    has_throughput: bool
    max_seq_len: int | None = None
    bounds: TokenBounds | None = None
    latency_features: frozenset[str] = frozenset()
    """What every TileRT node of the pool supports beyond plain decoding, as they report it:
    `logprobs`, `grammar`, `penalties`, `ignore_eos`."""


NO_PATHS = ModelCapabilities(has_latency_pool=False, has_throughput=False)
"""Capabilities of a model the deployment does not serve."""


@dataclass(frozen=True, slots=True)
class Capabilities:
    """Per-model capabilities of the deployment behind the gateway, keyed by served name."""

    models: Mapping[str, ModelCapabilities] = field(default_factory=dict)
    bounds: TokenBounds = field(default_factory=TokenBounds)

    def for_model(self, model: str) -> ModelCapabilities:
        """The model's capabilities; a model not listed has no path at all."""
        return self.models.get(model, NO_PATHS)

    def bounds_for(self, model: str) -> TokenBounds:
        """The token bounds for the model's tokenizer."""
        own = self.models.get(model, NO_PATHS).bounds
        return own if own is not None else self.bounds
