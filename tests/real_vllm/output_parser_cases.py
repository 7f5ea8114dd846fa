"""Model outputs that the gateway's output parsers and vLLM 0.32's must read alike.

Every case of the parsers' unit tables (`tests/parsers/test_glm.py`,
`tests/parsers/test_deepseek_v32.py`, the GLM schema-typing table) is taken as it is, and
the outputs those tables lack are added here: nested JSON arguments of every JSON type,
several calls with text before and around them, reasoning followed by calls, requests
without tools or with `tool_choice: "none"`. What each case must give is whatever vLLM
gives; only the outputs are written down.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.parsers import test_deepseek_v32 as dsml_table
from tests.parsers import test_glm as glm_table
from tests.parsers.support import TOOLS

THINKING_OFF = {"enable_thinking": False}
THINKING_ON = {"thinking": True}


@dataclass(frozen=True)
class OutputCase:
    """One model output and the request it answers."""

    name: str
    parser: str  # the gateway's `output_parser`: glm45, glm47 or deepseek_v32
    output: str
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | None = None
    cut_by_length: bool = False
    """`max_tokens` ended the output; otherwise the model's stop token did."""

    @property
    def key(self) -> str:
        """Unique among all cases: the parser and the name."""
        return f"{self.parser}/{self.name}"

    def request(self) -> dict[str, Any]:
        """The chat request's fields that steer parsing (the same for both sides)."""
        fields: dict[str, Any] = {}
        if self.tools is not None:
            fields["tools"] = self.tools
        if self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice
        if self.chat_template_kwargs is not None:
            fields["chat_template_kwargs"] = self.chat_template_kwargs
        return fields


def _cut(name: str) -> bool:
    # The unit tables name the outputs that end before the model closed them.
    return name.startswith(("truncated", "unterminated")) or name == "glm45-unterminated"


def glm_call(name: str, *pairs: tuple[str, str]) -> str:
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in pairs)
    return f"<tool_call>{name}{body}</tool_call>"


def dsml_block(*invokes: str) -> str:
    return "\n\n<｜DSML｜function_calls>\n" + "".join(invokes) + "</｜DSML｜function_calls>"


def dsml_invoke(name: str, *params: tuple[str, str, bool]) -> str:
    """An invoke whose parameters are (key, value, written as a raw string)."""
    body = "".join(
        f'<｜DSML｜parameter name="{key}" string="{"true" if raw else "false"}">'
        f"{value}</｜DSML｜parameter>\n"
        for key, value, raw in params
    )
    return f'<｜DSML｜invoke name="{name}">\n{body}</｜DSML｜invoke>\n'


# Values of every JSON type, nested, with the characters JSON escapes and some it need not.
QUOTED_STRING = 'say "hi" \\ back\\slash, tab\there, 東京 🌍 é'
NESTED_OBJECT = '{"a": {"b": [1, 2.5, -3e2, true, false, null, "x\\"y"]}, "u": "\\u00e9 東"}'
NESTED_ARRAY = '[{"k": null}, [], {}, "🌍", [0, -1]]'

GLM_EXTRA = [
    OutputCase(
        "nested-arguments-of-every-type",
        "glm47",
        "Plan the calls.</think>Sure, two calls."
        + glm_call(
            "typed",
            ("s", QUOTED_STRING),
            ("o", NESTED_OBJECT),
            ("a", NESTED_ARRAY),
            ("n", "-12.75"),
            ("b", "false"),
            ("z", "null"),
            ("i", "-7"),
        )
        + glm_call(
            "search", ("query", 'café "best"'), ("filters", '{"tags": ["a", "b"], "max": 3}')
        ),
        tools=TOOLS,
    ),
    OutputCase(
        "text-before-between-and-after-calls",
        "glm47",
        "Intro text. "
        + glm_call("get_current_date")
        + " between "
        + glm_call("get_weather", ("city", "Oslo"), ("days", "2"))
        + " after",
        THINKING_OFF,
        TOOLS,
    ),
    OutputCase(
        "three-calls-one-per-line",
        "glm45",
        "\n<think>Three lookups.\n</think>\nLooking up.\n"
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n"
        "</tool_call>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Köln"
        "</arg_value>\n<arg_key>days</arg_key>\n<arg_value>5</arg_value>\n</tool_call>\n"
        "<tool_call>get_current_date\n</tool_call>",
        tools=TOOLS,
    ),
    OutputCase(
        "reasoning-with-trailing-whitespace",
        "glm47",
        "Step one.\nStep two.  \n\n</think>\n\nAnswer line 1\nline 2",
        tools=TOOLS,
    ),
    OutputCase(
        "multi-script-content",
        "glm47",
        "Résumé — 数字 🌍 done.</think>Ответ: ✓ «ok» 👍🏽",
        tools=TOOLS,
    ),
    OutputCase(
        "call-without-tools-in-request",
        "glm47",
        "Let me look." + glm_call("get_weather", ("city", "Rome")),
        THINKING_OFF,
    ),
    OutputCase("empty-reasoning-block-glm45", "glm45", "<think></think>\nAnswer", tools=TOOLS),
    OutputCase(
        "leading-whitespace-before-calls",
        "glm47",
        "\n\nSure. " + glm_call("get_current_date"),
        THINKING_OFF,
        TOOLS,
    ),
    OutputCase(
        "call-without-tools-in-request-then-text",
        "glm47",
        " Let me look. " + glm_call("get_weather", ("city", "Rome")) + " then " + glm_call("x"),
        THINKING_OFF,
    ),
    OutputCase(
        "call-with-tool-choice-none-then-text",
        "glm47",
        " Let me look. " + glm_call("get_weather", ("city", "Rome")) + " then " + glm_call("x"),
        THINKING_OFF,
        TOOLS,
        tool_choice="none",
    ),
    OutputCase(
        "call-with-tool-choice-none",
        "glm47",
        "Let me look." + glm_call("get_weather", ("city", "Rome")),
        THINKING_OFF,
        TOOLS,
        tool_choice="none",
    ),
]

