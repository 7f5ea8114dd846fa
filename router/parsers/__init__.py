"""Output parsers: turn detokenized model text into reasoning, content and tool calls.

`make_output_parser(name, tools=..., chat_template_kwargs=...)` builds one per
completion; see `base.OutputParser` for the interface and docs/output-formats.md for the
formats.
"""

from router.parsers.base import (
    OutputParser,
    ParsedDelta,
    ParsedMessage,
    ToolCall,
    ToolCallDelta,
    finish_reason,
)
from router.parsers.registry import OUTPUT_PARSERS, make_output_parser, needs_special_tokens

__all__ = [
    "OUTPUT_PARSERS",
    "OutputParser",
    "ParsedDelta",
    "ParsedMessage",
    "ToolCall",
    "ToolCallDelta",
    "finish_reason",
    "make_output_parser",
    "needs_special_tokens",
]
