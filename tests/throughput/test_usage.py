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
