"""Validation of incoming chat and completion bodies, refused as vLLM 0.32 refuses them.

Unknown fields are accepted and ignored, as vLLM accepts many extensions. Two kinds of
400: a body that fails the schema (wrong types, a missing field: type ``Bad Request``,
``param`` the field's ``body.…`` path) and a value vLLM refuses (``BadRequestError``,
:func:`check_sampling`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError
from pydantic_core import ErrorDetails

from sim.vllm.errors import ApiError, invalid, schema_error

Endpoint = Literal["chat", "completions"]
MAX_LOGPROBS = 20
GREEDY_TEMPERATURE = 1e-5  # below it vLLM samples greedily


class StreamOptions(BaseModel):
    """``stream_options``."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class TextPart(BaseModel):
    """A content part (only text parts are read)."""

    model_config = ConfigDict(extra="allow")
    type: StrictStr


class Message(BaseModel):
    """One chat message."""

    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: StrictStr | list[TextPart] | None = None


class FunctionDefinition(BaseModel):
    """A tool's ``function``."""

    model_config = ConfigDict(extra="allow")
    name: StrictStr
    description: StrictStr | None = None
    parameters: dict[str, Any] | None = None


class Tool(BaseModel):
    """One entry of ``tools``."""

    model_config = ConfigDict(extra="allow")
    type: Literal["function"] = "function"
    function: FunctionDefinition


class GenerationRequest(BaseModel):
    """Fields shared by chat and completion requests."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = None
    n: int | None = 1
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: StrictBool = False
    return_token_ids: StrictBool | None = None
    kv_transfer_params: dict[str, Any] | None = None

    @property
    def choices(self) -> int:
        """How many choices to answer (``n``)."""
        return self.n or 1

    @property
    def stop_strings(self) -> list[str]:
        """``stop`` as a list of non-empty strings."""
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s for s in stop if s]

    @property
    def include_usage(self) -> bool:
        """Whether a streaming answer ends with a usage chunk."""
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """Whether every streamed chunk carries the running usage."""
        options = self.stream_options
        return bool(self.include_usage and options and options.continuous_usage_stats)

    def sampling(self) -> dict[str, Any] | None:
        """Sampling parameters the TileRT connector forwards (None if all unset)."""
        values = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        values = {k: v for k, v in values.items() if v is not None}
        return values or None


class ChatRequest(GenerationRequest):
    """``POST /v1/chat/completions``."""

    messages: list[Message]
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None

    @property
    def budget(self) -> int | None:
        """The output token budget (``max_completion_tokens`` wins)."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def logprobs_count(self) -> int | None:
        """How many top logprobs to return per token, None for no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def message_dicts(self) -> list[dict[str, Any]]:
        """The messages as plain dicts, as the client sent them but for a missing or null
        content, which vLLM hands the template as empty text."""
        dicts = [m.model_dump(exclude_unset=True) for m in self.messages]
        return [{**d, "content": "" if d.get("content") is None else d["content"]} for d in dicts]

    @property
    def tool_dicts(self) -> list[dict[str, Any]] | None:
        """The tools as vLLM hands them to the chat template: ``type`` and the function's
        ``name``, ``description``, ``parameters`` (``strict`` only when given)."""
        if self.tools is None:
            return None
        dicts = []
        for tool in self.tools:
            function = tool.function
            described: dict[str, Any] = {
                "name": function.name,
                "description": function.description,
                "parameters": function.parameters,
            }
            strict = (function.model_extra or {}).get("strict")
            if strict is not None:
                described["strict"] = strict
            dicts.append({"type": tool.type, "function": described})
        return dicts

    @property
    def auto_tools(self) -> bool:
        """Tools given and the model left to choose (``tool_choice`` unset or ``auto``)."""
        return bool(self.tools) and self.tool_choice in (None, "auto")


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``."""

    prompt: list[Annotated[int, Field(ge=0)]] | list[list[int]] | str | list[str] | None = None
    logprobs: int | None = None
    echo: StrictBool = False
    suffix: StrictStr | None = None

    @property
    def budget(self) -> int | None:
        """The output token budget (vLLM's default for completions is 16)."""
        if self.max_tokens is None:
            return 16
        return max(self.max_tokens, 1)  # echo with max_tokens 0 still runs one step

    @property
    def logprobs_count(self) -> int | None:
        """How many top logprobs to return per token, None for no logprobs."""
        return self.logprobs


_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "constrained-int"}


def _loc(error: ErrorDetails) -> str:
    """``body.<path>`` of an error, without pydantic's union member tags."""
    parts = [str(part) for part in error["loc"]]
    kept = [p for p in parts if p not in _TYPE_TAGS and "[" not in p]
    return ".".join(["body", *kept])


def _schema_failure(exc: ValidationError) -> ApiError:
    errors = exc.errors()
    count = len(errors)
    lines = [
        f"  {{'type': {e['type']!r}, 'loc': {_loc(e)!r}, 'msg': {e['msg']!r}}}" for e in errors
    ]
    noun = "error" if count == 1 else "errors"
    return schema_error(f"{count} validation {noun}:\n" + "\n".join(lines), _loc(errors[0]))


