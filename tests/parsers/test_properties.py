"""Property tests: the split of the text into deltas never changes the result.

For generated outputs (well-formed, truncated anywhere, or sprinkled with marker
fragments) every split gives the message a single feed gives, the streamed deltas
add up to that message, and every call carries valid JSON for a named tool (GLM's only
for a requested one).
"""

from __future__ import annotations

import json
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from .support import TOOLS, parse, streamed, without_ids

TOOL_NAMES = {tool["function"]["name"] for tool in TOOLS}
KEYS = [
    *("city", "days", "query", "filters", "strict", "s", "i", "u", "nested", "ints", "extra"),
    "arguments",  # DeepSeek unwraps it when it is a call's only argument
]
NAMES = [*sorted(TOOL_NAMES), "unknown_tool"]

# Fragments chosen to look like the start of markers without being one.
TRICKY = [
    "<",
    ">",
    "/",
    "</",
    "<tool",
    "</arg_",
    "<think",
    "</thi",
    "<｜DSML｜",
    "｜",
    "</｜DSML｜",
]
PLAIN = ["a", " ", "\n", "é", "東", '"', "\\", "{", "}", "1", "true", "null", "[1, 2]"]
text = st.lists(st.sampled_from(PLAIN + TRICKY), max_size=8).map("".join)
value = st.one_of(
    text,
    st.sampled_from(
        ["3", " 42 ", "true", "null", '{"count": "2"}', '["1", 2]', "1.5", "北京", "NaN", "1e999"]
    ),
)
space = st.sampled_from(["", "\n", " \n"])
thinking = st.sampled_from([None, {"enable_thinking": False}, {"thinking": True}])


@st.composite
def glm_outputs(draw: st.DrawFn) -> str:
    parts = [draw(space)]
    if draw(st.booleans()):
        parts += [draw(st.sampled_from(["", "<think>"])), draw(text), "</think>"]
    parts.append(draw(text))
    for _ in range(draw(st.integers(0, 3))):
        sep = draw(space)
        parts += [sep, "<tool_call>", draw(st.sampled_from(NAMES)), sep]
        for _ in range(draw(st.integers(0, 3))):
            key = draw(st.sampled_from(KEYS))
            parts += [
                f"<arg_key>{key}</arg_key>",
                sep,
                f"<arg_value>{draw(value)}</arg_value>",
                sep,
            ]
        parts.append("</tool_call>")
    parts.append(draw(text))
    return _maybe_cut(draw, "".join(parts))


@st.composite
def dsml_outputs(draw: st.DrawFn) -> str:
    parts = []
    if draw(st.booleans()):
        parts += [draw(text), "</think>"]
    parts.append(draw(text))
    calls = draw(st.integers(0, 3))
    wrapped = draw(st.booleans())
    if calls and wrapped:
        parts.append("\n\n<｜DSML｜function_calls>\n")
    for _ in range(calls):
        parts.append(f'<｜DSML｜invoke name="{draw(st.sampled_from(NAMES))}">\n')
        for _ in range(draw(st.integers(0, 3))):
            attr = draw(st.sampled_from(["true", "false", None]))
            attrs = "" if attr is None else f' string="{attr}"'
            key = draw(st.sampled_from(KEYS))
            close = draw(st.sampled_from(["</｜DSML｜parameter>", ""]))
            parts.append(f'<｜DSML｜parameter name="{key}"{attrs}>{draw(value)}{close}\n')
        parts.append("</｜DSML｜invoke>\n")
    if calls and wrapped:
        parts.append("</｜DSML｜function_calls>")
    parts.append(draw(text))
    return _maybe_cut(draw, "".join(parts))


def _maybe_cut(draw: st.DrawFn, output: str) -> str:
    if draw(st.booleans()):
        return output
    return output[: draw(st.integers(0, len(output)))]


@st.composite
def splits(draw: st.DrawFn, output: str) -> list[str]:
    cuts = sorted(draw(st.sets(st.integers(0, len(output)), max_size=24)))
    bounds = [0, *cuts, len(output)]
    return [output[a:b] for a, b in pairwise(bounds)]


def _check(name: str, output: str, kwargs, data: st.DataObject, tools: set[str]) -> None:
    whole, _ = parse(name, [output], kwargs=kwargs)
    for chunks in (list(output), data.draw(splits(output))):
        message, deltas = parse(name, chunks, kwargs=kwargs)
        assert without_ids(message) == without_ids(whole)
        assert streamed(deltas) == message
    for call in whole.tool_calls:
        assert call.name in tools
        assert isinstance(json.loads(call.arguments, parse_constant=_invalid), dict)


def _invalid(constant: str) -> None:
    raise AssertionError(f"{constant} is not JSON")


@settings(max_examples=300, deadline=None)
@given(
    output=glm_outputs(),
    variant=st.sampled_from(["glm45", "glm47"]),
    kwargs=thinking,
    data=st.data(),
)
def test_glm_split_invariance(output: str, variant: str, kwargs, data: st.DataObject) -> None:
    _check(variant, output, kwargs, data, TOOL_NAMES)


@settings(max_examples=300, deadline=None)
@given(output=dsml_outputs(), kwargs=thinking, data=st.data())
def test_deepseek_split_invariance(output: str, kwargs, data: st.DataObject) -> None:
    _check("deepseek_v32", output, kwargs, data, set(NAMES))
