"""A Responses API request as the chat completions request that asks the same of the model.

The latency path and the classifier work on chat requests; `chat_body` translates what a
Responses request says (instructions, input items, function tools, output format, token
budget) and keeps every other field, as chat passes unknown fields through. What only
vLLM's own Responses server can do (a stored response or conversation, background runs,
storing the answer, hosted tools and their items) is kept under the names the capability
guard looks for (`policies.features.SERVER_STATE_FIELDS`), so such a request is served by
the native path, which receives the client's body unchanged.

Reasoning items of earlier turns are dropped: the chat templates of the served families
leave out past reasoning anyway.
"""

from __future__ import annotations

from typing import Any

from router.errors import InvalidRequest
from router.openai.requests import ResponsesRequest

# Responses fields translated below (or dropped): never copied to the chat body as they are.
_RESPONSES_ONLY = frozenset(
    {
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "max_output_tokens",
        "text",
        "reasoning",
        "include",
        "top_logprobs",
        "store",
        "background",
        "previous_response_id",
        "conversation",
        "prompt",
        "truncation",
        "stream_options",
        "max_tool_calls",
        "prompt_cache_key",
        "safety_identifier",
    }
)

OUTPUT_TEXT_LOGPROBS = "message.output_text.logprobs"
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal"})
_MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})


def chat_body(request: ResponsesRequest, body: dict[str, Any]) -> dict[str, Any]:
    """The chat completions body for the validated Responses `request` (`body` as sent).

    Raises InvalidRequest, naming the field, for input the Responses API does not allow.
    """
    out = {key: value for key, value in body.items() if key not in _RESPONSES_ONLY}
    hosted: list[str] = []
    messages: list[dict[str, Any]] = []
    if request.instructions is not None:
        messages.append({"role": "system", "content": request.instructions})
    if isinstance(request.input, str):
        messages.append({"role": "user", "content": request.input})
    else:
        _add_items(messages, request.input, hosted)
    if not messages:
        raise InvalidRequest("'input' must not be empty", param="input")
    out["messages"] = messages
    if request.tools:
        out["tools"] = _tools(request.tools, hosted)
    if request.tool_choice is not None:
        out["tool_choice"] = _tool_choice(request.tool_choice, hosted)
    if request.max_output_tokens is not None:
        out["max_tokens"] = request.max_output_tokens
    if request.text is not None and (response_format := _response_format(request.text)):
        out["response_format"] = response_format
    if request.reasoning and (effort := request.reasoning.get("effort")) is not None:
        out["reasoning_effort"] = effort
    if OUTPUT_TEXT_LOGPROBS in (request.include or ()) or request.top_logprobs:
        out["logprobs"] = True
        out["top_logprobs"] = request.top_logprobs or 0
    if request.stream:
        out["stream_options"] = {"include_usage": True}  # the final event carries usage
    for name in ("previous_response_id", "conversation", "background", "store"):
        if body.get(name) not in (None, False):
            out[name] = body[name]
    if body.get("prompt") is not None:
        hosted.append("prompt")  # a stored prompt template
    if hosted:
        out["hosted_tools"] = hosted
    return out


def _add_items(messages: list[dict[str, Any]], items: list[Any], hosted: list[str]) -> None:
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"'{where}' must be an object", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {
                "id": _text(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _text(item, "name", where),
                    "arguments": _text(item, "arguments", where),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # one turn: text, then calls
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _text(item, "call_id", where),
                    "content": output if isinstance(output, str) else _parts(output, where),
                }
            )
        elif kind == "reasoning":
            continue
        elif isinstance(kind, str):
            hosted.append(kind)  # an item of a hosted tool, or a reference to a stored one
        else:
            raise InvalidRequest(f"'{where}.type' must be a string", param=f"{where}.type")


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _MESSAGE_ROLES:
        raise InvalidRequest(
            f"'{where}.role' must be one of user, assistant, system, developer",
            param=f"{where}.role",
        )
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    return {"role": role, "content": _parts(content, f"{where}.content")}


def _parts(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        raise InvalidRequest(f"'{where}' must be a string or a list of parts", param=where)
    parts: list[dict[str, Any]] = []
    for index, part in enumerate(content):
        at = f"{where}[{index}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind in _TEXT_PARTS:
            text = part.get("refusal") if kind == "refusal" else part.get("text")
            if not isinstance(text, str):
                raise InvalidRequest(f"'{at}' has no text", param=at)
            parts.append({"type": "text", "text": text})
        elif kind == "input_image" and isinstance(url := part.get("image_url"), str):
            image = {"url": url, **({"detail": part["detail"]} if "detail" in part else {})}
            parts.append({"type": "image_url", "image_url": image})
        else:
            raise InvalidRequest(
                f"'{at}' is not a part the gateway can pass on: text or an image URL", param=at
            )
    return parts


def _tools(tools: list[Any], hosted: list[str]) -> list[dict[str, Any]]:
    functions = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if not isinstance(tool, dict):
            raise InvalidRequest(f"'{where}' must be an object", param=where)
        if tool.get("type") != "function":
            hosted.append(str(tool.get("type")))
            continue
        function: dict[str, Any] = {"name": _text(tool, "name", where)}
        for key in ("description", "parameters", "strict"):
            if tool.get(key) is not None:
                function[key] = tool[key]
        functions.append({"type": "function", "function": function})
    return functions


def _tool_choice(choice: str | dict[str, Any], hosted: list[str]) -> Any:
    if isinstance(choice, str):
        return choice
    if choice.get("type") == "function":
        return {"type": "function", "function": {"name": _text(choice, "name", "tool_choice")}}
    hosted.append(f"tool_choice:{choice.get('type')}")
    return "auto"


def _response_format(text: dict[str, Any]) -> dict[str, Any] | None:
    fmt = text.get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        assert isinstance(fmt, dict)
        schema = {"name": _text(fmt, "name", "text.format"), "schema": fmt.get("schema")}
        for key in ("description", "strict"):
            if fmt.get(key) is not None:
                schema[key] = fmt[key]
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest(
        "'text.format.type' must be text, json_object or json_schema", param="text.format.type"
    )


def _text(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        state = "is required" if value is None else "must be a string"
        raise InvalidRequest(f"'{where}.{key}' {state}", param=f"{where}.{key}")
    return value
