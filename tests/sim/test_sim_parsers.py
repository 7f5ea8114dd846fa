"""The simulated vLLM server's reasoning and tool-call parsers, in process: every scripted
output of tests/support/parser_fixtures.py, whole and split token by token."""

from __future__ import annotations

import json
from typing import Any

import pytest

from sim.tokenizers import load_vocab
from sim.vllm.engine import generate
from sim.vllm.parsers import NativeParser, ParserConfig
from tests.support.parser_fixtures import CASES, GLM_TOKENIZER, TOOLS, Case

# The vLLM flags each gateway output_parser corresponds to.
FLAGS = {
    "glm47": ParserConfig("glm45", "glm47", enable_auto_tool_choice=True),
    "glm45": ParserConfig("glm45", "glm45", enable_auto_tool_choice=True),
    "deepseek_v32": ParserConfig("deepseek_v3", "deepseek_v32", enable_auto_tool_choice=True),
}
VOCABS = {"glm": load_vocab(str(GLM_TOKENIZER)), "deepseek": load_vocab("deepseek")}

View = tuple[str | None, str | None, list[tuple[str, Any]]]


def _parser(case: Case, **extra: Any) -> NativeParser:
    options: dict[str, Any] = {"tools": TOOLS, "tool_choice": None}
    options.update(extra)
    return NativeParser(FLAGS[case.parser], chat_template_kwargs=case.template, **options)


def _pieces(case: Case) -> list[str]:
    vocab = VOCABS["deepseek" if case.parser == "deepseek_v32" else "glm"]
    ids = [*vocab.tokenizer.encode(case.output, add_special_tokens=False).ids, *vocab.eos_ids[:1]]
    return [step.text for step in generate(vocab, ids, None)]


def _expected(case: Case) -> View:
    return case.reasoning, case.content, [(c.name, c.arguments) for c in case.calls]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_whole_message(case: Case) -> None:
    parser = _parser(case)
    parser.feed(case.output)
    parser.finish()
    reasoning, content, calls = parser.message()
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    assert (reasoning, content, got) == _expected(case)
    assert all(c["id"].startswith("chatcmpl-tool-") and c["type"] == "function" for c in calls)
    assert parser.finish_reason("stop") == case.finish_reason


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_streamed_deltas_add_up(case: Case) -> None:
    parser = _parser(case)
    deltas = [parser.feed(piece) for piece in _pieces(case)] + [parser.finish()]
    reasoning = "".join(d.get("reasoning", "") for d in deltas) or None
    content = "".join(d.get("content", "") for d in deltas) or None
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert [c["index"] for c in calls] == list(range(len(calls)))
    got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    assert (reasoning, content, got) == _expected(case)
    whole = _parser(case)
    whole.feed(case.output)
    whole.finish()
    assert [c["function"]["arguments"] for c in calls] == [
        c["function"]["arguments"] for c in whole.message()[2]
    ]


def test_no_calls_without_auto_choice_or_with_choice_none() -> None:
    case = next(c for c in CASES if c.id == "glm5-content-then-call-no-thinking")
    choice_none = _parser(case, tool_choice="none")
    no_tool_parser = NativeParser(
        ParserConfig("glm45", "glm47"),
        tools=TOOLS,
        tool_choice=None,
        chat_template_kwargs=case.template,
    )
    for parser in (choice_none, no_tool_parser):
        parser.feed(case.output)
        parser.finish()
    # vLLM's GLM tool parser leaves the call out; without a tool parser it is text.
    assert choice_none.message() == (None, "Let me check. ", [])
    assert no_tool_parser.message() == (None, case.output, [])


def test_named_tool_choice_finishes_with_stop() -> None:
    case = next(c for c in CASES if c.id == "glm5-content-then-call-no-thinking")
    parser = _parser(case, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    parser.feed(case.output)
    parser.finish()
    assert parser.finish_reason("stop") == "stop"
    assert parser.finish_reason("length") == "length"
