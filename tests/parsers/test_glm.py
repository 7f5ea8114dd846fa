"""GLM (glm45 / glm47) parser: the docs/output-formats.md §1 examples and edge cases.

Where vLLM 0.32's GLM parser and ours once disagreed, the case says what vLLM gives
(tests/real_vllm/test_output_parsers.py checks the two side by side).
"""

from __future__ import annotations

from typing import Any

import pytest

from .support import parse, streamed, without_ids

OFF = {"enable_thinking": False}

EXAMPLE_COMPACT = (
    "Need two lookups.</think><tool_call>get_weather<arg_key>city</arg_key>"
    "<arg_value>Beijing</arg_value></tool_call><tool_call>search<arg_key>query</arg_key>"
    '<arg_value>café "best"</arg_value><arg_key>filters</arg_key><arg_value>{"tags": '
    '["a", "b"], "max": 3}</arg_value><arg_key>strict</arg_key><arg_value>true</arg_value>'
    "</tool_call>"
)
EXAMPLE_LINES = (
    "\n<think>Need the weather.</think>\nLet me check.\n<tool_call>get_weather\n"
    "<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n"
    "<arg_value>3</arg_value>\n</tool_call>"
)


def call(name: str, key: str, value: str) -> str:
    return f"<tool_call>{name}<arg_key>{key}</arg_key><arg_value>{value}</arg_value></tool_call>"


