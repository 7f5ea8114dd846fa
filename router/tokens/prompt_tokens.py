"""Counts a request's prompt tokens for the rules that need them, off the event loop.

With a chat template (a `tokenizer_config.json` with `chat_template` next to the model's
tokenizer.json), chat prompts are rendered by transformers' template renderer exactly as
vLLM renders them.
Without one, the count is an approximation: each message as `<|role|>\\n` + its text +
`\\n`, the tools as JSON, then `<|assistant|>\\n` — within a few tokens per message of
what a real template adds, and only ever used against rule thresholds. Each of these
parts is encoded on its own (for DeepSeek's and GLM's pre-tokenisers, which always split
between a newline and a `<`, the same ids as the whole text).

Texts are encoded by a SegmentEncoder: the pieces of a conversation met in earlier turns
come from its cache.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import orjson
import tokenizers

from router.tokens.segments import SegmentEncoder
from router.tokens.tokenizer import LoadedTokenizer

log = logging.getLogger("pd_gateway.classify")


class PromptCounter:
    def __init__(self, tokenizer: LoadedTokenizer, tokenizer_file: Path) -> None:
        self._template = _load_template(tokenizer_file, tokenizer.tokenizer)
        self.encoder = SegmentEncoder(tokenizer.tokenizer)

    async def count(self, endpoint: str, body: dict[str, Any], *, cap: int | None = None) -> int:
        """The prompt's token count, or a count of at least `cap` once it is known to reach
        it (nothing above `cap` changes a decision). Encoding a long prompt takes hundreds
        of ms: a thread."""
        return await asyncio.to_thread(self.count_now, endpoint, body, cap)

    def count_now(self, endpoint: str, body: dict[str, Any], cap: int | None = None) -> int:
        if endpoint == "completions":
            return self._count_completion(body.get("prompt"), cap)
        return self.encoder.count(self.chat_parts(body), cap)

    def ids_now(self, endpoint: str, body: dict[str, Any]) -> list[int]:
        """The prompt's token ids, rendered and encoded as `count_now` counts them (of a
        batch of prompts, the first)."""
        if endpoint != "completions":
            return self.encoder.ids(self.chat_parts(body))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]  # a list of token-id lists
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return [i for i in prompt if isinstance(i, int)]
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else ""
        return self.encoder.ids([str(prompt)])

    @property
    def has_chat_template(self) -> bool:
        """Whether chat prompts are rendered by the model's own template (else approximated)."""
        return self._template is not None

    def template_ids(self, body: dict[str, Any], max_chars: int) -> list[int] | None:
        """A chat prompt's ids as rendered by the model's own template and encoded as vLLM
        encodes a chat prompt (the segment cache's ids are the whole text's); None without a
        template, when the template refuses the request, or when the rendered text is
        longer than `max_chars`."""
        if self._template is None:
            return None
        try:
            text = str(self._template(body))
        except Exception:  # a template refusing the request (raise_exception, bad kwargs)
            return None
        if len(text) > max_chars:
            return None
        return self.encoder.ids([text])

    def chat_parts(self, body: dict[str, Any]) -> list[str]:
        """The rendered chat prompt, in parts encoded each on its own."""
        if self._template is not None:
            try:
                return [str(self._template(body))]
            except Exception:  # a template refusing the request (raise_exception, bad kwargs)
                log.debug("chat template failed; using the approximate rendering")
        return approximate_chat_parts(body)

    def _count_completion(self, prompt: Any, cap: int | None) -> int:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return len(prompt)
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else ""
        if isinstance(prompt, list):  # a list of token-id lists
            return len(prompt)
        return self.encoder.count([str(prompt)], cap)


def render_chat(body: dict[str, Any]) -> str:
    """The approximate chat rendering used when no chat template is known."""
    return "".join(approximate_chat_parts(body))


def approximate_chat_parts(body: dict[str, Any]) -> list[str]:
    """The approximate rendering's parts: the tools, each message, the generation prompt."""
    parts = []
    tools = body.get("tools")
    if tools:
        parts.append("<|system|>\n" + orjson.dumps(tools).decode() + "\n")
    for message in body.get("messages") or []:
        parts.append(f"<|{message.get('role', 'user')}|>\n{_text(message.get('content'))}\n")
    parts.append("<|assistant|>\n")
    return parts


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


# apply_chat_template's own parameters: a client must not override them.
_RESERVED = frozenset(
    {
        "conversation",
        "conversations",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)


def _template_kwargs(kwargs: Any) -> dict[str, Any]:
    if not isinstance(kwargs, dict):
        return {}
    return {k: v for k, v in kwargs.items() if isinstance(k, str) and k not in _RESERVED}


# What transformers passes a chat template besides the conversation: the special tokens.
_SPECIAL_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
    "additional_special_tokens",
)


def _load_template(tokenizer_file: Path, tokenizer: tokenizers.Tokenizer) -> Any:
    """A function rendering a chat body's text with the model's template, or None.

    Rendered by transformers' own template renderer (what its `apply_chat_template` and so
    vLLM use) without building a second tokenizer: a transformers tokenizer would hold a
    copy of the whole vocabulary (tens of MB) only to render text.
    """
    config_file = tokenizer_file.parent / "tokenizer_config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    templates = config.get("chat_template")
    if not templates:
        return None
    if isinstance(templates, list):  # named templates, as transformers stores several
        templates = {t.get("name"): t.get("template") for t in templates if isinstance(t, dict)}
    # A heavy import, only when a template exists; without PyTorch it warns that models
    # are unavailable, which is irrelevant to rendering a template.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers.utils.chat_template_utils import render_jinja_template

    special = {k: _token_text(config[k]) for k in _SPECIAL_TOKENS if config.get(k) is not None}

    def render(body: dict[str, Any]) -> str:
        tools = body.get("tools")
        template = templates
        if isinstance(template, dict):
            template = template.get("tool_use" if tools else "default") or template.get("default")
        # (the rendered conversations, the assistant-token indices), whatever it is annotated
        rendered: Any = render_jinja_template(
            [body.get("messages") or []],
            tools=tools,
            chat_template=template,
            add_generation_prompt=True,
            **{**special, **_template_kwargs(body.get("chat_template_kwargs"))},
        )
        return str(rendered[0][0])

    return render


def _token_text(value: Any) -> Any:
    """A special token as the template sees it: its text (the config may hold the token's
    full description)."""
    if isinstance(value, dict):
        return value.get("content")
    if isinstance(value, list):
        return [_token_text(v) for v in value]
    return value
