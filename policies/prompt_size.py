"""Cheap size measures of a prompt, taken without a tokenizer.

The matcher turns these into bounds on the token count (see `capabilities.TokenBounds`),
so that the expensive count is only taken when a rule or the guard cannot decide without it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class PromptSize:
    """What we know about a prompt's size before tokenizing it.

    `text_bytes` counts UTF-8 bytes of text every chat template renders (message contents,
    tool-call names and arguments, tool definitions as JSON); `optional_bytes` counts text a
    template may or may not render (earlier turns' `reasoning_content`), so it only widens the
    upper bound. `items` is the number of messages, content parts and tools, each of which
    brings some template markup. `opaque` is set when some part is not text (an image, audio,
    token ids mixed with text): its token cost cannot be bounded from bytes. `token_ids` is
    the exact count for completions prompts sent as token ids; `prompts` how many prompts
    a completions call carries.
    """

    text_bytes: int = 0
    optional_bytes: int = 0
    items: int = 0
    opaque: bool = False
    token_ids: int | None = None
    prompts: int = 1


def _utf8_len(text: str) -> int:
    # len(str.encode()) allocates; for pure-ASCII text (the common case) len() is exact.
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _json_len(value: Any) -> int:
    # The separators match Jinja's `tojson` as used by Hugging Face chat templates.
    return _utf8_len(json.dumps(value, ensure_ascii=False, default=str))


def measure_chat(messages: Any, tools: Any) -> PromptSize:
    """Measure a chat request's `messages` and `tools` (malformed entries are skipped)."""
    text = optional = items = 0
    opaque = False
    for message in messages if isinstance(messages, list) else ():
        if not isinstance(message, Mapping):
            continue
        items += 1
        content = message.get("content")
        if isinstance(content, str):
            text += _utf8_len(content)
        elif isinstance(content, list):
            for part in content:
                items += 1
                if isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    text += _utf8_len(part["text"])
                elif isinstance(part, Mapping) and part.get("type") in ("text", "refusal"):
                    continue
                else:
                    opaque = True
        for key in ("name", "tool_call_id"):
            if isinstance(message.get(key), str):
                text += _utf8_len(message[key])
        reasoning = message.get("reasoning_content")
        if isinstance(reasoning, str):
            optional += _utf8_len(reasoning)
        text += _tool_calls_len(message.get("tool_calls"))
    if isinstance(tools, list):
        items += len(tools)
        text += _json_len(tools) if tools else 0
    return PromptSize(text_bytes=text, optional_bytes=optional, items=items, opaque=opaque)


def _tool_calls_len(tool_calls: Any) -> int:
    total = 0
    for call in tool_calls if isinstance(tool_calls, list) else ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        for key in ("name", "arguments"):
            value = function.get(key)
            if isinstance(value, str):
                total += _utf8_len(value)
            elif value is not None:
                total += _json_len(value)
    return total


def measure_completion(prompt: Any) -> PromptSize:
    """Measure a completions `prompt`: a string, token ids, or a list of either."""
    if isinstance(prompt, str):
        return PromptSize(text_bytes=_utf8_len(prompt), items=1)
    if isinstance(prompt, list) and prompt and all(isinstance(p, int) for p in prompt):
        return PromptSize(items=1, token_ids=len(prompt))
    if isinstance(prompt, list) and prompt:
        return _measure_many(prompt)
    return PromptSize(items=1)


def _measure_many(prompts: Iterable[Any]) -> PromptSize:
    # Several prompts in one call: the guard sends it to throughput; sizes are totals.
    text = ids = count = 0
    all_ids = True
    for prompt in prompts:
        count += 1
        if isinstance(prompt, str):
            text += _utf8_len(prompt)
            all_ids = False
        elif isinstance(prompt, list):
            ids += len(prompt)
    return PromptSize(
        text_bytes=text,
        items=count,
        opaque=ids > 0 and not all_ids,
        token_ids=ids if all_ids else None,
        prompts=count,
    )