# (id, parser, chat_template_kwargs, output, reasoning, content, [(name, arguments)])
CASES: list[tuple[str, str, Any, str, str | None, str | None, list[tuple[str, str]]]] = [
    (
        "spec-compact-two-calls",
        "glm47",
        None,
        EXAMPLE_COMPACT,
        "Need two lookups.",
        None,
        [
            ("get_weather", '{"city": "Beijing"}'),
            (
                "search",
                '{"query": "café \\"best\\"", "filters": {"tags": ["a", "b"], "max": 3}, '
                '"strict": true}',
            ),
        ],
    ),
    (
        "spec-one-per-line-glm45",
        "glm45",
        None,
        EXAMPLE_LINES,
        "\nNeed the weather.",
        "\nLet me check.",
        [("get_weather", '{"city": "Beijing", "days": 3}')],
    ),
    (
        "zero-arguments",
        "glm47",
        OFF,
        "<tool_call>get_current_date</tool_call>",
        None,
        None,
        [("get_current_date", "{}")],
    ),
    ("thinking-off-content", "glm47", OFF, "Hello world", None, "Hello world", []),
    (
        "thinking-off-by-thinking-key",
        "glm47",
        {"thinking": False},
        "Hi</think>",
        None,
        "Hi</think>",
        [],
    ),
    ("unterminated-reasoning", "glm47", None, "Still thinking", "Still thinking", None, []),
    ("stray-leading-think", "glm47", None, "<think>Hmm</think>Answer", "Hmm", "Answer", []),
    (
        "stray-think-after-space",
        "glm47",
        None,
        "\n <think>Hmm</think>Answer",
        "\n Hmm",
        "Answer",
        [],
    ),
    ("think-in-reasoning-dropped", "glm47", None, "a<think>b</think>c", "ab", "c", []),
    (
        "reasoning-reopened-in-content",
        "glm47",
        None,
        "First.</think>Answer.<think>More?</think>Done.</think>End",
        "First.More?",
        "Answer.Done.End",
        [],
    ),
    (
        "reasoning-trailing-whitespace-dropped",
        "glm47",
        None,
        "Step one. \n\n</think>\n\nAnswer",
        "Step one.",
        "\n\nAnswer",
        [],
    ),
    (
        "reasoning-inner-whitespace-kept",
        "glm47",
        None,
        "Step one. \n\nStep two. \n",
        "Step one. \n\nStep two.",
        None,
        [],
    ),
    (
        "thinking-on-if-either-switch-is",
        "glm47",
        {"enable_thinking": False, "thinking": True},
        "a</think>b",
        "a",
        "b",
        [],
    ),
    ("empty-reasoning", "glm47", None, "</think>Hi", None, "Hi", []),
    (
        "call-ends-reasoning",
        "glm47",
        None,
        "Plan<tool_call>get_current_date</tool_call>",
        "Plan",
        None,
        [("get_current_date", "{}")],
    ),
    ("glm45-no-think-tag", "glm45", None, "\nHello", "\nHello", None, []),
    ("glm45-thinking-off", "glm45", OFF, "<think>x</think>y", None, "<think>x</think>y", []),
    ("glm45-unterminated", "glm45", None, "<think>x", "x", None, []),
    (
        "unknown-tool-dropped",
        "glm47",
        OFF,
        call("nope", "a", "1") + "<tool_call>get_current_date</tool_call>",
        None,
        None,
        [("get_current_date", "{}")],
    ),
    (
        "unknown-key-stays-string",
        "glm47",
        OFF,
        call("get_weather", "extra", "5"),
        None,
        None,
        [("get_weather", '{"extra": "5"}')],
    ),
    (
        "invalid-integer-stays-string",
        "glm47",
        OFF,
        call("get_weather", "days", "three"),
        None,
        None,
        [("get_weather", '{"days": "three"}')],
    ),
    (
        "truncated-call-keeps-complete-pairs",
        "glm47",
        OFF,
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value>"
        "<arg_key>days</arg_key><arg_value>3",
        None,
        None,
        [("get_weather", '{"city": "Beijing"}')],
    ),
    ("truncated-in-name", "glm47", OFF, "Hi<tool_call>get_wea", None, "Hi", []),
    (
        "truncated-in-reasoning-call",
        "glm47",
        None,
        "Plan<tool_call>get_weather<arg_key>ci",
        "Plan",
        None,
        [("get_weather", "{}")],
    ),
    (
        "content-before-and-after",
        "glm47",
        OFF,
        "  Sure.  \n<tool_call>get_current_date</tool_call>\n trailing text",
        None,
        "  Sure.",
        [("get_current_date", "{}")],
    ),
    (
        "whitespace-between-calls",
        "glm45",
        OFF,
        "<tool_call>get_current_date</tool_call>\n\n<tool_call>get_current_date</tool_call>\n",
        None,
        None,
        [("get_current_date", "{}"), ("get_current_date", "{}")],
    ),
    (
        "content-whitespace-without-calls",
        "glm47",
        OFF,
        "\n\n  Hello\n  world \n\n",
        None,
        "\n\n  Hello\n  world \n\n",
        [],
    ),
    ("whitespace-only-content", "glm47", OFF, " \n ", None, " \n ", []),
    (
        "whitespace-only-content-before-call",
        "glm47",
        OFF,
        " \n <tool_call>get_current_date</tool_call>",
        None,
        None,
        [("get_current_date", "{}")],
    ),
    (
        "non-ascii",
        "glm47",
        OFF,
        call("get_weather", "city", "北京 ☀"),
        None,
        None,
        [("get_weather", '{"city": "北京 ☀"}')],
    ),
    (
        "string-value-verbatim",
        "glm47",
        OFF,
        call("get_weather", "city", "  padded <b>\n"),
        None,
        None,
        [("get_weather", '{"city": "  padded <b>\\n"}')],
    ),
    (
        "marker-inside-value",
        "glm47",
        OFF,
        call("search", "query", "x</tool_call><arg_key>"),
        None,
        None,
        [("search", '{"query": "x</tool_call><arg_key>"}')],
    ),
    (
        "repeated-key-keeps-first",
        "glm47",
        OFF,
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>A</arg_value>"
        "<arg_key>city</arg_key><arg_value>B</arg_value></tool_call>",
        None,
        None,
        [("get_weather", '{"city": "A"}')],
    ),
    (
        "key-without-value-dropped",
        "glm47",
        OFF,
        "<tool_call>get_weather<arg_key>days</arg_key></tool_call>",
        None,
        None,
        [("get_weather", "{}")],
    ),
    (
        "angle-brackets-in-content",
        "glm47",
        OFF,
        "a < b and <tool_c> <tool_callx",
        None,
        "a < b and <tool_c> <tool_callx",
        [],
    ),
]

