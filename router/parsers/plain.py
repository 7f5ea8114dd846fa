"""The `none` output parser: every character is content, nothing is held back."""

from __future__ import annotations

from router.parsers.arguments import ToolSchemas
from router.parsers.base import ParsedDelta, ParsedMessage


class PlainParser:
    """Plain text: all content, no reasoning, no tool calls."""

    __slots__ = ("_content",)

    def __init__(
        self, name: str = "none", *, tools: ToolSchemas | None = None, thinking: bool = False
    ) -> None:  # the registry's uniform signature; plain text needs none of it
        self._content: list[str] = []

    def feed(self, text: str) -> ParsedDelta:
        """Pass the delta through as content."""
        if text:
            self._content.append(text)
        return ParsedDelta(content=text)

    def finish(self) -> ParsedDelta:
        """Nothing is ever held back."""
        return ParsedDelta()

    def message(self) -> ParsedMessage:
        """All text so far as content (null when empty)."""
        return ParsedMessage(reasoning=None, content="".join(self._content) or None, tool_calls=[])
