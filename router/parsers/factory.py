"""Choose an output parser by its `router.yaml` name and the request's options."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.parsers.base import OutputParser
from router.parsers.deepseek_v32 import DeepSeekV32Parser
from router.parsers.glm import GlmParser
from router.parsers.plain import PlainParser
from router.parsers.schema import ToolSchemas

OUTPUT_PARSERS: frozenset[str] = frozenset({"none", "glm45", "glm47", "deepseek_v32"})


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
    kwargs = chat_template_kwargs or {}
    if name == "none":
        return PlainParser()
    if name in ("glm45", "glm47"):
        # GLM thinks unless the request turns it off.
        thinking = _flag(kwargs, default=True)
        return GlmParser(name, tools=ToolSchemas(tools), thinking=thinking)
    if name == "deepseek_v32":
        # DeepSeek-V3.2 chats unless the request turns thinking on.
        thinking = _flag(kwargs, default=False)
        return DeepSeekV32Parser(tools=ToolSchemas(tools), thinking=thinking)
    raise ValueError(f"unknown output parser {name!r}; expected one of {sorted(OUTPUT_PARSERS)}")


def needs_special_tokens(name: str) -> bool:
    """Whether the detokenizer must keep special tokens as text for this parser."""
    if name not in OUTPUT_PARSERS:
        raise ValueError(f"unknown output parser {name!r}")
    return name != "none"


def _flag(kwargs: Mapping[str, Any], *, default: bool) -> bool:
    # `enable_thinking` and `thinking` are synonyms; an explicit value wins.
    for key in ("enable_thinking", "thinking"):
        value = kwargs.get(key)
        if value is not None:
            return bool(value)
    return default
