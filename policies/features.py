"""What classification looks at: the features of one chat or completions request.

The gateway fills a `RequestFeatures` from the parsed body with `features_from_request`
(cheap: no tokenizer) and, only if `classify()` says it needs it (`PromptTokensRequired`),
sets `prompt_tokens` from a count taken off the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policies.prompt_size import PromptSize, measure_chat, measure_completion
from policies.types import Endpoint

GUIDED_FIELDS: tuple[str, ...] = (
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "structured_outputs",
    "regex",
    "ebnf",
)
"""Body fields (vLLM extensions) that constrain decoding to a grammar."""

SERVER_STATE_FIELDS: tuple[str, ...] = (
    "previous_response_id",
    "conversation",
    "background",
    "store",
    "hosted_tools",
)
"""Responses API fields that need what only vLLM's own server has: a stored response or
conversation, background runs, storing the answer, hosted (non-function) tools."""


@dataclass(slots=True)
class DecodingOptions:
    """The body fields the capability guard inspects, as sent (None when absent).

    Values are kept raw: the guard treats anything other than the field's neutral value as
    a request the latency path cannot honour, so malformed values end up on the throughput
    path, whose server validates them.
    """

    n: Any = None
    best_of: Any = None
    use_beam_search: Any = None
    logprobs: Any = None
    top_logprobs: Any = None
    prompt_logprobs: Any = None
    echo: Any = None
    suffix: Any = None
    logit_bias: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    min_tokens: Any = None
    ignore_eos: Any = None
    guided: tuple[str, ...] = ()
    """Names of the guided-decoding fields present (see `GUIDED_FIELDS`)."""
    response_format: Any = None
    tool_choice: Any = None
    temperature: Any = None
    seed: Any = None
    min_p: Any = None
    bad_words: Any = None
    allowed_token_ids: Any = None
    logprob_token_ids: Any = None
    skip_special_tokens: Any = None
    prompts: int = 1
    """Number of prompts (completions accepts a list; each gets its own choice)."""
    server_state: tuple[str, ...] = ()
    """Names of the Responses fields set that need vLLM's server (see `SERVER_STATE_FIELDS`)."""


@dataclass(slots=True)
class RequestFeatures:
    """Everything the rules and the guard may look at for one request.

    `headers` has lower-cased names. `max_tokens` is the completion budget the client set
    (`max_completion_tokens`, else `max_tokens`), None when unset. `prompt_bytes` is the
    UTF-8 size of the prompt text every template renders; `prompt_optional_bytes`,
    `prompt_items` and `prompt_opaque` refine the cheap token bounds (see
    `capabilities.TokenBounds`). `prompt_tokens` is the templated prompt's token count:
    None until the caller counts it (known at once for completions sent as token ids).
    """

    model: str
    endpoint: Endpoint = "chat"
    headers: Mapping[str, str] = field(default_factory=dict)
    api_key_name: str | None = None
    user: str | None = None
    service_tier: str | None = None
    tenant: str | None = None
    """Who the request is from, as the gateway's `tenants.identify` names it."""
    metadata: Mapping[str, Any] = field(default_factory=dict)
    stream: bool = False
    max_tokens: int | None = None
    has_tools: bool = False
    prompt_bytes: int = 0
    prompt_optional_bytes: int = 0
    prompt_items: int = 1
    prompt_opaque: bool = False
    prompt_tokens: int | None = None
    options: DecodingOptions = field(default_factory=DecodingOptions)


def features_from_request(
    body: Mapping[str, Any],
    *,
    endpoint: Endpoint,
    headers: Mapping[str, str],
    api_key_name: str | None,
    tenant: str | None = None,
) -> RequestFeatures:
    """Extract the features of a parsed request body (a JSON object).

    Costs one pass over the prompt text for its byte length; never tokenizes.
    """
    if endpoint != "completions":
        size = measure_chat(body.get("messages"), body.get("tools"))
        budget = _first_int(body.get("max_completion_tokens"), body.get("max_tokens"))
    else:
        size = measure_completion(body.get("prompt"))
        budget = _first_int(body.get("max_tokens"))
    user = body.get("user")
    service_tier = body.get("service_tier")
    metadata = body.get("metadata")
    return RequestFeatures(
        model=str(body.get("model", "")),
        endpoint=endpoint,
        headers={name.lower(): value for name, value in headers.items()},
        api_key_name=api_key_name,
        user=user if isinstance(user, str) else None,
        service_tier=service_tier if isinstance(service_tier, str) else None,
        tenant=tenant,
        metadata=metadata if isinstance(metadata, Mapping) else {},
        stream=body.get("stream") is True,
        max_tokens=budget,
        has_tools=endpoint != "completions" and bool(body.get("tools")),
        prompt_bytes=size.text_bytes,
        prompt_optional_bytes=size.optional_bytes,
        prompt_items=size.items,
        prompt_opaque=size.opaque,
        prompt_tokens=size.token_ids,
        options=_decoding_options(body, size, endpoint),
    )


def _first_int(*values: Any) -> int | None:
    for value in values:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _decoding_options(
    body: Mapping[str, Any], size: PromptSize, endpoint: Endpoint
) -> DecodingOptions:
    get = body.get
    server_state: tuple[str, ...] = ()
    if endpoint == "responses":
        server_state = tuple(n for n in SERVER_STATE_FIELDS if get(n) not in (None, False, []))
    return DecodingOptions(
        n=get("n"),
        best_of=get("best_of"),
        use_beam_search=get("use_beam_search"),
        logprobs=get("logprobs"),
        top_logprobs=get("top_logprobs"),
        prompt_logprobs=get("prompt_logprobs"),
        echo=get("echo"),
        suffix=get("suffix"),
        logit_bias=get("logit_bias"),
        presence_penalty=get("presence_penalty"),
        frequency_penalty=get("frequency_penalty"),
        repetition_penalty=get("repetition_penalty"),
        min_tokens=get("min_tokens"),
        ignore_eos=get("ignore_eos"),
        guided=tuple(name for name in GUIDED_FIELDS if get(name) is not None),
        response_format=get("response_format"),
        tool_choice=get("tool_choice"),
        temperature=get("temperature"),
        seed=get("seed"),
        min_p=get("min_p"),
        bad_words=get("bad_words"),
        allowed_token_ids=get("allowed_token_ids"),
        logprob_token_ids=get("logprob_token_ids"),
        skip_special_tokens=get("skip_special_tokens"),
        prompts=size.prompts,
        server_state=server_state,
    )
