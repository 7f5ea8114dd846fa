"""The comparison of two answers used by the real-vLLM tests: a stream vLLM cut
differently under load is the same stream once rejoined; one that says something else is
not."""

from __future__ import annotations

from typing import Any

from tests.real_vllm.compare import Seen, rejoined

SSE = "text/event-stream"


def completion_chunk(text: str, finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return {"id": "<id>", "object": "text_completion", "created": "<time>", "choices": [choice]}


def chat_chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return {"id": "<id>", "object": "chat.completion.chunk", "choices": [choice]}


def stream(*events: Any) -> Seen:
    return Seen(200, SSE, [*events, "[DONE]"])


def test_a_stream_cut_differently_is_the_same_once_rejoined() -> None:
    one_per_token = stream(
        completion_chunk(" is"),
        completion_chunk(" is"),  # the same token twice: both are kept
        completion_chunk("r"),
        completion_chunk("", "length"),
    )
    two_in_one = stream(
        completion_chunk(" is is"),
        completion_chunk("r"),
        completion_chunk("", "length"),
    )
    assert one_per_token != two_in_one
    assert rejoined(one_per_token) == rejoined(two_in_one)
    assert rejoined(one_per_token).body[0]["choices"][0]["text"] == " is isr"


def test_other_text_or_another_finish_still_differs() -> None:
    said = stream(completion_chunk(" is"), completion_chunk("r"), completion_chunk("", "length"))
    other_text = stream(
        completion_chunk(" is"), completion_chunk("x"), completion_chunk("", "length")
    )
    other_finish = stream(
        completion_chunk(" is"), completion_chunk("r"), completion_chunk("", "stop")
    )
    assert rejoined(said) != rejoined(other_text)
    assert rejoined(said) != rejoined(other_finish)


def test_chat_deltas_join_their_content_and_keep_the_role_chunk_apart() -> None:
    cut = stream(
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Hel"}),
        chat_chunk({"content": "lo"}),
        chat_chunk({"content": ""}, "stop"),
    )
    whole = stream(
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Hello"}),
        chat_chunk({"content": ""}, "stop"),
    )
    assert rejoined(cut) == rejoined(whole)
    assert rejoined(cut).body[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


def test_the_last_tokens_sent_with_the_finish_or_before_it_are_the_same_once_rejoined() -> None:
    apart = stream(
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Hel"}),
        chat_chunk({"content": "lo"}, "length"),
    )
    together = stream(
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Hello"}, "length"),
    )
    finish_alone = stream(
        chat_chunk({"role": "assistant", "content": ""}),
        chat_chunk({"content": "Hello"}),
        chat_chunk({"content": ""}, "length"),
    )
    assert rejoined(apart) == rejoined(together) == rejoined(finish_alone)
    assert rejoined(apart).body[1]["choices"][0] == {
        "index": 0,
        "delta": {"content": "Hello"},
        "logprobs": None,
        "finish_reason": "length",
    }


def test_fields_vllm_sends_empty_in_some_chunks_only_do_not_keep_them_apart() -> None:
    """A chat stream's `stop_reason` comes with the finish only, a completion stream's
    `prompt_token_ids` with the first text only and its fingerprint with the finish:
    either way cut, the same stream."""
    ending = chat_chunk({"content": "ldZ"}, "length")
    ending["choices"][0]["stop_reason"] = None
    whole = chat_chunk({"content": "cZldZldZ"}, "length")
    whole["choices"][0]["stop_reason"] = None
    cut = stream(chat_chunk({"content": "cZldZ"}), ending)
    assert rejoined(cut) == rejoined(stream(whole))
    first = completion_chunk(" /a")
    first["choices"][0]["prompt_token_ids"] = None
    joined = completion_chunk(" /a /", "length")
    joined["choices"][0]["prompt_token_ids"] = None
    ending = {**completion_chunk(" /", "length"), "system_fingerprint": "vllm-0.32.0"}
    cut = stream(first, ending)
    joined = {**joined, "system_fingerprint": "vllm-0.32.0"}
    assert rejoined(cut) == rejoined(stream(joined))
    assert rejoined(cut) != rejoined(stream(completion_chunk(" /a /", "length")))


def with_usage(chunk: dict[str, Any], completion_tokens: int) -> dict[str, Any]:
    usage = {"prompt_tokens": 13, "total_tokens": 13 + completion_tokens}
    return {**chunk, "usage": {**usage, "completion_tokens": completion_tokens}}


def test_a_continuous_usage_is_the_later_chunks_once_rejoined() -> None:
    role = with_usage(chat_chunk({"role": "assistant", "content": ""}), 0)
    apart = stream(
        role,
        with_usage(chat_chunk({"content": "c"}), 1),
        with_usage(chat_chunk({"content": "Z"}), 2),
        with_usage(chat_chunk({"content": ""}, "length"), 2),
    )
    together = stream(
        role,
        with_usage(chat_chunk({"content": "cZ"}), 2),
        with_usage(chat_chunk({"content": ""}, "length"), 2),
    )
    assert rejoined(apart) == rejoined(together)
    assert rejoined(apart).body[1]["usage"]["completion_tokens"] == 2
    miscounted = stream(
        role,
        with_usage(chat_chunk({"content": "cZ"}), 2),
        with_usage(chat_chunk({"content": ""}, "length"), 3),
    )
    assert rejoined(miscounted) != rejoined(apart)


def logprob(token: str, value: float) -> dict[str, Any]:
    return {"token": token, "logprob": value, "bytes": list(token.encode()), "top_logprobs": []}


def with_logprobs(chunk: dict[str, Any], *entries: dict[str, Any]) -> dict[str, Any]:
    chunk["choices"][0]["logprobs"] = {"content": list(entries)}
    return chunk


def test_tokens_sent_together_keep_their_logprobs_in_order_once_rejoined() -> None:
    hel, lo = logprob("Hel", -0.5), logprob("lo", -1.25)
    apart = stream(
        chat_chunk({"role": "assistant", "content": ""}),
        with_logprobs(chat_chunk({"content": "Hel"}), hel),
        with_logprobs(chat_chunk({"content": "lo"}, "length"), lo),
    )
    together = stream(
        chat_chunk({"role": "assistant", "content": ""}),
        with_logprobs(chat_chunk({"content": "Hello"}, "length"), hel, lo),
    )
    assert rejoined(apart) == rejoined(together)
    assert rejoined(apart).body[1]["choices"][0]["logprobs"] == {"content": [hel, lo]}
    other_value = stream(
        chat_chunk({"role": "assistant", "content": ""}),
        with_logprobs(chat_chunk({"content": "Hello"}, "length"), hel, logprob("lo", -2.0)),
    )
    assert rejoined(other_value) != rejoined(apart)
