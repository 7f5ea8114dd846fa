"""The capability guard: after the rules, send to throughput what the latency path cannot honour.

The latency path is a single-slot TileRT decode of one sequence with plain sampling; a
request asking for anything else (several choices, logprobs, penalties, grammars, ...)
would be answered unfaithfully there, so it goes to the throughput path whatever the rule
said, and the reason is recorded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from policies.capabilities import ModelCapabilities, TokenRange
from policies.features import DecodingOptions, RequestFeatures
from policies.types import Endpoint, Path


class RerouteReason(StrEnum):
    """Why the guard moved a request to throughput: the request field the latency path
    cannot honour, or a limit of the deployment. Values are stable (headers, metrics)."""

    NO_LATENCY_POOL = "no_latency_pool"
    N = "n"
    BEST_OF = "best_of"
    USE_BEAM_SEARCH = "use_beam_search"
    LOGPROBS = "logprobs"
    TOP_LOGPROBS = "top_logprobs"
    PROMPT_LOGPROBS = "prompt_logprobs"
    ECHO = "echo"
    SUFFIX = "suffix"
    LOGIT_BIAS = "logit_bias"
    PRESENCE_PENALTY = "presence_penalty"
    FREQUENCY_PENALTY = "frequency_penalty"
    REPETITION_PENALTY = "repetition_penalty"
    MIN_TOKENS = "min_tokens"
    IGNORE_EOS = "ignore_eos"
    GUIDED_JSON = "guided_json"
    GUIDED_REGEX = "guided_regex"
    GUIDED_CHOICE = "guided_choice"
    GUIDED_GRAMMAR = "guided_grammar"
    STRUCTURED_OUTPUTS = "structured_outputs"
    RESPONSE_FORMAT = "response_format"
    TOOL_CHOICE = "tool_choice"
    PROMPT = "prompt"
    """A completions call with several prompts (one choice each)."""
    CONTEXT_LENGTH = "context_length"
    """Prompt tokens plus `max_tokens` exceed the TileRT pool's `max_seq_len`."""


NO_THROUGHPUT_PATH = "no_throughput_path"
"""`GuardResult.unavailable` when the request must go to throughput and the model has none."""


def _neutral(value: Any, *defaults: Any) -> bool:
    # Anything other than absent or a neutral value (including a malformed one) counts as
    # asked for: the throughput server then validates it.
    return value is None or any(type(value) is type(d) and value == d for d in defaults)


def _plain_text_format(value: Any) -> bool:
    return value is None or (isinstance(value, Mapping) and value.get("type") == "text")


def _output_logprobs(options: DecodingOptions, endpoint: Endpoint) -> bool:
    # Chat takes `logprobs: true`; completions takes `logprobs: <int>`, where 0 still asks
    # for the sampled token's logprob.
    if endpoint == "chat":
        return not _neutral(options.logprobs, False)
    return options.logprobs is not None


_OptionCheck = Callable[[DecodingOptions, Endpoint], bool]

_CHECKS: tuple[tuple[RerouteReason, _OptionCheck], ...] = (
    (RerouteReason.N, lambda o, e: not _neutral(o.n, 1)),
    (RerouteReason.BEST_OF, lambda o, e: not _neutral(o.best_of, 1)),
    (RerouteReason.USE_BEAM_SEARCH, lambda o, e: not _neutral(o.use_beam_search, False)),
    (RerouteReason.PROMPT, lambda o, e: o.prompts > 1),
    (RerouteReason.LOGPROBS, _output_logprobs),
    (RerouteReason.TOP_LOGPROBS, lambda o, e: not _neutral(o.top_logprobs, 0)),
    (RerouteReason.PROMPT_LOGPROBS, lambda o, e: o.prompt_logprobs is not None),
    (RerouteReason.ECHO, lambda o, e: not _neutral(o.echo, False)),
    (RerouteReason.SUFFIX, lambda o, e: not _neutral(o.suffix, "")),
    (RerouteReason.LOGIT_BIAS, lambda o, e: not _neutral(o.logit_bias, {})),
    (RerouteReason.PRESENCE_PENALTY, lambda o, e: not _neutral(o.presence_penalty, 0, 0.0)),
    (RerouteReason.FREQUENCY_PENALTY, lambda o, e: not _neutral(o.frequency_penalty, 0, 0.0)),
    (RerouteReason.REPETITION_PENALTY, lambda o, e: not _neutral(o.repetition_penalty, 1, 1.0)),
    (RerouteReason.MIN_TOKENS, lambda o, e: not _neutral(o.min_tokens, 0)),
    (RerouteReason.IGNORE_EOS, lambda o, e: not _neutral(o.ignore_eos, False)),
    (RerouteReason.RESPONSE_FORMAT, lambda o, e: not _plain_text_format(o.response_format)),
    (RerouteReason.TOOL_CHOICE, lambda o, e: not _neutral(o.tool_choice, "auto", "none")),
)


def unsupported_option(features: RequestFeatures) -> RerouteReason | None:
    """The first request field the latency path cannot honour, if any."""
    options = features.options
    if options.guided:
        return RerouteReason(options.guided[0])
    for reason, asks_for in _CHECKS:
        if asks_for(options, features.endpoint):
            return reason
    return None


def exceeds_context(
    features: RequestFeatures, model: ModelCapabilities, tokens: TokenRange
) -> bool | None:
    """Whether prompt plus completion overflow the pool's `max_seq_len`; None if undecided.

    An unset `max_tokens` lets the decode run to the limit, so the prompt must only leave
    room for one token.
    """
    if model.max_seq_len is None:
        return False
    budget = features.max_tokens if features.max_tokens is not None else 1
    if tokens.low + budget > model.max_seq_len:
        return True
    if tokens.high is not None and tokens.high + budget <= model.max_seq_len:
        return False
    return None


@dataclass(frozen=True, slots=True)
class GuardResult:
    """The path after the guard, why it changed, and whether the model has that path."""

    path: Path
    reason: RerouteReason | None = None
    unavailable: str | None = None


def apply_guard(
    path: Path, features: RequestFeatures, model: ModelCapabilities, tokens: TokenRange
) -> GuardResult | None:
    """Check the path the rules chose; None when only the prompt's token count can decide."""
    reason: RerouteReason | None = None
    if path == "latency":
        if not model.has_latency_pool:
            reason = RerouteReason.NO_LATENCY_POOL
        else:
            reason = unsupported_option(features)
        if reason is None:
            overflow = exceeds_context(features, model, tokens)
            if overflow is None:
                return None
            if overflow:
                reason = RerouteReason.CONTEXT_LENGTH
        if reason is None:
            return GuardResult(path="latency")
    unavailable = None if model.has_throughput else NO_THROUGHPUT_PATH
    return GuardResult(path="throughput", reason=reason, unavailable=unavailable)