TYPED_CASES = [
    ("s", "007", '"007"'),
    ("i", " 42 ", "42"),
    ("i", "4.2", "4.2"),  # fits no type of the schema: its JSON value
    ("i", "+5", "5"),
    ("n", "4.5", "4.5"),
    ("n", "7", "7"),
    ("n", "7.0", "7"),
    ("n", "NaN", '"NaN"'),
    ("b", "TRUE", "true"),
    ("b", "0", "false"),
    ("b", "yes", '"yes"'),
    ("z", "null", "null"),
    ("z", "None", '"None"'),
    ("z", "NULL", "null"),
    ("o", '{"k": [1, "x"]}', '{"k": [1, "x"]}'),
    ("o", "[1]", "[1]"),
    ("a", "[1, 2]", "[1, 2]"),
    ("a", "{broken", '"{broken"'),
    ("u", "12", "12"),
    ("u", "twelve", '"twelve"'),
    ("any", "null", "null"),
    ("any", "1.5", "1.5"),
    ("any", "x", '"x"'),
    ("one", "false", "false"),
    ("one", "maybe", '"maybe"'),
    ("one", "1", "true"),  # boolean before string, whatever the schema's order
    # A JSON object or array is taken as written, its inside not typed.
    (
        "nested",
        '{"count": "3", "inner": {"flag": "true"}}',
        '{"count": "3", "inner": {"flag": "true"}}',
    ),
    ("ints", '["1", 2, "x"]', '["1", 2, "x"]'),
]


@pytest.mark.parametrize(
    ("parser", "kwargs", "text", "reasoning", "content", "calls"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_output(parser, kwargs, text, reasoning, content, calls) -> None:
    whole, _ = parse(parser, [text], kwargs=kwargs)
    assert without_ids(whole) == (reasoning, content, calls)
    per_char, deltas = parse(parser, list(text), kwargs=kwargs)
    assert without_ids(per_char) == (reasoning, content, calls)
    assert streamed(deltas) == per_char


@pytest.mark.parametrize(("key", "raw", "expected"), TYPED_CASES)
@pytest.mark.parametrize("parser", ["glm45", "glm47"])
def test_schema_typing(parser: str, key: str, raw: str, expected: str) -> None:
    message, _ = parse(parser, [call("typed", key, raw)], kwargs=OFF)
    assert [c.arguments for c in message.tool_calls] == [f'{{"{key}": {expected}}}']


@pytest.mark.parametrize("chunks", [1, 3], ids=["whole", "per-3-chars"])
def test_without_tools_call_markup_is_left_out(chunks: int) -> None:
    text = " Hi " + call("get_weather", "city", "X") + " then <tool_call>x</tool_call> end"
    pieces = [text[i : i + chunks] for i in range(0, len(text), chunks)]
    message, deltas = parse("glm47", pieces, tools=None, kwargs=OFF)
    assert without_ids(message) == (None, " Hi  then  end", [])
    assert streamed(deltas) == message


def test_content_streams_before_output_ends() -> None:
    message, deltas = parse("glm47", ["Let me ", "check. ", "Now"], kwargs=OFF)
    assert [d.content for d in deltas] == ["Let me", " check.", " Now", ""]
    assert message.content == "Let me check. Now"


def test_name_announced_before_arguments() -> None:
    chunks = [
        "<tool_call>get_weather<arg_key>",
        "city</arg_key><arg_value>Rome</arg_value>",
        "</tool_call>",
    ]
    _, deltas = parse("glm47", chunks, kwargs=OFF)
    first = deltas[0].tool_calls
    assert [(d.index, d.name, d.arguments) for d in first] == [(0, "get_weather", "")]
    assert [d.arguments for d in deltas[1].tool_calls] == ['{"city": "Rome"']
    assert [d.arguments for d in deltas[2].tool_calls] == ["}"]
