"""Latency-path logprobs: which logprob each token gets, and OpenAI's two shapes."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from router.latency.logprobs import UNAVAILABLE, LogprobTrack
from router.openai.render import AnswerHead, ChatRenderer, CompletionRenderer, TokenLogprob, Usage
from router.parsers import ParsedDelta, ParsedMessage
from router.tokens.tokenizer import load_tokenizer
from router.upstream.tilert import TokenLine
from router.upstream.vllm import Prefilled


@pytest.fixture(scope="module")
def tokenizer():  # type: ignore[no-untyped-def]
    return load_tokenizer("deepseek", base_dir=Path(".")).tokenizer


def prefilled(first: int, logprob: float | None, top: tuple[tuple[int, float], ...]) -> Prefilled:
    return Prefilled("chatcmpl-1", 1, first, 3, "length", None, logprob, top)


def test_the_first_token_takes_the_prefills_logprob_the_rest_the_nodes(tokenizer) -> None:  # type: ignore[no-untyped-def]
    hello, world, bang = tokenizer.encode("Hello world!", add_special_tokens=False).ids
    track = LogprobTrack(
        tokenizer, prefilled(hello, -0.5, ((hello, -0.5), (bang, -2.0))), 1, keep=True
    )
    # 0.1.6 may leave the first token's entry empty; the prefill sampled it and knows it.
    track.add(TokenLine([hello], [None], [[]]), 1)
    track.add(TokenLine([world, bang], [-0.25, float("-inf")], [[[world, -0.25]], []]), 2)
    entries = track.take()
    assert [e.token for e in entries] == ["Hello", " world", "!"]
    assert [e.logprob for e in entries] == [-0.5, -0.25, UNAVAILABLE]
    assert entries[0].top == (("Hello", -0.5),)  # top_n 1: the best candidate only
    assert entries[1].top == ((" world", -0.25),)
    assert track.take() == []
    assert len(track.all) == 3


def test_after_a_continuation_its_prefill_gives_the_next_tokens_logprob(tokenizer) -> None:  # type: ignore[no-untyped-def]
    hello, world, bang = tokenizer.encode("Hello world!", add_special_tokens=False).ids
    track = LogprobTrack(tokenizer, prefilled(hello, -0.5, ()), 1, keep=True)
    track.add(TokenLine([hello], [None], [[]]), 1)
    # The node failed; another's prefill sampled the next token, and its node leaves that
    # token's entry empty as the first node did.
    track.resumed(prefilled(world, -0.75, ((world, -0.75),)))
    track.add(TokenLine([world, bang], [None, -1.0], [[], [[bang, -1.0]]]), 2)
    assert [(e.token, e.logprob) for e in track.take()] == [
        ("Hello", -0.5),
        (" world", -0.75),
        ("!", -1.0),
    ]


def test_only_the_tokens_the_relay_counted_get_an_entry(tokenizer) -> None:  # type: ignore[no-untyped-def]
    track = LogprobTrack(tokenizer, prefilled(1, -0.1, ()), 0, keep=False)
    track.add(TokenLine([1, 2, 3], [-0.1, -0.2, -0.3], [[], [], []]), 2)  # a stop at the 2nd
    assert [e.logprob for e in track.take()] == [-0.1, -0.2]
    assert track.all == []


def test_a_node_without_logprobs_gives_the_unavailable_value(tokenizer) -> None:  # type: ignore[no-untyped-def]
    track = LogprobTrack(tokenizer, prefilled(1, -0.1, ()), 2, keep=False)
    track.add(TokenLine([1, 2]), 2)
    assert [(e.logprob, e.top) for e in track.take()] == [(-0.1, ()), (UNAVAILABLE, ())]


ENTRIES = [
    TokenLogprob("Hi", -0.5, (("Hi", -0.5), ("Hey", -1.5))),
    TokenLogprob(" é", -0.25, ()),
]


def test_chat_logprobs_have_openais_shape() -> None:
    renderer = ChatRenderer(AnswerHead(response_id="chatcmpl-1", created=1, model="m"))
    chunk = renderer.delta(ParsedDelta(content="Hi é"), None, ENTRIES)
    assert chunk is not None
    choice = orjson.loads(chunk.removeprefix(b"data: "))["choices"][0]
    assert choice["logprobs"] == {
        "content": [
            {
                "token": "Hi",
                "logprob": -0.5,
                "bytes": [72, 105],
                "top_logprobs": [
                    {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]},
                    {"token": "Hey", "logprob": -1.5, "bytes": [72, 101, 121]},
                ],
            },
            {"token": " é", "logprob": -0.25, "bytes": [32, 195, 169], "top_logprobs": []},
        ]
    }
    body = renderer.response(ParsedMessage("", "Hi é", []), "stop", None, Usage(1, 2), ENTRIES)
    assert body["choices"][0]["logprobs"]["content"][1]["token"] == " é"
    assert (
        renderer.response(ParsedMessage("", "", []), "stop", None, Usage(1, 2))["choices"][0][
            "logprobs"
        ]
        is None
    )


def test_completion_logprobs_count_text_offsets_across_chunks() -> None:
    renderer = CompletionRenderer(AnswerHead(response_id="cmpl-1", created=1, model="m"))
    first = renderer.delta(ParsedDelta(content="Hi"), None, ENTRIES[:1])
    second = renderer.delta(ParsedDelta(content=" é"), None, ENTRIES[1:])
    assert first is not None and second is not None
    logprobs = [
        orjson.loads(c.removeprefix(b"data: "))["choices"][0]["logprobs"] for c in (first, second)
    ]
    assert logprobs[0] == {
        "text_offset": [0],
        "token_logprobs": [-0.5],
        "tokens": ["Hi"],
        "top_logprobs": [{"Hi": -0.5, "Hey": -1.5}],
    }
    assert logprobs[1]["text_offset"] == [2]


def test_a_chunk_with_logprobs_but_no_text_is_still_sent() -> None:
    renderer = ChatRenderer(AnswerHead(response_id="chatcmpl-1", created=1, model="m"))
    assert renderer.delta(ParsedDelta(), None, []) is None
    assert renderer.delta(ParsedDelta(), None, ENTRIES) is not None
