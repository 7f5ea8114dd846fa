"""The output parsers by their `router.yaml` name, and the one factory that builds them.

The table says what each parser needs (whether the model thinks unless told otherwise,
whether the detokenizer must keep special tokens as text) without importing any parser:
configuration validates names against it, and an implementation is imported on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

from router.parsers.base import OutputParser


@dataclass(frozen=True, slots=True)
class ParserSpec:
    implementation: str
    """`module:Class`; the class takes (name, *, tools, thinking)."""
    thinks_by_default: bool
    """Output starts in reasoning unless `chat_template_kwargs` turns thinking off."""
    keeps_special_tokens: bool
    """Its markers are special tokens: the detokenizer must keep them as text."""


OUTPUT_PARSERS: Mapping[str, ParserSpec] = MappingProxyType(
    {
        "none": ParserSpec("router.parsers.plain:PlainParser", False, False),
        # GLM thinks unless the request turns it off.
        "glm45": ParserSpec("router.parsers.glm:GlmParser", True, True),
        "glm47": ParserSpec("router.parsers.glm:GlmParser", True, True),
        # DeepSeek-V3.2 chats unless the request turns thinking on.
        "deepseek_v32": ParserSpec("router.parsers.deepseek_v32:DeepSeekV32Parser", False, True),
    }
)


class _ParserClass(Protocol):
    def __call__(self, name: str, *, tools: Any, thinking: bool) -> OutputParser: ...


def spec_of(name: str) -> ParserSpec:
    spec = OUTPUT_PARSERS.get(name)
    if spec is None:
        raise ValueError(f"unknown output parser {name!r}; one of {sorted(OUTPUT_PARSERS)}")
    return spec


def make_output_parser(
    name: str,
    *,
    tools: list[dict[str, Any]] | None,
    chat_template_kwargs: Mapping[str, Any] | None,
) -> OutputParser:
    """A fresh parser for one completion.

    `tools` are the request's tools in OpenAI format; pass None when `tool_choice` is
    "none", so that tool-call markup stays content as it does in vLLM.
    `chat_template_kwargs` decides whether the output starts in reasoning.
    Raises ValueError for a name not in `OUTPUT_PARSERS`.
    """
    from router.parsers.arguments import ToolSchemas

    spec = spec_of(name)
    thinking = _flag(chat_template_kwargs or {}, default=spec.thinks_by_default)
    return _implementation(spec)(name, tools=ToolSchemas(tools), thinking=thinking)


def needs_special_tokens(name: str) -> bool:
    """Whether the detokenizer must keep special tokens as text for this parser."""
    return spec_of(name).keeps_special_tokens


def _implementation(spec: ParserSpec) -> _ParserClass:
    module, _, attribute = spec.implementation.partition(":")
    cls: _ParserClass = getattr(importlib.import_module(module), attribute)
    return cls


def _flag(kwargs: Mapping[str, Any], *, default: bool) -> bool:
    # As vLLM's parsers read them: `enable_thinking` and `thinking` are synonyms, either
    # one true turns thinking on, and only when both are missing does the default hold.
    thinking, enable_thinking = kwargs.get("thinking"), kwargs.get("enable_thinking")
    if thinking is None and enable_thinking is None:
        return default
    return bool(thinking) or bool(enable_thinking)
