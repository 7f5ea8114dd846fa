"""Validation of incoming chat and completion bodies (the subset the simulator reads).

Unknown fields are accepted and ignored, as vLLM accepts many extensions; fields the
simulator uses are type-checked so bad input gets a 400 like vLLM's.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sim.vllm.errors import ApiError

Endpoint = Literal["chat", "completions"]


class StreamOptions(BaseModel):
    """``stream_options``."""

    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class GenerationRequest(BaseModel):
    """Fields shared by chat and completion requests."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    kv_transfer_params: dict[str, Any] | None = None

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

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @model_validator(mode="after")
    def _check(self) -> ChatRequest:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs requires logprobs to be true")
        return self

    @property
    def budget(self) -> int | None:
        """The output token budget (``max_completion_tokens`` wins)."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def logprobs_count(self) -> int | None:
        """How many top logprobs to return per token, None for no logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(GenerationRequest):
    """``POST /v1/completions``."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0, le=20)

    @property
    def budget(self) -> int | None:
        """The output token budget (vLLM's default for completions is 16)."""
        return self.max_tokens or 16

    @property
    def logprobs_count(self) -> int | None:
        """How many top logprobs to return per token, None for no logprobs."""
        return self.logprobs


def parse_request(endpoint: Endpoint, body: Any) -> ChatRequest | CompletionRequest:
    """Validate a request body, raising a 400 :class:`ApiError` like vLLM does."""
    if not isinstance(body, dict):
        raise ApiError(400, "request body must be a JSON object")
    model = ChatRequest if endpoint == "chat" else CompletionRequest
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param) from exc
