"""Exceptions raised by the classification package.

PolicyError
 ├── RulesError            a rules file or inline rules failed validation
 └── PromptTokensRequired  classify() was called without a count it needs
"""

from __future__ import annotations


class PolicyError(Exception):
    """Base class of every error raised by `policies`."""


class RulesError(PolicyError, ValueError):
    """Invalid rules; each problem names the rule (by name or position) and the field.

    `problems` lists them one by one, e.g. `rule 'agents': match.prompt_tokens: min 500 >
    max 100`; the message joins them, one a line, after the source when there is one.
    """

    def __init__(self, problems: list[str] | tuple[str, ...], source: str | None = None):
        self.problems = tuple(problems)
        self.source = source
        lines = [f"{source}: {problem}" for problem in self.problems] if source else self.problems
        super().__init__("\n".join(lines))


class PromptTokensRequired(PolicyError):
    """The decision depends on the prompt's token count and none was given.

    Count the prompt off the event loop, set `features.prompt_tokens` and call `classify()`
    again; `needs_prompt_tokens()` answers the same question without deciding.
    """
