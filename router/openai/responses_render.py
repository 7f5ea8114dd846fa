"""Renders the decode relay's output in the Responses API's shapes: a `response` object, or
its events.

The message becomes output items in the order the model wrote them: a `reasoning` item for
its reasoning, a `message` item for its text and one `function_call` item per tool call.
While streaming, each item is opened (`response.output_item.added`), grows by deltas and is
closed (`...done` events) when the next kind of output begins or the output ends; the
stream opens with `response.created` and ends with `response.completed`, which carries the
whole response and its usage (`status: "incomplete"` when the token budget ran out, as vLLM
sends it). There is no `[DONE]` marker in this API.

Objects and events have vLLM's fields in vLLM's order (the OpenAI SDK's types as vLLM
serializes them, null fields included).
"""

from __future__ import annotations

import secrets
from typing import Any

import orjson

from router.errors import GatewayError
from router.openai.render import AnswerHead, Logprobs, StopReason, TokenLogprob, Usage
from router.parsers import ParsedDelta, ParsedMessage
from router.parsers.base import ToolCallDelta

_EVENT_END = b"\n\n"


def _item_id(prefix: str) -> str:
    """`msg_`, `rs_`, `fc_` and 16 hex digits, as vLLM 0.32 names items (its `random_uuid`
    is 64 random bits)."""
    return f"{prefix}_{secrets.token_hex(8)}"