DSML_EXTRA = [
    OutputCase(
        "nested-arguments-of-every-type",
        "deepseek_v32",
        "Plan the calls.</think>Sure, two calls."
        + dsml_block(
            dsml_invoke(
                "typed",
                ("s", QUOTED_STRING, True),
                ("o", NESTED_OBJECT, False),
                ("a", NESTED_ARRAY, False),
                ("n", "-12.75", False),
                ("b", "false", False),
                ("z", "null", False),
                ("i", "-7", False),
            ),
            dsml_invoke(
                "search",
                ("query", 'café "best"', True),
                ("filters", '{"tags": ["a", "b"], "max": 3}', False),
            ),
        ),
        THINKING_ON,
        TOOLS,
    ),
    OutputCase(
        "three-calls-after-text",
        "deepseek_v32",
        "Checking three things."
        + dsml_block(
            dsml_invoke("get_weather", ("city", "Rome", True)),
            dsml_invoke("get_weather", ("city", "Köln", True), ("days", "5", False)),
            dsml_invoke("get_current_date"),
        ),
        tools=TOOLS,
    ),
    OutputCase(
        "reasoning-with-trailing-whitespace",
        "deepseek_v32",
        "Step one.\nStep two.  \n\n</think>\n\nAnswer line 1\nline 2",
        THINKING_ON,
        TOOLS,
    ),
    OutputCase(
        "multi-script-content",
        "deepseek_v32",
        "Résumé — 数字 🌍 done.</think>Ответ: ✓ «ok» 👍🏽",
        THINKING_ON,
        TOOLS,
    ),
    OutputCase(
        "think-tag-inside-reasoning", "deepseek_v32", "a<think>b</think>c", THINKING_ON, TOOLS
    ),
    OutputCase(
        "leading-whitespace-before-calls",
        "deepseek_v32",
        "\n\nSure. " + dsml_block(dsml_invoke("get_current_date")),
        tools=TOOLS,
    ),
    OutputCase(
        "truncated-after-block-opens",
        "deepseek_v32",
        "Sure.\n\n<｜DSML｜function_calls>\n",
        tools=TOOLS,
        cut_by_length=True,
    ),
    OutputCase("block-without-invokes", "deepseek_v32", "Sure." + dsml_block(), tools=TOOLS),
    OutputCase(
        "invoke-without-a-name",
        "deepseek_v32",
        "Sure." + dsml_block(dsml_invoke("", ("city", "Rome", True))),
        tools=TOOLS,
    ),
    OutputCase(
        "call-without-tools-in-request",
        "deepseek_v32",
        "Let me look." + dsml_block(dsml_invoke("get_weather", ("city", "Rome", True))),
    ),
    OutputCase(
        "call-with-tool-choice-none",
        "deepseek_v32",
        "Let me look." + dsml_block(dsml_invoke("get_weather", ("city", "Rome", True))),
        tools=TOOLS,
        tool_choice="none",
    ),
]


def _glm_table() -> list[OutputCase]:
    cases = [
        OutputCase(name, parser, text, kwargs, TOOLS, cut_by_length=_cut(name))
        for name, parser, kwargs, text, *_ in glm_table.CASES
    ]
    cases += [
        OutputCase(f"typed-{key}-{raw.strip()}", "glm47", glm_table.call("typed", key, raw),
                   THINKING_OFF, TOOLS)
        for key, raw, _ in glm_table.TYPED_CASES
    ]  # fmt: skip
    return cases


def _dsml_table() -> list[OutputCase]:
    cases = [
        OutputCase(name, "deepseek_v32", text, kwargs, TOOLS, cut_by_length=_cut(name))
        for name, kwargs, text, *_ in dsml_table.CASES
    ]
    cases += [
        OutputCase(
            f"typed-{key}-{raw.strip()}",
            "deepseek_v32",
            dsml_table.block(dsml_table.invoke("typed", dsml_table.param(key, raw, "false"))),
            tools=TOOLS,
        )
        for key, raw, _ in glm_table.TYPED_CASES
    ]
    return cases


CASES: list[OutputCase] = [
    *(_glm_table() + GLM_EXTRA),
    *(_dsml_table() + DSML_EXTRA),
]