def parse_request(endpoint: Endpoint, body: Any) -> ChatRequest | CompletionRequest:
    """Validate a request body against the schema, raising a 400 :class:`ApiError`."""
    if not isinstance(body, dict):
        message = (
            "1 validation error:\n  {'type': 'model_attributes_type', 'loc': 'body', 'msg': "
            "'Input should be a valid dictionary or object to extract fields from'}"
        )
        raise schema_error(message, "body")
    model = ChatRequest if endpoint == "chat" else CompletionRequest
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise _schema_failure(exc) from exc


def check_sampling(request: ChatRequest | CompletionRequest) -> None:
    """The value checks vLLM makes on a request that passed the schema."""
    if isinstance(request, ChatRequest):
        if request.top_logprobs is not None and not request.logprobs:
            raise invalid(
                "when using `top_logprobs`, `logprobs` must be set to true.", "top_logprobs"
            )
        if request.top_logprobs is not None and request.top_logprobs < 0:
            raise invalid("`top_logprobs` must be a positive value.", "top_logprobs")
        wanted = request.top_logprobs if request.logprobs else None
        budget_name = "max_completion_tokens" if request.max_completion_tokens else "max_tokens"
        budget = request.budget
    else:
        wanted = request.logprobs
        budget_name, budget = "max_tokens", request.max_tokens
        if budget == 0 and request.echo:
            budget = None  # echo with max_tokens 0 answers the prompt alone
    if budget is not None and budget < 1:
        raise invalid(f"{budget_name} must be at least 1, got {budget}.", budget_name, budget)
    if wanted is not None and wanted > MAX_LOGPROBS:
        raise invalid(
            f"Requested sample logprobs of {wanted}, which is greater than max allowed: "
            f"{MAX_LOGPROBS}",
            "logprobs",
            wanted,
        )
    if request.stream_options is not None and not request.stream:
        raise invalid("Stream options can only be defined when `stream=True`.", "stream_options")
    if request.n is not None and request.n < 1:
        raise ApiError(400, f"n must be at least 1, got {request.n}.")
    _check_penalties(request)
    if request.temperature is not None and request.temperature < 0:
        raise invalid(
            f"temperature must be non-negative, got {request.temperature}.",
            "temperature",
            request.temperature,
        )
    if request.temperature is not None and request.temperature > 2:
        raise invalid(
            f"temperature must be in [0, 2], got {request.temperature}.",
            "temperature",
            request.temperature,
        )
    if request.top_p is not None and not 0 < request.top_p <= 1:
        raise invalid(f"top_p must be in (0, 1], got {request.top_p}.", "top_p", request.top_p)
    if request.top_k is not None and request.top_k < -1:  # -1 is vLLM's old "off"
        raise ApiError(400, f"top_k must be 0 (disable), or at least 1, got {request.top_k}.")
    if request.min_p is not None and not 0 <= request.min_p <= 1:
        raise ApiError(400, f"min_p must be in [0, 1], got {request.min_p}.")
    greedy = request.temperature is not None and request.temperature < GREEDY_TEMPERATURE
    if greedy and request.choices > 1:
        raise ApiError(400, f"n must be 1 when using greedy sampling, got {request.choices}.")


def _check_penalties(request: GenerationRequest) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(request, name)
        if value is not None and not -2 <= value <= 2:
            raise ApiError(400, f"{name} must be in [-2, 2], got {value}.")
    repetition = request.repetition_penalty
    if repetition is not None and repetition <= 0:
        raise ApiError(400, f"repetition_penalty must be greater than zero, got {repetition}.")


def check_prompt(request: CompletionRequest) -> None:
    """A completion needs a non-empty prompt; a ``suffix`` is refused, as vLLM refuses it
    for every model but those whose renderer fills in the middle (DeepSeek-V4's), which
    the simulator does not serve."""
    if request.prompt is None or request.prompt in ("", []):
        raise invalid("Either prompt or prompt_embeds must be provided and non-empty.", "prompt")
    if request.suffix is None:
        return
    if request.echo:
        raise ApiError(400, "Echo is unsupported with suffix.", "suffix")
    texts = isinstance(request.prompt, str) or all(isinstance(p, str) for p in request.prompt)
    if texts:
        message = "suffix is only supported for models with FIM completion rendering"
    else:
        message = "suffix requires text prompt input for FIM completion rendering"
    raise ApiError(400, message, "suffix")


def check_stop_token_ids(request: GenerationRequest, vocab_size: int) -> None:
    """Every stop token id must be an id of the model's vocabulary."""
    outside = [t for t in request.stop_token_ids or () if not 0 <= t < vocab_size]
    if outside:
        raise invalid(
            f"token_id(s) {outside} in stop_token_ids contain out-of-vocab token ids. "
            f"Vocabulary size: {vocab_size}",
            "stop_token_ids",
            outside,
        )
