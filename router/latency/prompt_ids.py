"""A chat prompt as token ids the gateway rendered and encoded itself, for a prefill that
then need not render and tokenize it again (`latency.prefill_input: token_ids`).

vLLM does more to a chat request than render its template: it rebuilds each message from
the fields it knows (content as text, a tool call's JSON `arguments` as an object, the
`reasoning` of an assistant turn under two names), dumps each tool with every field of its
own model, and drops template arguments set to null or "auto". The gateway gives its
template the conversation in that same form. A request whose rendering depends on anything
else (list or media content, a template of the client's, documents, a reasoning effort,
tools left out by `tool_choice: none`, a truncation) gets no ids: it goes as text.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from router.tokens.prompt_tokens import PromptCounter

# Fields of a chat body that change nothing in its rendering, or change it only as the
# gateway's rendering does. Any other field present makes the request go as text.
_RENDERED_ALIKE = frozenset(
    {
        "model",
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "chat_template_kwargs",
        "add_generation_prompt",
        "continue_final_message",
        "add_special_tokens",
        # sampling and output: the prefill's own business, the same whatever the prompt
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "max_tokens",
        "max_completion_tokens",
        "min_tokens",
        "min_completion_tokens",
        "n",
        "seed",
        "stop",
        "stop_token_ids",
        "stream",
        "stream_options",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "ignore_eos",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "include_stop_str_in_output",
        "include_reasoning",
        "response_format",
        "user",
        "priority",
        "cache_salt",
        "request_id",
        "kv_transfer_params",
    }
)
_ROLES = frozenset({"system", "user", "assistant", "tool"})
_MESSAGE_FIELDS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id", "reasoning"})
_TOOL_FIELDS = frozenset({"type", "function"})
_FUNCTION_FIELDS = frozenset({"name", "description", "parameters", "strict"})
_UNSET = (None, "auto")

MAX_PROMPT_CHARS = 1024 * 1024
"""Longer rendered prompts go as text: encoded whole (as vLLM encodes them), a prompt takes
working memory in proportion (a whole 8 MB prompt took over 2 GB)."""
ENCODINGS_AT_ONCE = 2
"""Each encoding holds a tokenizer's working memory and a thread: a few at a time; a request
finding every slot taken goes as text rather than wait."""


class Ineligible(Exception):
    """The request's rendering depends on something the gateway does not render as vLLM."""


def rendered_chat(body: dict[str, Any]) -> dict[str, Any] | None:
    """The chat body as vLLM hands it to the template (messages, tools, template arguments);
    None if the gateway cannot render it exactly."""
    try:
        return _rendered_chat(body)
    except Ineligible:
        return None


def _rendered_chat(body: dict[str, Any]) -> dict[str, Any]:
    _require(all(key in _RENDERED_ALIKE for key in body))
    _require(body.get("add_generation_prompt", True) is True)
    _require(not body.get("continue_final_message") and not body.get("add_special_tokens"))
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise Ineligible
    out: dict[str, Any] = {"messages": [_message(m) for m in messages]}
    tools = body.get("tools")
    if tools is not None:
        # With `none`, a server started with --exclude-tools-when-tool-choice-none leaves
        # the tools out; the gateway cannot know.
        _require(isinstance(tools, list) and body.get("tool_choice") != "none")
        out["tools"] = [_tool(t) for t in tools]
    kwargs = body.get("chat_template_kwargs")
    if kwargs is not None:
        _require(isinstance(kwargs, dict))
        out["chat_template_kwargs"] = {k: v for k, v in kwargs.items() if v not in _UNSET}
    return out


def _require(condition: bool) -> None:
    if not condition:
        raise Ineligible


def _message(message: Any) -> dict[str, Any]:
    _require(isinstance(message, dict) and all(key in _MESSAGE_FIELDS for key in message))
    role, content = message.get("role"), message.get("content")
    _require(role in _ROLES and (content is None or isinstance(content, str)))
    out: dict[str, Any] = {"role": role, "content": content or ""}
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is not None:
            _require(isinstance(calls, list))
            if calls:
                out["tool_calls"] = [_tool_call(c) for c in calls]
        if (reasoning := message.get("reasoning")) is not None:
            _require(isinstance(reasoning, str))
            out["reasoning"] = out["reasoning_content"] = reasoning
    else:
        _require("tool_calls" not in message and "reasoning" not in message)
    if role == "tool" and "tool_call_id" in message:
        out["tool_call_id"] = message["tool_call_id"]
    if isinstance(name := message.get("name"), str):
        out["name"] = name
    return out


def _tool_call(call: Any) -> dict[str, Any]:
    _require(isinstance(call, dict) and call.get("type", "function") == "function")
    function = call.get("function")
    _require(isinstance(function, dict))
    return {**call, "function": {**function, "arguments": _arguments(function.get("arguments"))}}


def _arguments(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as the object templates expect; what is no JSON object (or
    nothing) becomes an empty one, as vLLM coerces it."""
    if not arguments:
        return {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return {}
    return arguments if isinstance(arguments, dict) else {}


def _tool(tool: Any) -> dict[str, Any]:
    _require(isinstance(tool, dict) and all(key in _TOOL_FIELDS for key in tool))
    _require(tool.get("type", "function") == "function")
    function = tool.get("function")
    _require(isinstance(function, dict) and all(key in _FUNCTION_FIELDS for key in function))
    _require(isinstance(function.get("name"), str))
    dumped: dict[str, Any] = {
        "name": function["name"],
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    if function.get("strict") is not None:
        dumped["strict"] = function["strict"]
    return {"type": "function", "function": dumped}


class PromptIds:
    """Renders and encodes chat prompts for one model, a few at a time, in a thread."""

    def __init__(self, counter: PromptCounter) -> None:
        self._counter = counter
        self._encoding = asyncio.Semaphore(ENCODINGS_AT_ONCE)

    @property
    def exact(self) -> bool:
        """Whether the model's own chat template is known (nothing else is ever sent)."""
        return self._counter.has_chat_template

    async def ids(self, body: dict[str, Any]) -> list[int] | None:
        """The chat prompt's ids; None when the request must go as text (not rendered
        exactly, the template refused it, or every encoding slot is taken)."""
        rendered = rendered_chat(body)
        if rendered is None or not self.exact or self._encoding.locked():
            return None
        async with self._encoding:
            return await asyncio.to_thread(self.ids_now, rendered)

    def ids_now(self, rendered: dict[str, Any]) -> list[int] | None:
        """`rendered` (from `rendered_chat`) encoded; None if the template refuses it."""
        ids = self._counter.template_ids(rendered, MAX_PROMPT_CHARS)
        return ids or None
