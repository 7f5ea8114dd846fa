"""Reading a native decode stream on its way to the client (`StreamTrack`): the ids taken
out and kept whatever the chunking, what the client was shown of each part of the message,
the chunks sent only for their ids dropped, and every stream that cannot go on said so;
`Seam` passes on only what the client was not shown; `continuable` refuses what vLLM would
start afresh."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from router.parsers import ParsedDelta, ToolCallDelta
from router.throughput.continuation import Shown, StreamTrack, continuable, native_sampling
from tests.throughput.support import routed


def event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def chunk(
    delta: dict[str, Any] | None = None, ids: list[int] | None = None, **choice: Any
) -> bytes:
    body = {
        "index": 0,
        "delta": delta or {},
        "logprobs": None,
        "finish_reason": None,
        "token_ids": ids,
        **choice,
    }
    return event({"id": "chatcmpl-1", "created": 7, "model": "m", "choices": [body]})


ROLE = event(
    {
        "id": "chatcmpl-1",
        "created": 7,
        "model": "m",
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        "prompt_token_ids": [1, 2, 3],
    }
)
STREAM = [
    ROLE,
    chunk({"reasoning": "thin"}, [10]),
    chunk({"reasoning": "k"}, [11]),
    chunk({}, [12]),  # a parser held the step back: sent for its ids alone
    chunk({"content": "Hé"}, [13, 14]),
    chunk(
        {
            "tool_calls": [
                {"index": 0, "id": "t", "type": "function", "function": {"name": "f"}},
            ]
        },
        [15],
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a"'}}]}, [16]),
]


def tracked(chunks: list[bytes]) -> tuple[StreamTrack, bytes]:
    track = StreamTrack(keep_ids=False)
    shown = b"".join(track.feed(c) for c in chunks) + track.flush()
    return track, shown


def test_the_ids_are_kept_and_taken_out_and_the_shown_parts_counted() -> None:
    track, shown = tracked(STREAM)
    assert track.prompt_ids == [1, 2, 3]
    assert track.output_ids == [10, 11, 12, 13, 14, 15, 16]
    assert track.shown == Shown(content=2, reasoning=5, calls={0: 4})
    assert (track.response_id, track.created) == ("chatcmpl-1", 7)
    assert track.unfinished and not track.finished and not track.done
    assert b'token_ids":[' not in shown and b'"prompt_token_ids":null' in shown
    # Every chunk but the one sent for its ids alone, as it came with its ids as null.
    assert shown.count(b"data: ") == len(STREAM) - 1


@pytest.mark.parametrize("size", [1, 2, 5, 17, 64])
def test_any_chunking_reads_the_same(size: int) -> None:
    whole = b"".join(STREAM)
    pieces = [whole[i : i + size] for i in range(0, len(whole), size)]
    track, shown = tracked(pieces)
    expected, expected_shown = tracked([whole])
    assert shown == expected_shown
    assert (track.output_ids, track.shown) == (expected.output_ids, expected.shown)


def test_a_client_that_asked_for_ids_gets_them_and_every_chunk() -> None:
    track = StreamTrack(keep_ids=True)
    assert b"".join(track.feed(c) for c in STREAM) == b"".join(STREAM)
    assert track.output_ids == [10, 11, 12, 13, 14, 15, 16]


def test_an_event_cut_off_by_the_break_is_not_passed_on() -> None:
    track, shown = tracked([ROLE, chunk({"content": "a"}, [5])[:-9]])
    assert shown == ROLE.replace(b"[1,2,3]", b"null")
    assert track.output_ids == []
    assert not track.unfinished  # nothing was shown of the output yet


def test_a_finished_stream_does_not_go_on() -> None:
    track, _ = tracked([*STREAM, chunk({}, [2], finish_reason="stop")])
    assert track.finished and not track.unfinished


def test_a_stream_that_ends_well_is_never_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """While nothing fails nothing is parsed, though the finishing chunk's delta is empty
    like that of a chunk sent for its ids alone: alone in its chunk, it is not one."""
    reads: list[bytes] = []
    monkeypatch.setattr(StreamTrack, "_read", lambda self, event: reads.append(event) or True)
    plain = [ROLE, *(chunk({"content": f"w{i} "}, [100 + i]) for i in range(20))]
    finish = chunk({}, [7], finish_reason="stop")
    usage = event({"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 3}})
    track, shown = tracked([*plain, finish, usage, b"data: [DONE]\n\n"])
    assert reads == []
    assert track.finished and track.done
    assert shown.count(b"data: ") == len(plain) + 3 and b'token_ids":[' not in shown


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (b"data: {not json\n\n", "an event that is not JSON"),
        (event({"error": {"message": "engine dead"}}), "an error event"),
        (event({"choices": [{"index": 0}, {"index": 1}]}), "several choices"),
        (event({"choices": [{"index": 1, "delta": {}}]}), "several choices"),
    ],
)
def test_a_stream_it_cannot_read_does_not_go_on(bad: bytes, why: str) -> None:
    track, shown = tracked([*STREAM, bad, chunk({"content": "x"}, [3])])
    assert track.lost == why and not track.unfinished
    assert bad in shown  # relayed as it came


def test_an_event_too_large_to_read_is_relayed_and_the_stream_not_continued() -> None:
    track = StreamTrack(keep_ids=False, max_pending=64)
    big = chunk({"content": "x" * 200}, [1])
    pieces = [big[i : i + 50] for i in range(0, len(big), 50)]  # its end comes late
    out = b"".join(track.feed(c) for c in [ROLE, *pieces])
    assert big in out and track.lost is not None and not track.unfinished


def test_a_completions_stream_names_its_prompt_on_its_choice() -> None:
    first = event(
        {
            "id": "cmpl-1",
            "created": 1,
            "choices": [{"index": 0, "text": "ab", "prompt_token_ids": [4, 5], "token_ids": [9]}],
        }
    )
    track, shown = tracked([first])
    assert (track.prompt_ids, track.output_ids, track.shown.content) == ([4, 5], [9], 2)
    assert b'"prompt_token_ids":null' in shown and b'"token_ids":null' in shown


def test_a_string_naming_token_ids_is_left_alone() -> None:
    sneaky = chunk({"content": 'say "token_ids":[1,2]'}, [8])
    _, shown = tracked([ROLE, sneaky])
    assert b'say \\"token_ids\\":[1,2]' in shown


def seam_of(shown: Shown) -> Any:
    from router.throughput.continuation import Seam

    return Seam(shown)


def test_the_seam_passes_on_only_what_was_not_shown() -> None:
    seam = seam_of(Shown(content=3, reasoning=2, calls={0: 4}))
    replay = ParsedDelta(
        reasoning="thinking",
        content="He",
        tool_calls=[ToolCallDelta(0, id="x", name="f", arguments='{"a"')],
    )
    assert seam.unseen(replay) == ParsedDelta(reasoning="inking")
    more = ParsedDelta(
        content="llo",
        tool_calls=[
            ToolCallDelta(0, arguments=": 1}"),
            ToolCallDelta(1, id="y", name="g", arguments="{}"),
        ],
    )
    assert seam.unseen(more) == ParsedDelta(
        content="lo",
        tool_calls=[
            ToolCallDelta(0, arguments=": 1}"),
            ToolCallDelta(1, id="y", name="g", arguments="{}"),
        ],
    )


def request(body: dict[str, Any], endpoint: str = "chat") -> Any:
    return routed({"model": "m", "stream": True, **body}, endpoint=endpoint)


MESSAGES = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"response_format": {"type": "text"}},
        {"tool_choice": "auto"},
        {"logprobs": False},
    ],
)
def test_a_plain_stream_is_continuable(body: dict[str, Any]) -> None:
    assert continuable(request({**MESSAGES, **body}))


@pytest.mark.parametrize(
    "body",
    [
        {"stream": False},
        {"n": 2},
        {"logprobs": True, "top_logprobs": 2},
        {"response_format": {"type": "json_object"}},
        {"structured_outputs": {"json": {}}},
        {"tool_choice": "required"},
        {"tool_choice": {"type": "function", "function": {"name": "f"}}},
        {"include_stop_str_in_output": True},
    ],
)
def test_what_vllm_would_start_afresh_is_not(body: dict[str, Any]) -> None:
    assert not continuable(request({**MESSAGES, **body}))


def test_the_rest_is_sampled_as_the_client_asked() -> None:
    body = {"temperature": 0.5, "seed": 3, "min_tokens": 10, "max_tokens": 99, "stop": ["x"]}
    assert native_sampling(body, 4) == {"temperature": 0.5, "seed": 3, "min_tokens": 6}
    assert native_sampling(body, 12) == {"temperature": 0.5, "seed": 3}


def test_a_long_stream_is_read_in_batches_and_reads_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunks = [ROLE, *(chunk({"content": f"w{i} "}, [100 + i]) for i in range(200))]
    expected, expected_shown = tracked(chunks)
    monkeypatch.setattr("router.throughput.continuation.MAX_UNREAD_BYTES", 1000)
    track, shown = tracked(chunks)
    assert shown == expected_shown
    assert track.output_ids == expected.output_ids == list(range(100, 300))
    assert track.shown == expected.shown
