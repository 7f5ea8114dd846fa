"""Where the gateway's output parsers knowingly differ from vLLM 0.32's, and where vLLM's
own streams do not rebuild its whole answer: each named with its reason, for
`test_output_parsers` (docs/conformance.md, *The output parsers against vLLM's*).

A case in `DIFFERENCES` is pinned to what each side gives, so a change on either side
shows; a case in `VLLM_STREAM_DIFFERENCES` must still differ, so a vLLM that mends it
shows too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tests.real_vllm.vllm_output_parsing import message_json


@dataclass(frozen=True)
class Difference:
    """A case where the gateway knowingly answers otherwise than vLLM; both are pinned."""

    reason: str
    vllm: dict[str, Any]
    gateway: dict[str, Any]


def message(reasoning: str | None, content: str | None, *calls: tuple[str, str]) -> dict[str, Any]:
    """A message as the comparison writes it; each call is (name, arguments text)."""
    return message_json(reasoning, content, calls)


# Why the gateway's whole message differs from vLLM's (docs/conformance.md explains each).
SPACE_BEFORE_CALLS = (
    "GLM, content with leading whitespace, then calls: vLLM's whole answer strips the "
    "content, its stream keeps the leading whitespace; so does ours, whole and streamed, "
    "as it cannot know whether a call follows until the content has been sent"
)
MARKER_IN_VALUE = (
    "GLM, a value holding `</tool_call>`: vLLM ends the call there and loses the value "
    "(its stream then sends broken JSON); ours reads a value up to `</arg_value>`"
)
REPEATED_KEY = (
    "GLM, a key given twice: vLLM's whole answer keeps the last value, its stream the "
    "first (and broken JSON); ours keeps the first, as a sent pair cannot be taken back"
)
NO_TOOLS = (
    "GLM, calls in an answer to a request without tools: vLLM's whole answer keeps only "
    "the stripped text before the first call, its stream all the text around the calls, "
    'as both of vLLM\'s answers do for `tool_choice: "none"`; so does ours'
)
UNCLOSED_LAST_PARAMETER = (
    "DeepSeek, the last parameter without its closing tag: vLLM drops it, ours keeps it"
)
NON_FINITE = (
    "DeepSeek, `NaN` or `1e999` as an undeclared argument's JSON value: vLLM writes NaN "
    "and Infinity, which are not JSON; ours keeps the text"
)
CUT_IN_NAME = (
    "DeepSeek, output cut inside an invoke's name: vLLM calls a tool by the cut name; "
    "ours makes no call"
)
THINK_IN_REASONING = (
    "DeepSeek, `<think>` inside reasoning: vLLM's whole answer drops the reasoning before "
    "it, its streams keep it or drop only the tag, depending on the split; ours keeps it all"
)
BLOCK_WITHOUT_CALLS = (
    "DeepSeek, a DSML block that makes no call (cut off, empty, nameless): vLLM's whole "
    "answer gives the markup back as content, its stream drops it; so does ours"
)

DIFFERENCES: dict[str, Difference] = {
    "glm45/spec-one-per-line-glm45": Difference(
        SPACE_BEFORE_CALLS,
        vllm=message(
            "\nNeed the weather.",
            "Let me check.",
            ("get_weather", '{"city": "Beijing", "days": 3}'),
        ),
        gateway=message(
            "\nNeed the weather.",
            "\nLet me check.",
            ("get_weather", '{"city": "Beijing", "days": 3}'),
        ),
    ),
    "glm45/three-calls-one-per-line": Difference(
        SPACE_BEFORE_CALLS,
        vllm=message(
            "\nThree lookups.",
            "Looking up.",
            ("get_weather", '{"city": "Rome"}'),
            ("get_weather", '{"city": "Köln", "days": 5}'),
            ("get_current_date", "{}"),
        ),
        gateway=message(
            "\nThree lookups.",
            "\nLooking up.",
            ("get_weather", '{"city": "Rome"}'),
            ("get_weather", '{"city": "Köln", "days": 5}'),
            ("get_current_date", "{}"),
        ),
    ),
    "glm47/content-before-and-after": Difference(
        SPACE_BEFORE_CALLS,
        vllm=message(None, "Sure.", ("get_current_date", "{}")),
        gateway=message(None, "  Sure.", ("get_current_date", "{}")),
    ),
    "glm47/leading-whitespace-before-calls": Difference(
        SPACE_BEFORE_CALLS,
        vllm=message(None, "Sure.", ("get_current_date", "{}")),
        gateway=message(None, "\n\nSure.", ("get_current_date", "{}")),
    ),
    "glm47/marker-inside-value": Difference(
        MARKER_IN_VALUE,
        vllm=message(None, None, ("search", "{}")),
        gateway=message(None, None, ("search", '{"query": "x</tool_call><arg_key>"}')),
    ),
    "glm47/repeated-key-keeps-first": Difference(
        REPEATED_KEY,
        vllm=message(None, None, ("get_weather", '{"city": "B"}')),
        gateway=message(None, None, ("get_weather", '{"city": "A"}')),
    ),
    "glm47/call-without-tools-in-request-then-text": Difference(
        NO_TOOLS,
        vllm=message(None, "Let me look."),
        gateway=message(None, " Let me look.  then "),
    ),
    "deepseek_v32/last-parameter-without-closing-tag": Difference(
        UNCLOSED_LAST_PARAMETER,
        vllm=message(None, None, ("get_weather", "{}")),
        gateway=message(None, None, ("get_weather", '{"days": 2}')),
    ),
    "deepseek_v32/non-finite-json-stays-text": Difference(
        NON_FINITE,
        vllm=message(None, None, ("get_weather", '{"extra": NaN, "big": Infinity}')),
        gateway=message(None, None, ("get_weather", '{"extra": "NaN", "big": "1e999"}')),
    ),
    "deepseek_v32/truncated-in-invoke-tag": Difference(
        CUT_IN_NAME,
        vllm=message(None, "x", ("get_wea", "{}")),
        gateway=message(None, "x"),
    ),
    "deepseek_v32/think-tag-inside-reasoning": Difference(
        THINK_IN_REASONING,
        vllm=message("b", "c"),
        gateway=message("a<think>b", "c"),
    ),
    "deepseek_v32/truncated-after-block-opens": Difference(
        BLOCK_WITHOUT_CALLS,
        vllm=message(None, "Sure.\n\n<｜DSML｜function_calls>\n"),
        gateway=message(None, "Sure.\n\n"),
    ),
    "deepseek_v32/block-without-invokes": Difference(
        BLOCK_WITHOUT_CALLS,
        vllm=message(None, "Sure.\n\n<｜DSML｜function_calls>\n</｜DSML｜function_calls>"),
        gateway=message(None, "Sure.\n\n"),
    ),
    "deepseek_v32/invoke-without-a-name": Difference(
        BLOCK_WITHOUT_CALLS,
        vllm=message(
            None,
            'Sure.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="">\n'
            '<｜DSML｜parameter name="city" string="true">Rome</｜DSML｜parameter>\n'
            "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        ),
        gateway=message(None, "Sure.\n\n"),
    ),
}

# Why vLLM's own streams do not rebuild its whole message (docs/conformance.md).
STREAM_KEEPS_TEXT_AROUND_CALLS = (
    "GLM: the stream keeps the whitespace and the text between and after calls that the "
    "whole answer strips or drops"
)
STREAM_SENDS_BROKEN_ARGUMENTS = (
    "the stream sends argument fragments that the final arguments do not extend (a cut "
    "call, a value ended early, a repeated key, an unwrapped argument): the client "
    "rebuilds invalid JSON"
)
STREAM_MOVES_WHITESPACE = (
    "a whitespace-only piece held back by the stream comes out after the text that followed it"
)
STREAM_READS_THINK_OTHERWISE = "`<think>` is read otherwise by the stream, depending on the split"
STREAM_TAKES_THE_PROMPTS_WORD = (
    "GLM, `enable_thinking: false` with `thinking: true`: the template closes reasoning in "
    "the prompt, which the stream believes, while the whole answer reads reasoning"
)

VLLM_STREAM_DIFFERENCES: dict[str, str] = {
    "glm45/spec-one-per-line-glm45": STREAM_KEEPS_TEXT_AROUND_CALLS,
    "glm45/three-calls-one-per-line": STREAM_KEEPS_TEXT_AROUND_CALLS,
    "glm47/content-before-and-after": STREAM_KEEPS_TEXT_AROUND_CALLS,
    "glm47/text-before-between-and-after-calls": STREAM_KEEPS_TEXT_AROUND_CALLS,
    "glm47/leading-whitespace-before-calls": STREAM_KEEPS_TEXT_AROUND_CALLS,
    "glm47/call-without-tools-in-request-then-text": STREAM_KEEPS_TEXT_AROUND_CALLS,
    "glm47/truncated-call-keeps-complete-pairs": STREAM_SENDS_BROKEN_ARGUMENTS,
    "glm47/marker-inside-value": STREAM_SENDS_BROKEN_ARGUMENTS,
    "glm47/repeated-key-keeps-first": STREAM_SENDS_BROKEN_ARGUMENTS,
    "deepseek_v32/wrapped-arguments-as-text-unwrapped": STREAM_SENDS_BROKEN_ARGUMENTS,
    "deepseek_v32/wrapper-beside-another-argument-kept": STREAM_SENDS_BROKEN_ARGUMENTS,
    "deepseek_v32/leading-whitespace-before-calls": STREAM_MOVES_WHITESPACE,
    "glm47/reasoning-reopened-in-content": STREAM_READS_THINK_OTHERWISE,
    "deepseek_v32/think-tag-inside-reasoning": STREAM_READS_THINK_OTHERWISE,
    "glm47/thinking-on-if-either-switch-is": STREAM_TAKES_THE_PROMPTS_WORD,
    "deepseek_v32/truncated-after-block-opens": BLOCK_WITHOUT_CALLS,
    "deepseek_v32/block-without-invokes": BLOCK_WITHOUT_CALLS,
    "deepseek_v32/invoke-without-a-name": BLOCK_WITHOUT_CALLS,
}
