"""Validation of OpenAI chat, completion and Responses requests, before anything goes upstream.

Only the fields the gateway must understand are modelled; every other field (vLLM
extensions such as `chat_template_kwargs` or `top_k`, future OpenAI fields) passes through
to the backend untouched.

Values are read as vLLM reads them (pydantic's lax mode): `"5"` and `5.0` are the integer
5, `"0"` the number 0, `"false"` and `0` are false; `5.5`, `"abc"` and `"maybe"` are refused
with a 400 naming the field. `validate` writes each value it converted back into the body,
so that classification, the paths and the backend all see what was checked.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from router.errors import InvalidRequest

# Far beyond any context window in service; larger values are a client bug.
MAX_TOKENS_LIMIT = 10_000_000
# OpenAI's (and vLLM's) default completion budget for /v1/completions.
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


class _Open(BaseModel):
    # Infinities and NaN: no JSON number is one, and no field means one as text either.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class StreamOptions(_Open):
    include_usage: bool = False
    continuous_usage_stats: bool = False


# Any role is the chat template's to render (vLLM takes custom roles such as "critic");
# bounded, since classification's per-message overhead is what covers a role's tokens.
MAX_ROLE_CHARS = 32


class ChatMessage(_Open):
    role: Annotated[str, Field(max_length=MAX_ROLE_CHARS)]
    content: str | list[dict[str, Any]] | None = None


class FunctionSpec(_Open):
    name: Annotated[str, Field(min_length=1)]
    parameters: dict[str, Any] | None = None


class Tool(_Open):
    type: Literal["function"]
    function: FunctionSpec


TokenBudget = Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)]
# A completion may ask for no tokens when it echoes its prompt: the prompt is scored (its
# logprobs) and nothing is generated, as evaluation harnesses ask.
EchoBudget = Annotated[int, Field(ge=0, le=MAX_TOKENS_LIMIT)]
Penalty = Annotated[float, Field(ge=-2, le=2)]
ServiceTier = Literal["auto", "default", "flex", "scale", "priority"]
"""OpenAI's `service_tier` values (vLLM 0.32's too)."""
# vLLM's default --max-logprobs; OpenAI allows up to 20 top logprobs too.
MAX_LOGPROBS = 20


class _Generation(_Open):
    model: Annotated[str, Field(min_length=1)]
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: TokenBudget | None = None
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    user: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    # Not the gateway's to apply, but typed here so a malformed one never reaches a backend.
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    seed: Annotated[int, Field(ge=-(2**63), lt=2**64)] | None = None
    min_tokens: Annotated[int, Field(ge=0, le=MAX_TOKENS_LIMIT)] | None = None
    ignore_eos: bool | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100, le=100)]] | None = None
    service_tier: ServiceTier | None = None
    """OpenAI's processing tier, as the client asks for it (a rule may match it)."""

    def check_together(self) -> None:
        """Raise InvalidRequest for fields each valid alone but not together."""

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Usage on every chunk (vLLM's `stream_options.continuous_usage_stats`, which it
        honours only beside `include_usage`)."""
        options = self.stream_options
        return bool(self.include_usage and options and options.continuous_usage_stats)

    @property
    def token_budget(self) -> int | None:
        return self.max_tokens

    @property
    def scores_prompt(self) -> bool:
        """Asks for the prompt's own logprobs, which only the server that computes the
        prompt can give: such a request is never split into prefill and decode legs."""
        return (self.model_extra or {}).get("prompt_logprobs") is not None

    @property
    def parser_tools(self) -> list[dict[str, Any]] | None:
        """The tools the output parser may recognise as calls."""
        return None

    @property
    def requested_tool_choice(self) -> str | dict[str, Any] | None:
        return None

    @property
    def max_tool_calls(self) -> int | None:
        """At most this many tool calls reach the client (None: no limit)."""
        return None


class ChatRequest(_Generation):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: TokenBudget | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    parallel_tool_calls: bool | None = None

    @field_validator("top_logprobs")
    @classmethod
    def _need_logprobs(cls, value: int | None, info: ValidationInfo) -> int | None:
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("needs 'logprobs': true")
        return value

    @property
    def token_budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def parser_tools(self) -> list[dict[str, Any]] | None:
        """None when the client forbade calls: their markup then stays content, as in vLLM."""
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.model_dump() for tool in self.tools]

    @property
    def requested_tool_choice(self) -> str | dict[str, Any] | None:
        return self.tool_choice

    @property
    def max_tool_calls(self) -> int | None:
        # As vLLM: with parallel_tool_calls false only the first call is kept.
        return 1 if self.parallel_tool_calls is False else None


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: EchoBudget | None = None
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: Annotated[int, Field(ge=1, le=128)] | None = None

    def check_together(self) -> None:
        if self.max_tokens == 0 and not self.echo:
            raise InvalidRequest(
                "'max_tokens' must be at least 1; 0 only with 'echo': true, which scores "
                "the prompt without generating",
                param="max_tokens",
            )

    @property
    def token_budget(self) -> int | None:
        return COMPLETIONS_DEFAULT_MAX_TOKENS if self.max_tokens is None else self.max_tokens

    @property
    def scores_prompt(self) -> bool:
        return bool(self.echo and self.logprobs is not None) or super().scores_prompt


class ResponsesRequest(_Open):
    """`POST /v1/responses`. The input items, tools and formats are checked item by item
    when the request is translated to chat (`router.openai.responses_input`)."""

    model: Annotated[str, Field(min_length=1)]
    input: str | list[Any]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: TokenBudget | None = None
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    include: list[str] | None = None
    stream: bool = False
    store: bool | None = None
    background: bool | None = None
    previous_response_id: str | None = None
    text: dict[str, Any] | None = None
    reasoning: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    service_tier: ServiceTier | None = None


Request = ChatRequest | CompletionRequest | ResponsesRequest
R = TypeVar("R", bound=BaseModel)


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    return body


def validate(model: type[R], body: dict[str, Any]) -> R:
    """`body` as the endpoint's request `model`; InvalidRequest names the bad field.

    Each value converted on the way (`"5"` to 5, `"false"` to false) is written back into
    `body`, in place."""
    try:
        parsed = model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = _param(err["loc"], body)
        if err["type"] == "missing":
            raise InvalidRequest(f"'{param}' is required", param=param) from None
        raise InvalidRequest(f"'{param}': {err['msg']}", param=param) from None
    if isinstance(parsed, _Generation):
        parsed.check_together()
    _write_back(parsed, body)
    return parsed


def _write_back(parsed: BaseModel, raw: dict[str, Any]) -> None:
    for name in parsed.model_fields_set:
        if name in raw:
            raw[name] = _as_checked(getattr(parsed, name), raw[name])


def _as_checked(value: Any, raw: Any) -> Any:
    """`raw` with every number or boolean that validation converted replaced by the
    converted value; the rest of `raw` (unmodelled fields included) is kept as sent."""
    if isinstance(value, BaseModel):
        if isinstance(raw, dict):
            _write_back(value, raw)
        return raw
    if isinstance(value, list) and isinstance(raw, list) and len(value) == len(raw):
        for i, item in enumerate(value):
            raw[i] = _as_checked(item, raw[i])
        return raw
    if isinstance(value, dict) and isinstance(raw, dict):
        for key, item in value.items():
            if key in raw:
                raw[key] = _as_checked(item, raw[key])
        return raw
    if isinstance(value, bool | int | float) and not _same_json_type(value, raw):
        return value
    return raw


def _same_json_type(value: bool | int | float, raw: Any) -> bool:
    # An integer where a float is declared is already a JSON number: kept as sent.
    return type(raw) is type(value) or (type(value) is float and type(raw) is int)


def _param(loc: tuple[int | str, ...], body: Any) -> str:
    """The dotted path to the bad field, without pydantic's union-member tags."""
    parts: list[str] = []
    current = body
    for part in loc:
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and isinstance(part, int) and part < len(current):
            current = current[part]
        elif isinstance(current, dict) and isinstance(part, str):
            parts.append(part)  # a missing field: name it, then stop
            break
        else:
            break
        parts.append(str(part))
    return ".".join(parts)
