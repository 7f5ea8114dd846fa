"""Prompt token counting for the rules: real chat templates, and clients unable to break
them with their `chat_template_kwargs`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router.tokens import segments
from router.tokens.prompt_tokens import PromptCounter, render_chat
from router.tokens.tokenizer import load_tokenizer, tokenizer_path

ROOT = Path(__file__).resolve().parents[2]


def counter(spec: str) -> PromptCounter:
    return PromptCounter(load_tokenizer(spec, base_dir=ROOT), tokenizer_path(spec, base_dir=ROOT))


GLM = counter("sim/fixtures/glm")
DEEPSEEK = counter("deepseek")
CHAT = {"messages": [{"role": "user", "content": "hello there, how are you?"}]}


@pytest.mark.parametrize(
    "kwargs",
    [{"tokenize": True}, {"add_generation_prompt": False}, {"conversation": []}, "junk", None],
)
def test_template_parameters_cannot_be_overridden(kwargs: object) -> None:
    assert GLM.count_now("chat", {**CHAT, "chat_template_kwargs": kwargs}) == GLM.count_now(
        "chat", CHAT
    )


TOOLS = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    "body",
    [
        CHAT,
        {**CHAT, "tools": TOOLS},
        {**CHAT, "chat_template_kwargs": {"enable_thinking": False}},
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather?"},
                {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"type": "function", "function": {"name": "w", "arguments": {"a": 1}}}
                    ],
                },
                {"role": "tool", "content": "sunny"},
            ],
            "tools": TOOLS,
        },
    ],
    ids=["plain", "tools", "kwargs", "tool turn"],
)
def test_the_template_counts_what_transformers_apply_chat_template_makes(body: dict) -> None:
    from transformers import PreTrainedTokenizerFast

    path = tokenizer_path("sim/fixtures/glm", base_dir=ROOT)
    config = json.loads((path.parent / "tokenizer_config.json").read_text())
    hf = PreTrainedTokenizerFast(tokenizer_file=str(path), chat_template=config["chat_template"])
    expected = hf.apply_chat_template(
        body["messages"],
        tools=body.get("tools"),
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
        **body.get("chat_template_kwargs", {}),
    )
    assert GLM.count_now("chat", body) == len(expected)


def test_a_template_refusing_the_request_falls_back_to_the_approximation() -> None:
    body = {"messages": [{"role": "wizard", "content": "hello"}]}
    assert GLM.count_now("chat", body) > 0


def test_without_a_template_the_approximate_rendering_is_counted() -> None:
    tokenizer = load_tokenizer("deepseek", base_dir=ROOT).tokenizer
    expected = len(tokenizer.encode(render_chat(CHAT), add_special_tokens=False).ids)
    assert DEEPSEEK.count_now("chat", CHAT) == expected


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [([1, 2, 3], 3), ([[4, 5]], 2), ([], 0)],
)
def test_completion_prompts_given_as_token_ids(prompt: object, expected: int) -> None:
    assert DEEPSEEK.count_now("completions", {"prompt": prompt}) == expected


async def test_count_runs_in_a_thread_and_agrees() -> None:
    assert await DEEPSEEK.count("chat", CHAT) == DEEPSEEK.count_now("chat", CHAT)


SENTENCE = "Prefill and decode run apart; 预填充和解码分离以后 🙂 the KV cache moves over RDMA. "


def test_a_long_text_counted_in_slices_agrees_with_one_encoding() -> None:
    tokenizer = load_tokenizer("deepseek", base_dir=Path(".")).tokenizer
    text = SENTENCE * 3000  # about 250k characters: four slices and more
    whole = len(tokenizer.encode(text, add_special_tokens=False).ids)
    slices = -(-len(text) // (segments.SLICE_CHARS // 2))
    assert abs(segments.SegmentEncoder(tokenizer).count([text]) - whole) <= slices


def test_counting_stops_at_the_cap() -> None:
    tokenizer = load_tokenizer("deepseek", base_dir=Path(".")).tokenizer
    text = SENTENCE * 20_000
    whole = segments.SegmentEncoder(tokenizer).count([text])
    encoder = segments.SegmentEncoder(tokenizer)
    capped = encoder.count([text], cap=10_000)
    assert 10_000 <= capped < whole / 4
    assert encoder.encoded_chars <= segments.BATCH_CHARS, "past the cap nothing is encoded"
