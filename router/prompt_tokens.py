"""Counts a request's prompt tokens for the rules that need them, off the event loop.

With a chat template (a `tokenizer_config.json` with `chat_template` next to the model's
tokenizer.json), chat prompts are rendered by transformers exactly as vLLM renders them.
Without one, the count is an approximation: each message as `<|role|>\\n` + its text +
`\\n`, the tools as JSON, then `<|assistant|>\\n` — within a few tokens per message of
what a real template adds, and only ever used against rule thresholds.
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

from router.tokenizer import LoadedTokenizer

log = logging.getLogger("pd_gateway.classify")


class PromptCounter:
    def __init__(self, tokenizer: LoadedTokenizer, tokenizer_file: Path) -> None:
        self._tokenizer = tokenizer.tokenizer
        self._template = _load_template(tokenizer_file)

    async def count(self, endpoint: str, body: dict[str, Any]) -> int:
        """The prompt's token count. Encoding a long prompt takes hundreds of ms: a thread."""
        return await asyncio.to_thread(self.count_now, endpoint, body)

    def count_now(self, endpoint: str, body: dict[str, Any]) -> int:
        if endpoint == "completions":
            return self._count_completion(body.get("prompt"))
        if self._template is not None:
            try:
                return int(self._template(body))
            except Exception:  # a template refusing the request (raise_exception, bad kwargs)
                log.debug("chat template failed; counting the approximate rendering")
        return _count(self._tokenizer, render_chat(body))

    def _count_completion(self, prompt: Any) -> int:
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            return len(prompt)
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else ""
        if isinstance(prompt, list):  # a list of token-id lists
            return len(prompt)
        return _count(self._tokenizer, str(prompt))


def _count(tokenizer: tokenizers.Tokenizer, text: str) -> int:
    # encode_batch releases the GIL while it works; encode holds it for the whole prompt
    # (half a second for 200k tokens), which would stall the event loop despite the thread.
    return len(tokenizer.encode_batch([text], add_special_tokens=False)[0].ids)


def render_chat(body: dict[str, Any]) -> str:
    """The approximate chat rendering used when no chat template is known."""
    parts = []
    tools = body.get("tools")
    if tools:
        parts.append("<|system|>\n" + orjson.dumps(tools).decode() + "\n")
    for message in body.get("messages") or []:
        parts.append(f"<|{message.get('role', 'user')}|>\n{_text(message.get('content'))}\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


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


def _load_template(tokenizer_file: Path) -> Any:
    """A function rendering and tokenizing a chat body with the model's template, or None."""
    config_file = tokenizer_file.parent / "tokenizer_config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not config.get("chat_template"):
        return None
    # A heavy import, only when a template exists; without PyTorch it warns that models
    # are unavailable, which is irrelevant to rendering a template.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_file=str(tokenizer_file), chat_template=config["chat_template"]
    )

    def render(body: dict[str, Any]) -> int:
        text = hf.apply_chat_template(
            body.get("messages") or [],
            tools=body.get("tools"),
            add_generation_prompt=True,
            tokenize=False,
            **_template_kwargs(body.get("chat_template_kwargs")),
        )
        return _count(hf.backend_tokenizer, str(text))

    return render
