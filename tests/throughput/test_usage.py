"""The cached_tokens rewrite: only whole-prompt reports change, only usage events are parsed."""

from __future__ import annotations

import orjson
import pytest

from router.throughput.usage import CachedTokensRewriter, rewrite_usage

from .support import sse


def usage(prompt: int, cached: int | None) -> dict:
    details = None if cached is None else {"cached_tokens": cached}
    return {"prompt_tokens": prompt, "completion_tokens": 3, "prompt_tokens_details": details}


@pytest.mark.parametrize(
    ("payload", "changed", "cached_after"),
    [
        ({"usage": usage(100, 100)}, True, 16),
        ({"usage": usage(100, 99)}, False, 99),
        ({"usage": usage(100, 16)}, False, 16),
        ({"usage": usage(100, None)}, False, None),
        ({"usage": None}, False, None),
        ({"choices": []}, False, None),
        ([1, 2], False, None),
    ],
)
def test_rewrite_usage_table(payload: object, changed: bool, cached_after: int | None) -> None:
    assert rewrite_usage(payload, 16) is changed
    if isinstance(payload, dict) and isinstance(payload.get("usage"), dict):
        details = payload["usage"]["prompt_tokens_details"]
        assert (details or {}).get("cached_tokens") == cached_after


def test_json_body_without_the_field_is_returned_as_the_same_bytes() -> None:
    raw = b'{"id": "x",   "usage": {"prompt_tokens": 5}}'
    assert CachedTokensRewriter(0).body(raw) is raw


def test_json_body_reporting_the_whole_prompt_cached_is_rewritten() -> None:
    raw = orjson.dumps({"id": "x", "usage": usage(40, 40)})
    out = orjson.loads(CachedTokensRewriter(8).body(raw))
    assert out == {"id": "x", "usage": usage(40, 8)}


def stream(last_usage: dict) -> list[bytes]:
    return [
        sse({"choices": [{"delta": {"content": "a"}}], "usage": None}),
        sse({"choices": [{"delta": {"content": "b"}}], "usage": None}),
        sse({"choices": [], "usage": last_usage}),
        b"data: [DONE]\n\n",
    ]


def test_stream_chunks_without_usage_details_pass_through_as_the_same_objects() -> None:
    rewriter = CachedTokensRewriter(0)
    chunks = stream(usage(9, 9))[:2]
    assert all(rewriter.feed(c) is c for c in chunks)


@pytest.mark.parametrize("cut", [1, 5, 17, 40, 80])
def test_stream_usage_event_is_rewritten_wherever_the_network_splits_it(cut: int) -> None:
    whole = b"".join(stream(usage(9, 9)))
    rewriter = CachedTokensRewriter(4)
    out = b"".join(rewriter.feed(whole[i : i + cut]) for i in range(0, len(whole), cut))
    out += rewriter.flush()
    assert out == b"".join(stream(usage(9, 4)))


def test_stream_with_partial_cache_report_is_untouched() -> None:
    whole = b"".join(stream(usage(9, 3)))
    rewriter = CachedTokensRewriter(0)
    assert rewriter.feed(whole) + rewriter.flush() == whole


def test_unterminated_tail_is_flushed_at_the_end() -> None:
    rewriter = CachedTokensRewriter(1)
    tail = sse({"usage": usage(2, 2)}).rstrip(b"\n")
    assert rewriter.feed(tail) == b""
    assert orjson.loads(rewriter.flush()[len(b"data: ") :]) == {"usage": usage(2, 1)}


def test_an_event_past_the_bound_is_passed_on_untouched_as_it_comes() -> None:
    rewriter = CachedTokensRewriter(4, max_pending=100)
    piece = b"data: " + b"x" * 24  # 30 bytes, never an event's end
    assert [rewriter.feed(piece) for _ in range(3)] == [b"", b"", b""]
    assert rewriter.feed(piece) == piece * 4  # past the bound: what was held, then the rest
    assert rewriter.feed(piece) is piece
    assert rewriter.flush() == b""


@pytest.mark.parametrize("split", [False, True])
def test_rewriting_goes_on_after_an_oversized_event_ends(split: bool) -> None:
    """`split`: the oversized event's end in a chunk of its own, or with what follows."""
    rewriter = CachedTokensRewriter(4, max_pending=100)
    oversized = b"data: " + b"x" * 200 + b"\n"
    after = b"".join(stream(usage(9, 9)))
    chunks = [oversized[:150], oversized[150:]]
    chunks += [b"\n", after[:50]] if split else [b"\n" + after[:50]]
    out = b"".join(rewriter.feed(chunk) for chunk in [*chunks, after[50:]]) + rewriter.flush()
    assert out == oversized + b"\n" + b"".join(stream(usage(9, 4)))


def test_a_long_event_in_tiny_chunks_costs_each_chunk_its_own_size() -> None:
    """Held bytes are joined once, at the event's end: were each chunk joined to all held
    before it, these 200,000 chunks would copy some 100 GB and never finish."""
    rewriter = CachedTokensRewriter(4)
    event = sse({"choices": [], "usage": usage(9, 9), "pad": "p" * 999_800})
    assert len(event) < rewriter.max_pending
    out = [rewriter.feed(event[i : i + 5]) for i in range(0, len(event), 5)]
    assert b"".join(out) + rewriter.flush() == sse(
        {"choices": [], "usage": usage(9, 4), "pad": "p" * 999_800}
    )
