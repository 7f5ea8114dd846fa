"""The scripted output: directives, filler, chat template, plans."""

import base64

import pytest

from sim.script import (
    Plan,
    chat_prompt_text,
    continued,
    filler_ids,
    plan_chat,
    plan_completion,
    render_chat,
    scripted_text,
)
from sim.tokenizers import Vocab, load_vocab

TEXTS = [
    "Hello, café naïve 日本語 🙂",
    "<think>plan it</think>Answer.<tool_call>get_weather<arg_key>city</arg_key>"
    "<arg_value>北京</arg_value></tool_call>",
    'Checking.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="f">\n'
    '<｜DSML｜parameter name="q" string="true">café</｜DSML｜parameter>\n'
    "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
]


@pytest.fixture(scope="module", params=["deepseek", "glm"])
def vocab(request: pytest.FixtureRequest) -> Vocab:
    return load_vocab(request.param)


@pytest.mark.parametrize("text", TEXTS)
def test_directive_yields_exactly_the_text_then_eos(vocab: Vocab, text: str) -> None:
    plan = plan_chat(
        vocab, [{"role": "user", "content": f"go [[sim-output]]{text}[[/sim-output]]"}], 8
    )
    assert plan.scripted
    assert plan.output_ids[-1] == vocab.eos_ids[0]
    assert vocab.decode(plan.output_ids[:-1]) == text


def test_special_tokens_in_the_text_are_single_tokens(vocab: Vocab) -> None:
    plan = plan_completion(vocab, "[[sim-output]]a<think>b[[/sim-output]]", 8)
    think = vocab.tokenizer.token_to_id("<think>")
    assert think in plan.output_ids


def test_base64_directive(vocab: Vocab) -> None:
    text = "[[sim-output]] is awkward ]] 🙂"
    encoded = base64.b64encode(text.encode()).decode()
    assert scripted_text(f"x [[sim-output-b64]]{encoded}[[/sim-output-b64]] y") == text


def test_no_directive_means_no_script() -> None:
    assert scripted_text("plain prompt") is None


def test_filler_is_deterministic_exact_length_and_varied(vocab: Vocab) -> None:
    first = filler_ids(vocab, "seed", 200)
    assert first == filler_ids(vocab, "seed", 200)
    assert first != filler_ids(vocab, "other seed", 200)
    assert len(first) == 200
    text = vocab.decode(first)
    assert "\ufffd" not in text
    assert any(ord(c) > 0x2000 for c in text)  # CJK or emoji
    assert any(0x80 <= ord(c) < 0x2000 for c in text)  # accented Latin


def test_filler_plan_length_is_the_default(vocab: Vocab) -> None:
    plan = plan_completion(vocab, "tell me something", 48)
    assert not plan.scripted
    assert len(plan.output_ids) == 49
    assert plan.output_ids[-1] in vocab.eos_ids


def test_chat_text_and_template() -> None:
    messages = [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hi "},
                {"type": "image_url"},
                {"type": "text", "text": "there"},
            ],
        },
    ]
    assert chat_prompt_text(messages) == "Be brief.Hi there"
    assert render_chat(messages) == "<|system|>\nBe brief.\n<|user|>\nHi there\n<|assistant|>\n"


def test_directive_split_across_messages_is_found() -> None:
    messages = [
        {"role": "system", "content": "[[sim-output]]ab"},
        {"role": "user", "content": "c[[/sim-output]]"},
    ]
    assert scripted_text(chat_prompt_text(messages)) == "abc"


def test_prompt_token_count_uses_the_template(vocab: Vocab) -> None:
    messages = [{"role": "user", "content": "Hello"}]
    assert plan_chat(vocab, messages, 4).prompt_ids == vocab.encode(render_chat(messages))


@pytest.mark.parametrize("prompt", [["first", "second"], "first"])
def test_completion_prompt_forms(vocab: Vocab, prompt: object) -> None:
    assert plan_completion(vocab, prompt, 4).prompt_ids == vocab.encode("first")


def test_completion_prompt_as_token_ids(vocab: Vocab) -> None:
    ids = vocab.encode("some words")
    plan = plan_completion(vocab, ids, 4)
    assert plan.prompt_ids == ids
    assert plan == plan_completion(vocab, [ids], 4)


GO = [{"role": "user", "content": "go [[sim-output]]Hello, café naïve 日本語 🙂[[/sim-output]]"}]
FILLER = [{"role": "user", "content": "tell me something"}]


@pytest.mark.parametrize("messages", [GO, FILLER], ids=["scripted", "filler"])
def test_a_chat_context_with_part_of_its_answer_continues_the_answer(
    vocab: Vocab, messages: list[dict[str, str]]
) -> None:
    plan = plan_chat(vocab, messages, 16)
    output = plan.output_ids
    for written in range(1, len(output)):
        context = plan.prompt_ids + output[:written]
        assert continued(plan, context) == Plan(context, output[written:], plan.scripted)
    diverged = [*plan.prompt_ids, output[0] + 1]
    assert continued(plan, diverged).output_ids == output  # not its answer: as it was
    assert continued(plan, plan.prompt_ids).output_ids == output


@pytest.mark.parametrize("prompt", ["go [[sim-output]]Hello, café 🙂[[/sim-output]]", "say it"])
def test_a_completion_of_a_prompt_and_part_of_its_answer_continues_the_answer(
    vocab: Vocab, prompt: str
) -> None:
    plan = plan_completion(vocab, prompt, 16)
    output = plan.output_ids
    for written in range(1, len(output)):
        ids = [*plan.prompt_ids, *output[:written]]
        assert plan_completion(vocab, ids, 16).output_ids == output[written:]
    assert plan_completion(vocab, plan.prompt_ids, 16).output_ids == output
