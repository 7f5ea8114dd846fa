"""The capability guard: after the rules, send to throughput what the latency path cannot honour.

The latency path is a single-slot TileRT decode of one sequence; a request asking for
anything its nodes cannot do (several choices, a seed, most penalties, ...) would be
answered unfaithfully there, so it goes to the throughput path whatever the rule said, and
the reason is recorded. Some fields are honoured when every node of the pool reports the
feature (TileRT 0.1.6's `/capabilities`): logprobs, JSON response formats, the repetition
and presence penalties, `ignore_eos`.
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
    SEED = "seed"
    """A seed with sampling: the node's sampler cannot be seeded per request (greedy is fine)."""
    MIN_P = "min_p"
    BAD_WORDS = "bad_words"
    ALLOWED_TOKEN_IDS = "allowed_token_ids"
    LOGPROB_TOKEN_IDS = "logprob_token_ids"
    SKIP_SPECIAL_TOKENS = "skip_special_tokens"
    REGEX = "regex"
    EBNF = "ebnf"
    PROMPT = "prompt"
    """A completions call with several prompts (one choice each)."""
    PREVIOUS_RESPONSE_ID = "previous_response_id"
    CONVERSATION = "conversation"
    BACKGROUND = "background"
    STORE = "store"
    HOSTED_TOOLS = "hosted_tools"
    """A Responses request with tools or input items other than functions (web search, MCP,
    ...): only vLLM's own server runs them."""
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


LATENCY_TOP_LOGPROBS_MAX = 5
"""The most top candidates per token a TileRT node returns."""

GREEDY_TEMPERATURE = 1e-5
"""Below this temperature TileRT decodes greedily (and a seed changes nothing)."""


def _output_logprobs(options: DecodingOptions, endpoint: Endpoint) -> bool:
    # Chat takes `logprobs: true`; completions takes `logprobs: <int>`, where 0 still asks
    # for the sampled token's logprob.
    if endpoint != "completions":
        return not _neutral(options.logprobs, False)
    return options.logprobs is not None


def _logprobs_within_node_limits(options: DecodingOptions, endpoint: Endpoint) -> bool:
    chat = endpoint != "completions"
    count = options.top_logprobs if chat else options.logprobs
    if chat and not _neutral(options.logprobs, False, True):
        return False
    return count is None or (type(count) is int and 0 <= count <= LATENCY_TOP_LOGPROBS_MAX)


def _json_format(options: DecodingOptions, endpoint: Endpoint) -> bool:
    value = options.response_format
    return isinstance(value, Mapping) and value.get("type") in ("json_object", "json_schema")


def _greedy(options: DecodingOptions) -> bool:
    t = options.temperature
    return isinstance(t, int | float) and not isinstance(t, bool) and t < GREEDY_TEMPERATURE


_OptionCheck = Callable[[DecodingOptions, Endpoint], bool]

_ALWAYS: _OptionCheck = lambda o, e: True  # noqa: E731
_NEVER: _OptionCheck = lambda o, e: False  # noqa: E731

# (reason, asks for it, the node feature that honours it, and within which limits)
_CHECKS: tuple[tuple[RerouteReason, _OptionCheck, str | None, _OptionCheck], ...] = (
    (RerouteReason.N, lambda o, e: not _neutral(o.n, 1), None, _NEVER),
    (RerouteReason.BEST_OF, lambda o, e: not _neutral(o.best_of, 1), None, _NEVER),
    (
        RerouteReason.USE_BEAM_SEARCH,
        lambda o, e: not _neutral(o.use_beam_search, False),
        None,
        _NEVER,
    ),
    (RerouteReason.PROMPT, lambda o, e: o.prompts > 1, None, _NEVER),
    # Before `logprobs`: a request that scores its prompt is named for that, whatever the
    # pool's logprobs support.
    (RerouteReason.PROMPT_LOGPROBS, lambda o, e: o.prompt_logprobs is not None, None, _NEVER),
    (RerouteReason.ECHO, lambda o, e: not _neutral(o.echo, False), None, _NEVER),
    (RerouteReason.LOGPROBS, _output_logprobs, "logprobs", _logprobs_within_node_limits),
    (
        RerouteReason.TOP_LOGPROBS,
        lambda o, e: not _neutral(o.top_logprobs, 0),
        "logprobs",
        _logprobs_within_node_limits,
    ),
    (RerouteReason.SUFFIX, lambda o, e: not _neutral(o.suffix, ""), None, _NEVER),
    (RerouteReason.LOGIT_BIAS, lambda o, e: not _neutral(o.logit_bias, {}), None, _NEVER),
    (
        RerouteReason.PRESENCE_PENALTY,
        lambda o, e: not _neutral(o.presence_penalty, 0, 0.0),
        "penalties",
        _ALWAYS,
    ),
    (
        RerouteReason.FREQUENCY_PENALTY,
        lambda o, e: not _neutral(o.frequency_penalty, 0, 0.0),
        None,
        _NEVER,
    ),
    (
        RerouteReason.REPETITION_PENALTY,
        lambda o, e: not _neutral(o.repetition_penalty, 1, 1.0),
        "penalties",
        _ALWAYS,
    ),
    (RerouteReason.MIN_TOKENS, lambda o, e: not _neutral(o.min_tokens, 0), None, _NEVER),
    (
        RerouteReason.IGNORE_EOS,
        lambda o, e: not _neutral(o.ignore_eos, False),
        "ignore_eos",
        lambda o, e: o.ignore_eos is True,
    ),
    (
        RerouteReason.RESPONSE_FORMAT,
        lambda o, e: not _plain_text_format(o.response_format),
        "grammar",
        _json_format,
    ),
    (
        RerouteReason.TOOL_CHOICE,
        lambda o, e: not _neutral(o.tool_choice, "auto", "none"),
        None,
        _NEVER,
    ),
    (RerouteReason.SEED, lambda o, e: o.seed is not None and not _greedy(o), None, _NEVER),
    (RerouteReason.MIN_P, lambda o, e: not _neutral(o.min_p, 0, 0.0), None, _NEVER),
    (RerouteReason.BAD_WORDS, lambda o, e: not _neutral(o.bad_words, []), None, _NEVER),
    (
        RerouteReason.ALLOWED_TOKEN_IDS,
        lambda o, e: not _neutral(o.allowed_token_ids, []),
        None,
        _NEVER,
    ),
    (
        RerouteReason.LOGPROB_TOKEN_IDS,
        lambda o, e: not _neutral(o.logprob_token_ids, []),
        None,
        _NEVER,
    ),
    (
        RerouteReason.SKIP_SPECIAL_TOKENS,
        lambda o, e: not _neutral(o.skip_special_tokens, True),
        None,
        _NEVER,
    ),
)


def unsupported_option(
    features: RequestFeatures, latency_features: frozenset[str] = frozenset()
) -> RerouteReason | None:
    """The first request field the latency path cannot honour, if any. `latency_features`:
    what every node of the pool reports it supports (see `ModelCapabilities`)."""
    options, endpoint = features.options, features.endpoint
    if options.server_state:
        return RerouteReason(options.server_state[0])
    if options.guided:
        return RerouteReason(options.guided[0])
    for reason, asks_for, feature, honoured in _CHECKS:
        if asks_for(options, endpoint):
            if feature in latency_features and honoured(options, endpoint):
                continue
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
            reason = unsupported_option(features, model.latency_features)
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
