"""What continuing an answer relies on, held to real vLLM: a prefill asked for
`return_token_ids` names the prompt's ids, and a greedy model given the prompt's ids and
the start of its own answer (chat: `kv_transfer_params.prompt_token_ids`; completions: the
ids as the prompt) generates the rest of that answer, token for token. The simulated vLLM
holds itself to the same (tests/sim/test_sim_vllm_answers.py)."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from router.throughput.continuation import StreamTrack
from tests.real_vllm.compare import Seen, masked, rejoined, sse_events
from tests.real_vllm.conftest import RealVllm

pytestmark = [pytest.mark.real_vllm, pytest.mark.e2e]

GREEDY = {"temperature": 0, "max_tokens": 24, "ignore_eos": True, "return_token_ids": True}
CHAT = {"messages": [{"role": "user", "content": "Tell me about the sea."}], **GREEDY}
COMPLETION = {"prompt": "The sea is", **GREEDY}


def post(real_vllm: RealVllm, path: str, body: dict[str, Any]) -> dict[str, Any]:
    response = httpx.post(
        f"{real_vllm.url}{path}", json={"model": real_vllm.model, **body}, timeout=120
    )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


@pytest.mark.parametrize("written", [1, 7, 23])
def test_a_chat_prompt_and_the_start_of_its_answer_continue_the_answer(
    real_vllm: RealVllm, written: int
) -> None:
    whole = post(real_vllm, "/v1/chat/completions", CHAT)
    prompt, output = whole["prompt_token_ids"], whole["choices"][0]["token_ids"]
    assert len(prompt) == whole["usage"]["prompt_tokens"] and len(output) == 24
    rest = post(
        real_vllm,
        "/v1/chat/completions",
        {
            **CHAT,
            "max_tokens": 24 - written,
            "kv_transfer_params": {"prompt_token_ids": [*prompt, *output[:written]]},
        },
    )
    assert rest["usage"]["prompt_tokens"] == len(prompt) + written
    assert rest["choices"][0]["token_ids"] == output[written:]


@pytest.mark.parametrize("written", [1, 7, 23])
def test_a_completions_prompt_and_the_start_of_its_answer_continue_the_answer(
    real_vllm: RealVllm, written: int
) -> None:
    whole = post(real_vllm, "/v1/completions", COMPLETION)
    choice = whole["choices"][0]
    prompt, output = choice["prompt_token_ids"], choice["token_ids"]
    assert len(prompt) == whole["usage"]["prompt_tokens"] and len(output) == 24
    rest = post(
        real_vllm,
        "/v1/completions",
        {**COMPLETION, "max_tokens": 24 - written, "prompt": [*prompt, *output[:written]]},
    )
    assert rest["choices"][0]["token_ids"] == output[written:]


def test_a_streamed_continuation_names_its_ids_chunk_by_chunk(real_vllm: RealVllm) -> None:
    """What a native-path continuation reads (`router.upstream.native_decode`): the chunks'
    `token_ids`, in order, are the rest of the answer, and the last names its finish."""
    whole = post(real_vllm, "/v1/completions", COMPLETION)
    choice = whole["choices"][0]
    prompt, output = choice["prompt_token_ids"], choice["token_ids"]
    body = {
        **COMPLETION,
        "model": real_vllm.model,
        "prompt": [*prompt, *output[:7]],
        "max_tokens": 24 - 7,
        "stream": True,
    }
    ids: list[int] = []
    finishes = []
    with httpx.stream("POST", f"{real_vllm.url}/v1/completions", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[len("data: ") :])["choices"][0]
                ids += chunk["token_ids"]
                finishes.append(chunk["finish_reason"])
    assert ids == output[7:]
    assert finishes[-1] == "length" and set(finishes[:-1]) <= {None}


def _streamed(real_vllm: RealVllm, path: str, body: dict[str, Any]) -> bytes:
    body = {**body, "model": real_vllm.model, "stream": True}
    with httpx.stream("POST", f"{real_vllm.url}{path}", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        return b"".join(reply.iter_raw())


def _as_sent(stream: bytes) -> Seen:
    """A stream's events, each checked to be written as vLLM writes it (one `data: ` line
    of compact JSON, then a blank line), rejoined where vLLM cut it (`compare.rejoined`: a
    busy vLLM sends what several steps gave in one chunk, so where one stream's chunks end
    says nothing of another's)."""
    *events, end = stream.split(b"\n\n")
    assert end == b"" and events[-1] == b"data: [DONE]"
    for event in events[:-1]:
        data = event.removeprefix(b"data: ")
        compact = json.dumps(json.loads(data), separators=(",", ":"), ensure_ascii=False)
        assert compact.encode() == data, "no byte more or less than vLLM's"
    chunks = [masked(event) for event in sse_events(stream.decode())]
    return rejoined(Seen(200, "text/event-stream", chunks))


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/chat/completions", CHAT), ("/v1/completions", COMPLETION)]
)
def test_a_stream_asked_for_its_ids_is_the_plain_stream_once_they_are_taken_out(
    real_vllm: RealVllm, path: str, body: dict[str, Any]
) -> None:
    """What the native path's decode leg relies on (`router.throughput.continuation`): asked
    for `return_token_ids`, vLLM streams the same chunks, each naming its ids (the first the
    prompt's); with the ids taken out the client gets the stream it asked for (each chunk
    written as vLLM writes it, the same kinds of chunk and the same text), and the ids read
    on the way are the answer's."""
    plain = {k: v for k, v in body.items() if k != "return_token_ids"}
    whole = post(real_vllm, path, body)
    expected = _streamed(real_vllm, path, plain)
    track = StreamTrack(keep_ids=False)
    shown = track.feed(_streamed(real_vllm, path, body))
    assert _as_sent(shown) == _as_sent(expected)
    prompt = whole.get("prompt_token_ids") or whole["choices"][0]["prompt_token_ids"]
    assert track.prompt_ids == prompt
    assert track.output_ids == whole["choices"][0]["token_ids"]
    assert track.done and track.finished and track.lost is None
