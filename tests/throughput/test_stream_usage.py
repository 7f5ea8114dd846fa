"""The usage the gateway asks a native stream for, and takes out of the client's stream."""

from __future__ import annotations

import orjson
import pytest

from router.openai.endpoints import ENDPOINTS
from router.throughput.stream_usage import UsageChunkDropper, asks_for_usage, with_usage
from tests.throughput.support import routed

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def event(payload: dict[str, object]) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def delta(text: str) -> bytes:
    return event({"id": "c", "choices": [{"index": 0, "delta": {"content": text}}]})


FINISH = {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
USAGE = {"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}}
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("body", "asked"),
    [
        (CHAT, True),
        ({**CHAT, "stream": False}, False),
        ({**CHAT, "stream_options": {"include_usage": True}}, False),
        ({**CHAT, "stream_options": {"continuous_usage_stats": True}}, False),
        ({**CHAT, "n": 2}, False),
    ],
    ids=["stream", "whole", "asked by the client", "continuous alone", "several choices"],
)
def test_usage_is_asked_for_a_single_stream_whose_client_did_not(body: dict, asked: bool) -> None:
    request = routed(body)
    request.parsed = ENDPOINTS["chat"].request.model_validate(body)  # stream_options read
    assert asks_for_usage(request) is asked


def test_the_body_sent_asks_and_the_client_s_is_left_as_it_came() -> None:
    body = {**CHAT, "stream_options": {"continuous_usage_stats": False}}
    sent = with_usage(body)
    assert sent["stream_options"] == {"continuous_usage_stats": False, "include_usage": True}
    assert body["stream_options"] == {"continuous_usage_stats": False}


def stream_through(dropper: UsageChunkDropper, chunks: list[bytes]) -> bytes:
    return b"".join(dropper.feed(chunk) for chunk in chunks) + dropper.flush()


def test_the_usage_chunk_goes_and_its_fingerprint_returns_to_the_finishing_chunk() -> None:
    sent = delta("a") + event(FINISH) + event({**USAGE, "system_fingerprint": "fp"}) + DONE
    # Split everywhere, one byte at a time included.
    for size in (1, 7, len(sent)):
        chunks = [sent[i : i + size] for i in range(0, len(sent), size)]
        out = stream_through(UsageChunkDropper(), chunks)
        assert out == delta("a") + event({**FINISH, "system_fingerprint": "fp"}) + DONE


def test_a_stream_without_a_usage_chunk_passes_unchanged() -> None:
    sent = [delta("a"), event(FINISH), DONE]
    assert stream_through(UsageChunkDropper(), sent) == b"".join(sent)


def test_a_stream_cut_after_its_finishing_chunk_still_sends_it() -> None:
    assert stream_through(UsageChunkDropper(), [delta("a"), event(FINISH)]) == delta("a") + event(
        FINISH
    )


class Upper:
    def feed(self, chunk: bytes) -> bytes:
        return chunk.replace(b'"a"', b'"A"')

    def flush(self) -> bytes:
        return b""


def test_the_inner_filter_runs_first() -> None:
    out = stream_through(UsageChunkDropper(Upper()), [delta("a"), event(USAGE), DONE])
    assert out == delta("A") + DONE


def test_an_event_past_the_bound_goes_on_as_it_comes_after_the_finishing_chunk() -> None:
    """An upstream that never ends an event: it is no usage chunk, so the finishing chunk
    held before it goes out, then its bytes as they arrive, never held past the bound."""
    dropper = UsageChunkDropper(max_pending=100)
    piece = b"data: " + b"x" * 24  # 30 bytes, never an event's end
    assert dropper.feed(delta("a") + event(FINISH)) == delta("a")
    assert [dropper.feed(piece) for _ in range(3)] == [b"", b"", b""]
    assert dropper.feed(piece) == event(FINISH) + piece * 4
    assert dropper.feed(piece) == piece
    after = delta("b") + event(USAGE) + DONE
    assert dropper.feed(b"\n\n" + after) == b"\n\n" + delta("b") + DONE
    assert dropper.flush() == b""


def test_a_long_event_in_tiny_chunks_costs_each_chunk_its_own_size() -> None:
    """Held bytes are joined once, at the event's end (200,000 chunks of 5 bytes)."""
    usage_chunk = event({**USAGE, "pad": "p" * 999_800})
    sent = delta("a") + usage_chunk + DONE
    out = stream_through(UsageChunkDropper(), [sent[i : i + 5] for i in range(0, len(sent), 5)])
    assert out == delta("a") + DONE
