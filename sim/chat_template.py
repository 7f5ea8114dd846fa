"""A model's own chat template (``chat_template`` in tokenizer_config.json), rendered as
Hugging Face tokenizers render it: a sandboxed Jinja2 environment with ``trim_blocks`` and
``lstrip_blocks``, ``tojson`` keeping non-ASCII, ``raise_exception``, and the special
tokens (``bos_token``, ``eos_token``) as variables."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateError(ValueError):
    """The template refused the conversation (``raise_exception``) or failed to render."""


def _tojson(value: object, indent: int | None = None, **_: object) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _raise(message: str) -> None:
    raise ChatTemplateError(message)


def _token_text(token: object) -> str | None:
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


@dataclass(frozen=True, slots=True)
class ChatTemplate:
    """A compiled chat template and the special tokens it is rendered with."""

    source: str
    bos_token: str | None
    eos_token: str | None

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        tools: Sequence[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        extra: dict[str, Any] | None = None,
    ) -> str:
        """The prompt text for ``messages`` (and ``tools``)."""
        environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        environment.filters["tojson"] = _tojson
        environment.globals["raise_exception"] = _raise
        variables = {
            **(extra or {}),
            "messages": [_with_argument_objects(m) for m in messages],
            "tools": list(tools) if tools else None,
            "add_generation_prompt": add_generation_prompt,
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
        }
        try:
            return environment.from_string(self.source).render(**variables)
        except TemplateError as exc:
            raise ChatTemplateError(str(exc)) from exc


def _with_argument_objects(message: dict[str, Any]) -> dict[str, Any]:
    """An assistant message's tool-call arguments as objects, not JSON text: what vLLM
    hands a template."""
    calls = message.get("tool_calls")
    if not isinstance(calls, list):
        return message
    parsed = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("arguments"), str):
            try:
                arguments = json.loads(function["arguments"])
            except ValueError:
                pass
            else:
                call = {**call, "function": {**function, "arguments": arguments}}
        parsed.append(call)
    return {**message, "tool_calls": parsed}


def load_chat_template(folder: Path) -> ChatTemplate | None:
    """The chat template of the model in ``folder``, if its tokenizer_config.json has one."""
    config_path = folder / "tokenizer_config.json"
    if not config_path.is_file():
        return None
    config = json.loads(config_path.read_text(encoding="utf-8"))
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str):
        return None
    return ChatTemplate(
        source, _token_text(config.get("bos_token")), _token_text(config.get("eos_token"))
    )
