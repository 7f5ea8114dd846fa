"""StopMatcher: vLLM's stop-string semantics over a stream, with minimal hold-back."""

from __future__ import annotations

from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router.detokenize.stops import StopMatcher, StopResult


def reference(text: str, stops: list[str]) -> tuple[str, str | None]:
    """Non-streaming result: text cut before the earliest stop (shortest on a tie)."""
    found = [(text.find(s), len(s), s) for s in stops if s and s in text]
    if not found:
        return text, None
    start, _, stop = min(found)
    return text[:start], stop


def pending_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop."""
    lengths = [
        n for s in stops for n in range(1, len(s)) if n <= len(text) and text.endswith(s[:n])
    ]
    return max(lengths, default=0)


def decidable(text: str, stops: list[str]) -> bool:
    """A match exists and no longer stop can still begin before it."""
    cut, stop = reference(text, stops)
    return stop is not None and len(text) - pending_len(text, stops) >= len(cut)


@pytest.mark.parametrize(
    ("stops", "chunks", "emits", "matched"),
    [
        # the stop string is split across feeds and never shown
        (["</s>"], ["Hello </", "s> more"], ["Hello ", ""], "</s>"),
        # held text is released as soon as it cannot be a stop
        (["STOP"], ["ST", "x"], ["", "STx"], None),
        # only the longest suffix that is a stop prefix is held
        (["abc"], ["xxab", "d"], ["xx", "abd"], None),
        (["aab"], ["aaa", "b"], ["a", ""], "aab"),
        # earliest match across stop strings wins, not the first listed
        (["world", "lo"], ["hello world"], ["hel"], "lo"),
        # same start: the shortest, which completes first
        (["abc", "ab"], ["abc"], [""], "ab"),
        # a match waits while a longer stop could still begin before it
        (["abcd", "b"], ["ab", "cx"], ["", "a"], "b"),
        (["abcd", "b"], ["ab", "cd"], ["", ""], "abcd"),
        # match across the held/new boundary
        (["\n\n"], ["a\n", "\nb"], ["a", ""], "\n\n"),
        (["。"], ["你好。再见"], ["你好"], "。"),
        # empty stop strings are ignored
        (["", "x"], ["abc"], ["abc"], None),
        ([], ["abc", "def"], ["abc", "def"], None),
        # after a stop, nothing more comes out
        (["b"], ["ab", "more"], ["a", ""], "b"),
    ],
)
def test_feed(stops: list[str], chunks: list[str], emits: list[str], matched: str | None) -> None:
    matcher = StopMatcher(stops)
    results = [matcher.feed(chunk) for chunk in chunks]
    assert [r.emit for r in results] == emits
    assert results[-1].stopped is (matched is not None)
    assert results[-1].matched == matched


@pytest.mark.parametrize(
    ("stops", "chunks", "flushed", "matched"),
    [
        (["STOP"], ["abc ST"], "ST", None),
        (["abc"], ["xab"], "ab", None),
        # the longer candidate that kept the match undecided can no longer complete
        (["abcd", "b"], ["abc"], "a", "b"),
        (["b"], ["ab"], "", "b"),
        ([], ["abc"], "", None),
    ],
)
def test_flush(stops: list[str], chunks: list[str], flushed: str, matched: str | None) -> None:
    matcher = StopMatcher(stops)
    for chunk in chunks:
        matcher.feed(chunk)
    assert matcher.flush() == flushed
    assert matcher.stopped is (matched is not None)
    assert matcher.matched == matched
    assert matcher.flush() == ""


def test_feed_after_stop_repeats_the_verdict() -> None:
    matcher = StopMatcher(["x"])
    assert matcher.feed("axb") == StopResult("a", True, "x")
    assert matcher.feed("more") == StopResult("", True, "x")


ALPHABET = "ab\n好"


@settings(max_examples=400, deadline=None)
@given(
    text=st.text(alphabet=ALPHABET, max_size=40),
    stops=st.lists(st.text(alphabet=ALPHABET, max_size=4), max_size=4),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=8),
)
def test_streaming_equals_non_streaming(text: str, stops: list[str], cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    chunks = [text[a:b] for a, b in pairwise(bounds)]
    want, want_stop = reference(text, stops)
    matcher = StopMatcher(stops)
    emitted = ""
    seen = ""
    for chunk in chunks:
        seen += chunk
        result = matcher.feed(chunk)
        emitted += result.emit
        # nothing is emitted that later turns out to be inside (or after) a stop
        assert want.startswith(emitted)
        # it stops exactly when the match is decided, and holds back no more than needed
        assert result.stopped is decidable(seen, stops)
        if result.stopped:
            break
        assert emitted == seen[: len(seen) - pending_len(seen, stops)]
    else:
        emitted += matcher.flush()
    assert emitted == want
    assert matcher.matched == want_stop
    assert matcher.stopped is (want_stop is not None)
