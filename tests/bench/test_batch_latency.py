"""Pairing a client's chunks with the lines its node wrote: in order, through the rid the
prefill server saw, and never guessed when the counts differ."""

from __future__ import annotations

import pytest

from bench.batch_latency import paired
from bench.streams import Sample


def sample(name: str, arrivals: list[float]) -> Sample:
    return Sample(0.0, rid=name, arrivals=arrivals)


def test_each_chunk_is_paired_with_its_line_in_order() -> None:
    rids = {"client-a": "node-a", "client-b": "node-b"}
    lines = {"node-a": [10.0, 10.2], "node-b": [20.0]}
    found = paired(
        [sample("client-a", [10.001, 10.203]), sample("client-b", [20.004])], rids, lines
    )
    assert found.latencies_s == pytest.approx([0.001, 0.003, 0.004])
    assert found.unpaired == 0


def test_a_request_whose_counts_differ_or_whose_node_is_unknown_is_counted_apart() -> None:
    rids = {"client-a": "node-a"}
    lines = {"node-a": [10.0, 10.2]}
    held_back = sample("client-a", [10.3])  # two lines rendered as one event
    unknown = sample("client-x", [1.0])
    found = paired([held_back, unknown], rids, lines)
    assert found.latencies_s == []
    assert found.unpaired == 2