class ResponsesRenderer:
    def __init__(self, head: AnswerHead) -> None:
        self._id = "resp_" + head.response_id.removeprefix("chatcmpl-")
        self._facts = head.facts
        self._created = head.created
        self._model = head.model
        self._request = head.client_body
        self._sequence = 0
        self._output: list[dict[str, Any]] = []
        self._open: dict[str, Any] | None = None  # the item being streamed
        self._open_call: int | None = None  # its tool call index, for a function call
        self._status = "completed"

    # Streaming --------------------------------------------------------------------------

    def start(self, usage: Usage | None = None) -> bytes | None:
        created = self._response("in_progress", None)
        return self._emit("response.created", response=created) + self._emit(
            "response.in_progress", response=created
        )

    def delta(
        self, delta: ParsedDelta, usage: Usage | None = None, logprobs: Logprobs = None
    ) -> bytes | None:
        out = bytearray()
        if delta.reasoning:
            out += self._reasoning_delta(delta.reasoning)
        if delta.content:
            out += self._text_delta(delta.content, logprobs)
        elif logprobs and self._open is not None and self._open["type"] == "message":
            # Tokens whose text is still held back: their entries join the message's.
            self._open["content"][0]["logprobs"].extend(_logprobs(logprobs))
        # (Reasoning tokens' logprobs have no place in this API's output.)
        for call in delta.tool_calls:
            out += self._call_delta(call)
        return bytes(out) or None

    def finish(
        self,
        finish_reason: str,
        stop_reason: StopReason,
        usage: Usage | None = None,
        logprobs: Logprobs = None,
    ) -> bytes:
        if logprobs and self._open is not None and self._open["type"] == "message":
            self._open["content"][0]["logprobs"].extend(_logprobs(logprobs))
        self._status = "incomplete" if finish_reason == "length" else "completed"
        return self._close()

    def usage(self, usage: Usage) -> bytes:
        # A cut output ends as vLLM ends it: `response.completed`, its status incomplete.
        return self._emit("response.completed", response=self._response(self._status, usage))

    def error(self, error: GatewayError) -> bytes:
        """After the first event: an `error` event, then the response as failed."""
        closing = self._close()
        failed = self._response("failed", None)
        # The response's error codes are OpenAI's own few; ours rides on the `error` event.
        failed["error"] = {"code": "server_error", "message": error.message}
        head = self._emit("error", code=error.code, message=error.message, param=error.param)
        return closing + head + self._emit("response.failed", response=failed)

    def end(self) -> bytes:
        return b""

    # Whole response ---------------------------------------------------------------------

    def response(
        self,
        message: ParsedMessage,
        finish_reason: str,
        stop_reason: StopReason,
        usage: Usage,
        logprobs: Logprobs = None,
    ) -> dict[str, Any]:
        if message.reasoning:
            item = _reasoning_item(message.reasoning)
            item["status"] = None  # as vLLM leaves a whole answer's reasoning item
            self._output.append(item)
        if message.content or not message.tool_calls:
            item = _message_item(message.content or "", "completed")
            if item["content"]:
                item["content"][0]["logprobs"] = _logprobs(logprobs) if logprobs else None
            self._output.append(item)
        for call in message.tool_calls:
            self._output.append(_call_item(call.id, call.name, call.arguments, "completed"))
        status = "incomplete" if finish_reason == "length" else "completed"
        return self._response(status, usage)

    # Items ------------------------------------------------------------------------------

    def _reasoning_delta(self, text: str) -> bytes:
        out = b""
        item = self._open
        if item is None or item["type"] != "reasoning":
            out = self._close()
            item = self._add(_reasoning_item(""))
            out += self._added(item) + self._part_event("added", item, _reasoning_part(""))
        item["content"][0]["text"] += text
        return out + self._emit(
            "response.reasoning_text.delta", **self._at(item), content_index=0, delta=text
        )

    def _text_delta(self, text: str, logprobs: Logprobs) -> bytes:
        out = b""
        item = self._open
        if item is None or item["type"] != "message":
            out = self._close()
            item = self._add(_message_item("", "in_progress"))
            out += self._added(item) + self._part_event("added", item, _text_part("", []))
            item["content"] = [_text_part("", [])]
        part = item["content"][0]
        part["text"] += text
        part["logprobs"].extend(_logprobs(logprobs or []))
        return out + self._emit(
            "response.output_text.delta",
            **self._at(item),
            content_index=0,
            delta=text,
            logprobs=_delta_logprobs(logprobs or []),
        )

    def _call_delta(self, call: ToolCallDelta) -> bytes:
        out = b""
        item = self._open
        if item is None or self._open_call != call.index:
            out = self._close()
            call_id = call.id or _item_id("call")
            item = self._add(_call_item(call_id, call.name or "", "", "in_progress"))
            self._open_call = call.index
            out += self._added(item)
        if not call.arguments:
            return out
        item["arguments"] += call.arguments
        return out + self._emit(
            "response.function_call_arguments.delta", **self._at(item), delta=call.arguments
        )

    def _add(self, item: dict[str, Any]) -> dict[str, Any]:
        self._output.append(item)
        self._open = item
        return item

    def _added(self, item: dict[str, Any]) -> bytes:
        # Announced without its part (`response.content_part.added` brings that): a message
        # with no content yet, a reasoning item with none at all, as vLLM announces them.
        shown = item
        if item["type"] == "message":
            shown = {**item, "content": []}
        elif item["type"] == "reasoning":
            shown = {**item, "content": None}
        elif item["type"] == "function_call":
            shown = {**item, "created_by": None}  # the SDK's item type, as vLLM sends it
        return self._emit(
            "response.output_item.added", output_index=len(self._output) - 1, item=shown
        )

    def _close(self) -> bytes:
        """The `...done` events of the open item, if any."""
        item, self._open, self._open_call = self._open, None, None
        if item is None:
            return b""
        at = self._at(item)
        if item["type"] == "function_call":
            out = self._emit(
                "response.function_call_arguments.done",
                **at,
                arguments=item["arguments"],
                after={"name": item["name"]},  # vLLM's field beyond the SDK's type
            )
        elif item["type"] == "reasoning":
            text = item["content"][0]["text"]
            out = self._emit("response.reasoning_text.done", **at, content_index=0, text=text)
            out += self._part_event("done", item, item["content"][0])
        else:
            part = item["content"][0]
            part["logprobs"] = part["logprobs"] or None
            # vLLM's done event carries no logprobs; the part and the item carry them.
            out = self._emit(
                "response.output_text.done", **at, content_index=0, text=part["text"], logprobs=[]
            )
            out += self._part_event("done", item, part)
            if not part["text"]:
                item["content"] = []
        item["status"] = "completed"
        return out + self._emit(
            "response.output_item.done", output_index=at["output_index"], item=item
        )

    def _part_event(self, stage: str, item: dict[str, Any], part: dict[str, Any]) -> bytes:
        return self._emit(
            f"response.content_part.{stage}", **self._at(item), content_index=0, part=part
        )

    def _at(self, item: dict[str, Any]) -> dict[str, Any]:
        return {"item_id": item["id"], "output_index": self._index(item)}

    def _index(self, item: dict[str, Any]) -> int:
        # The open item is the last one; a closed item is looked up only when it closes.
        for index in range(len(self._output) - 1, -1, -1):
            if self._output[index] is item:
                return index
        raise ValueError("not an output item of this response")

    def _emit(self, kind: str, after: dict[str, Any] | None = None, **fields: Any) -> bytes:
        """An event, its fields in the SDK's order (alphabetical); `after`: fields that
        follow them."""
        fields.update(sequence_number=self._sequence, type=kind)
        payload = {key: fields[key] for key in sorted(fields)}
        if after:
            payload.update(after)
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + _EVENT_END

    def _response(self, status: str, usage: Usage | None) -> dict[str, Any]:
        request, facts = self._request, self._facts
        tools = [_listed_tool(tool) for tool in request.get("tools") or []]
        tool_choice = request.get("tool_choice", "auto")
        if not tools and tool_choice in ("auto", "none"):
            tool_choice = "none"  # vLLM's reading of a request without tools
        return {
            "id": self._id,
            "created_at": self._created,
            "incomplete_details": (
                {"reason": "max_output_tokens"} if status == "incomplete" else None
            ),
            "instructions": request.get("instructions"),
            "metadata": request.get("metadata"),
            "model": self._model,
            "object": "response",
            "output": list(self._output),
            "parallel_tool_calls": _given(request.get("parallel_tool_calls"), True),
            # The sampling the output was generated with, as vLLM reports its own.
            "temperature": _given(facts.temperature, _given(request.get("temperature"), 1.0)),
            "tool_choice": tool_choice,
            "tools": tools,
            "top_p": _given(facts.top_p, _given(request.get("top_p"), 1.0)),
            "background": False,
            "max_output_tokens": _given(facts.max_tokens, request.get("max_output_tokens")),
            "max_tool_calls": request.get("max_tool_calls"),
            "previous_response_id": None,
            "prompt": None,
            "reasoning": request.get("reasoning"),
            "service_tier": request.get("service_tier") or "auto",
            "status": status,
            "text": request.get("text"),
            "top_logprobs": request.get("top_logprobs"),
            "truncation": request.get("truncation") or "disabled",
            "usage": _usage(usage) if usage is not None else None,
            "user": request.get("user"),
            "presence_penalty": _given(request.get("presence_penalty"), 0.0),
            "frequency_penalty": _given(request.get("frequency_penalty"), 0.0),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "input_messages": None,
            "output_messages": None,
        }


