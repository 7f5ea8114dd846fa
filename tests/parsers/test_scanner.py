"""Marker scanning with hold-back of possible marker starts."""

from __future__ import annotations

import pytest

from router.parsers.scanner import Markers, MarkerScanner

MARKERS = Markers(("<a>", "<ab>", "</a>"))


def scan_all(chunks: list[str], markers: Markers) -> list[tuple[str, str | None]]:
    scanner = MarkerScanner()
    events: list[tuple[str, str | None]] = []
    for chunk in chunks:
        scanner.push(chunk)
        while True:
            plain, marker = scanner.next(markers)
            events.append((plain, marker))
            if marker is None:
                break
    events.append((scanner.drain(), None))
    return [event for event in events if event != ("", None)]


@pytest.mark.parametrize(
    ("chunks", "events"),
    [
        (["x<a>y"], [("x", "<a>"), ("y", None)]),
        (["x<", "a", ">y"], [("x", None), ("", "<a>"), ("y", None)]),
        (["<ab>"], [("", "<ab>")]),
        (["<a", "b>"], [("", "<ab>")]),
        (["< a>", "<"], [("< a>", None), ("<", None)]),
        (["a<b</a"], [("a<b", None), ("</a", None)]),
        (["</a></a>"], [("", "</a>"), ("", "</a>")]),
    ],
)
def test_events(chunks: list[str], events: list[tuple[str, str | None]]) -> None:
    assert scan_all(chunks, MARKERS) == events


def test_holds_only_possible_marker_starts() -> None:
    scanner = MarkerScanner()
    scanner.push("text <x <a")
    assert scanner.next(MARKERS) == ("text <x ", None)
    assert scanner.drain() == "<a"


def test_no_markers_passes_everything() -> None:
    scanner = MarkerScanner()
    scanner.push("<a>")
    assert scanner.next(Markers(())) == ("<a>", None)


def test_unread_puts_marker_back() -> None:
    scanner = MarkerScanner()
    scanner.push("x<a>y")
    assert scanner.next(MARKERS) == ("x", "<a>")
    scanner.unread("<a>")
    assert scanner.next(Markers(("y",))) == ("<a>", "y")
