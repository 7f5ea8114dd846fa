"""DeepSeek-V3.2 DSML parser: the docs/output-formats.md §2 example and edge cases.

Where vLLM 0.32's DeepSeek-V3.2 parsers and ours once disagreed, the case says what vLLM
gives (tests/real_vllm/test_output_parsers.py checks the two side by side).
"""

from __future__ import annotations

from typing import Any

import pytest

from .support import parse, streamed, without_ids

THINK = {"thinking": True}

EXAMPLE = """I should check.</think>Checking now.

<｜DSML｜function_calls>
<｜DSML｜invoke name="get_weather">
<｜DSML｜parameter name="location" string="true">杭州</｜DSML｜parameter>
<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
</｜DSML｜invoke>
<｜DSML｜invoke name="search">
<｜DSML｜parameter name="filters" string="false">{"tags": ["a", "b"], "max": 3}</｜DSML｜parameter>
<｜DSML｜parameter name="safe" string="false">true</｜DSML｜parameter>
</｜DSML｜invoke>
</｜DSML｜function_calls>"""


def block(*invokes: str) -> str:
    return "<｜DSML｜function_calls>\n" + "".join(invokes) + "</｜DSML｜function_calls>"


def invoke(name: str, *params: str) -> str:
    return f'<｜DSML｜invoke name="{name}">\n' + "".join(params) + "</｜DSML｜invoke>\n"


def param(key: str, value: str, string: str | None = "true", close: bool = True) -> str:
    attr = "" if string is None else f' string="{string}"'
    end = "</｜DSML｜parameter>" if close else ""
    return f'<｜DSML｜parameter name="{key}"{attr}>{value}{end}\n'