def _given(value: Any, default: Any) -> Any:
    return default if value is None else value


def failure_event(error: GatewayError) -> bytes:
    """An `error` event for a Responses stream relayed unparsed (the native path, a
    shutdown's cut): its sequence number is not known, so it carries none."""
    payload = {"type": "error", "code": error.code, "message": error.message, "param": error.param}
    return b"event: error\ndata: " + orjson.dumps(payload) + _EVENT_END


def _reasoning_item(text: str) -> dict[str, Any]:
    return {
        "id": _item_id("rs"),
        "summary": [],
        "type": "reasoning",
        "content": [_reasoning_part(text)],
        "encrypted_content": None,
        "status": "completed" if text else "in_progress",
    }


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"text": text, "type": "reasoning_text"}


def _message_item(text: str, status: str) -> dict[str, Any]:
    return {
        "id": _item_id("msg"),
        "content": [_text_part(text, [])] if text else [],
        "role": "assistant",
        "status": status,
        "type": "message",
        "phase": None,
    }


def _text_part(text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
    return {"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}


def _call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "arguments": arguments,
        "call_id": call_id,
        "name": name,
        "type": "function_call",
        "id": _item_id("fc"),
        "async": None,
        "caller": None,
        "namespace": None,
        "status": status,
    }


def _usage(usage: Usage) -> dict[str, Any]:
    return {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": usage.cached_tokens or 0,
            "cache_write_tokens": 0,
            "input_tokens_per_turn": [],
            "cached_tokens_per_turn": [],
        },
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": 0,
            "tool_output_tokens": 0,
            "output_tokens_per_turn": [],
            "tool_output_tokens_per_turn": [],
        },
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


def _logprobs(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    return [
        {
            **_token(entry.token, entry.logprob),
            "top_logprobs": [_token(token, logprob) for token, logprob in entry.top],
        }
        for entry in entries
    ]


def _delta_logprobs(entries: list[TokenLogprob]) -> list[dict[str, Any]]:
    """A delta event's entries: the SDK's delta type has no bytes."""
    return [
        {
            "token": entry.token,
            "logprob": entry.logprob,
            "top_logprobs": [{"token": t, "logprob": lp} for t, lp in entry.top],
        }
        for entry in entries
    ]


def _token(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "bytes": list(token.encode("utf-8")), "logprob": logprob}


# A function tool as a response lists it, every field of the OpenAI type in its order.
_FUNCTION_TOOL_FIELDS = (
    "name",
    "parameters",
    "strict",
    "type",
    "allowed_callers",
    "async",
    "defer_loading",
    "description",
    "output_schema",
)


def _listed_tool(tool: Any) -> Any:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        return tool
    return {field: tool.get(field) for field in _FUNCTION_TOOL_FIELDS}