# (id, chat_template_kwargs, output, reasoning, content, [(name, arguments)])
CASES: list[tuple[str, Any, str, str | None, str | None, list[tuple[str, str]]]] = [
    (
        "spec-example",
        THINK,
        EXAMPLE,
        "I should check.",
        "Checking now.\n\n",
        [
            ("get_weather", '{"location": "杭州", "days": 3}'),
            ("search", '{"filters": {"tags": ["a", "b"], "max": 3}, "safe": true}'),
        ],
    ),
    ("chat-mode-default", None, "Hello</think>", None, "Hello</think>", []),
    ("thinking-by-enable-key", {"enable_thinking": True}, "a</think>b", "a", "b", []),
    (
        "thinking-on-if-either-switch-is",
        {"enable_thinking": False, "thinking": True},
        "a</think>b",
        "a",
        "b",
        [],
    ),
    ("unterminated-reasoning", THINK, "still going", "still going", None, []),
    (
        "dsml-in-reasoning-is-reasoning",
        THINK,
        "plan" + block(invoke("get_current_date")),
        "plan" + block(invoke("get_current_date")),
        None,
        [],
    ),
    (
        "parameter-without-closing-tag",
        None,
        block(
            invoke("get_weather", param("city", "Rome", close=False), param("days", "2", "false"))
        ),
        None,
        None,
        [("get_weather", '{"city": "Rome\\n", "days": 2}')],
    ),
    (
        "last-parameter-without-closing-tag",
        None,
        block(invoke("get_weather", param("days", "2", "false", close=False))),
        None,
        None,
        [("get_weather", '{"days": 2}')],
    ),
    (
        "invoke-without-wrapper",
        None,
        "Sure. " + invoke("get_weather", param("city", "Oslo")),
        None,
        "Sure. ",
        [("get_weather", '{"city": "Oslo"}')],
    ),
    (
        "string-true-typed-by-schema",
        None,
        block(invoke("get_weather", param("days", "3"), param("city", "3"))),
        None,
        None,
        [("get_weather", '{"days": 3, "city": "3"}')],
    ),
    (
        "string-false-unknown-key-json",
        None,
        block(
            invoke("get_weather", param("extra", '{"a": 1}', "false"), param("k", "abc", "false"))
        ),
        None,
        None,
        [("get_weather", '{"extra": {"a": 1}, "k": "abc"}')],
    ),
    (
        "no-string-attribute-is-json",
        None,
        block(invoke("search", param("strict", "false", None), param("query", "[1]", None))),
        None,
        None,
        [("search", '{"strict": false, "query": [1]}')],
    ),
    (
        "string-false-invalid-integer",
        None,
        block(invoke("get_weather", param("days", "soon", "false"))),
        None,
        None,
        [("get_weather", '{"days": "soon"}')],
    ),
    (
        "whitespace-only-content-is-null",
        None,
        "\n\n" + block(invoke("get_current_date")),
        None,
        None,
        [("get_current_date", "{}")],
    ),
    ("content-kept-verbatim", None, "\n Hi \n", None, "\n Hi \n", []),
    ("whitespace-only-content-kept", None, "\n \n", None, "\n \n", []),
    (
        "text-after-block-dropped",
        None,
        "A" + block(invoke("get_current_date")) + "\nB",
        None,
        "A",
        [("get_current_date", "{}")],
    ),
    (
        "unknown-invoke-kept",
        None,
        block(invoke("nope", param("x", "1")), invoke("get_current_date")),
        None,
        None,
        [("nope", '{"x": "1"}'), ("get_current_date", "{}")],
    ),
    (
        "nameless-invoke-dropped",
        None,
        block(invoke("", param("x", "1")), invoke("get_current_date")),
        None,
        None,
        [("get_current_date", "{}")],
    ),
    (
        "wrapped-arguments-unwrapped",
        None,
        block(invoke("get_weather", param("arguments", '{"city": "Rome", "days": "2"}', "false"))),
        None,
        None,
        [("get_weather", '{"city": "Rome", "days": 2}')],
    ),
    (
        "wrapped-arguments-as-text-unwrapped",
        None,
        block(invoke("get_weather", param("input", '{"city": "Rome"}'))),
        None,
        None,
        [("get_weather", '{"city": "Rome"}')],
    ),
    (
        "wrapper-beside-another-argument-kept",
        None,
        block(
            invoke(
                "get_weather",
                param("arguments", '{"city": "Rome"}', "false"),
                param("days", "2", "false"),
            )
        ),
        None,
        None,
        [("get_weather", '{"arguments": {"city": "Rome"}, "days": 2}')],
    ),
    (
        "wrapper-of-undeclared-arguments-kept",
        None,
        block(invoke("get_weather", param("arguments", '{"town": "Rome"}', "false"))),
        None,
        None,
        [("get_weather", '{"arguments": {"town": "Rome"}}')],
    ),
    (
        "non-finite-json-stays-text",
        None,
        block(
            invoke("get_weather", param("extra", "NaN", "false"), param("big", "1e999", "false"))
        ),
        None,
        None,
        [("get_weather", '{"extra": "NaN", "big": "1e999"}')],
    ),
    (
        "scalars-retyped-by-schema",
        None,
        block(
            invoke(
                "typed",
                param("s", "3", "false"),
                param("b", "1", "false"),
                param("n", "7.0", "false"),
                param("i", "+5"),
            )
        ),
        None,
        None,
        [("typed", '{"s": "3", "b": true, "n": 7, "i": 5}')],
    ),
    (
        "truncated-in-parameter",
        None,
        block(invoke("get_weather", param("city", "Rome"), param("days", "2", "false")))[:-60],
        None,
        None,
        [("get_weather", '{"city": "Rome"}')],
    ),
    (
        "truncated-in-invoke-tag",
        None,
        'x<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_wea',
        None,
        "x",
        [],
    ),
    (
        "non-ascii-and-escapes",
        None,
        block(invoke("search", param("query", 'naïve "q"\n\\ 東京'))),
        None,
        None,
        [("search", '{"query": "naïve \\"q\\"\\n\\\\ 東京"}')],
    ),
    (
        "nested-schema-typing",
        None,
        block(invoke("typed", param("nested", '{"count": "4", "inner": {"flag": "0"}}', "false"))),
        None,
        None,
        [("typed", '{"nested": {"count": 4, "inner": {"flag": false}}}')],
    ),
    (
        "union-typing",
        None,
        block(invoke("typed", param("u", "7", "false"), param("any", "null", "false"))),
        None,
        None,
        [("typed", '{"u": 7, "any": null}')],
    ),
]


@pytest.mark.parametrize(
    ("kwargs", "text", "reasoning", "content", "calls"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_output(kwargs, text, reasoning, content, calls) -> None:
    whole, _ = parse("deepseek_v32", [text], kwargs=kwargs)
    assert without_ids(whole) == (reasoning, content, calls)
    per_char, deltas = parse("deepseek_v32", list(text), kwargs=kwargs)
    assert without_ids(per_char) == (reasoning, content, calls)
    assert streamed(deltas) == per_char


def test_without_tools_markup_is_content() -> None:
    text = block(invoke("get_current_date"))
    message, _ = parse("deepseek_v32", [text], tools=None)
    assert without_ids(message) == (None, text, [])


def test_parameters_stream_as_they_complete() -> None:
    chunks = [
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n',
        param("city", "Rome"),
        param("days", "2", "false"),
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
    ]
    _, deltas = parse("deepseek_v32", chunks)
    assert [[(d.name, d.arguments) for d in delta.tool_calls] for delta in deltas] == [
        [("get_weather", "")],
        [(None, '{"city": "Rome"')],
        [(None, ', "days": 2')],
        [(None, "}")],
        [],
    ]
