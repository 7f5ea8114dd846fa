"""Comparing answers from two servers for the same request: ids and times masked, the rest
as sent. `exchange` posts one case and returns what a client could see of the answer."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import httpx

TIMES = frozenset({"created", "created_at", "completed_at"})
GENERATED_ID = re.compile(r"^(chatcmpl|cmpl|resp|msg|rs|fc|call|ft|chatcmpl-tool)[-_][0-9a-zA-Z]+$")


def masked(value: Any) -> Any:
    """`value` with generated ids and timestamps replaced by placeholders."""
    if isinstance(value, dict):
        return {k: "<time>" if k in TIMES else masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    if isinstance(value, str) and GENERATED_ID.match(value):
        return "<id>"
    return value


@dataclass(frozen=True)
class Seen:
    status: int
    content_type: str
    body: Any  # parsed JSON, or the list of SSE data payloads (parsed, or the raw string)


def exchange(client: httpx.Client, base_url: str, path: str, body: Any) -> Seen:
    """POST `body` (a dict as JSON, bytes as they are) to `base_url + path`."""
    options: dict[str, Any] = (
        {"content": body, "headers": {"content-type": "application/json"}}
        if isinstance(body, bytes)
        else {"json": body}
    )
    with client.stream("POST", base_url + path, **options) as response:
        raw = response.read().decode()
    content_type = response.headers.get("content-type", "").split(";")[0]
    if content_type == "text/event-stream":
        events = [masked(e) for e in sse_events(raw)]
        return Seen(response.status_code, content_type, sorted(events, key=choice_index))
    try:
        parsed: Any = json.loads(raw)
    except ValueError:
        parsed = raw
    return Seen(response.status_code, content_type, masked(parsed))


def choice_index(event: Any) -> int:
    """The choice a chunk is about: the engine interleaves the chunks of `n` choices in
    no fixed order, so they are compared choice by choice (the sort is stable)."""
    if isinstance(event, dict) and event.get("choices"):
        return int(event["choices"][0].get("index", 0))
    return 0 if isinstance(event, dict) and "choices" not in event else 1 << 30


def sse_events(raw: str) -> list[Any]:
    """Each event's data (parsed unless `[DONE]`); a named event as `{"event", "data"}`."""
    events: list[Any] = []
    for block in raw.split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[len("event: ") :]
            elif line.startswith("data: "):
                text = line[len("data: ") :]
                data = text if text == "[DONE]" else json.loads(text)
        if data is not None:
            events.append(data if name is None else {"event": name, "data": data})
    return events


def shape_differences(theirs: Any, ours: Any, path: str = "") -> list[str]:
    """Where `ours` is shaped unlike `theirs` (vLLM's): keys missing or added, keys in
    another order, other types. Content is not compared."""
    if isinstance(theirs, dict) and isinstance(ours, dict):
        found = [f"{path}.{k}: only vLLM sends it" for k in theirs if k not in ours]
        found += [f"{path}.{k}: vLLM does not send it" for k in ours if k not in theirs]
        shared = [k for k in theirs if k in ours]
        if shared != [k for k in ours if k in theirs]:
            found.append(f"{path}: keys in another order")
        for key in shared:
            found += shape_differences(theirs[key], ours[key], f"{path}.{key}")
        return found
    if isinstance(theirs, list) and isinstance(ours, list):
        if len(theirs) != len(ours):
            return [f"{path}: {len(ours)} items where vLLM has {len(theirs)}"]
        return [
            d
            for i, (a, b) in enumerate(zip(theirs, ours, strict=True))
            for d in shape_differences(a, b, f"{path}[{i}]")
        ]
    if type(theirs) is not type(ours):
        return [f"{path}: {type(ours).__name__} where vLLM has {type(theirs).__name__}"]
    return []


KIND_KEYS = frozenset({"event", "type", "object"})


def shape(value: Any) -> Any:
    """`value` but its content: keys in order, the types of the leaves, and what kind of
    thing each object says it is (`event`, `type`, `object`)."""
    if isinstance(value, dict):
        return tuple(
            (key, item if key in KIND_KEYS and isinstance(item, str) else shape(item))
            for key, item in value.items()
        )
    if isinstance(value, list):
        return tuple(shape(item) for item in value)
    return type(value).__name__


def stream_outline(events: list[Any]) -> list[Any]:
    """A stream with each run of same-shaped events (one per token, however many tokens
    the content took) cut to its first event."""
    outline: list[Any] = []
    for event in events:
        if not outline or shape(outline[-1]) != shape(event):
            outline.append(event)
    return outline


TEXT_KEYS = frozenset({"content", "text", "delta", "reasoning", "reasoning_content"})
COUNTS_OF_PIECES = frozenset({"sequence_number"})  # grows with each piece of text sent


def textless(value: Any) -> Any:
    """`value` with every piece of generated text replaced by a placeholder: what two
    answers share when only the tokens differ."""
    if isinstance(value, dict):
        return {
            k: "<text>"
            if k in TEXT_KEYS and isinstance(v, str)
            else "<n>"
            if k in COUNTS_OF_PIECES
            else textless(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [textless(v) for v in value]
    return value


def stream_ending(events: list[Any]) -> dict[str, Any]:
    """What a stream says of how it ended, whatever its text and however it was cut:
    each choice's finish, the last usage, the fingerprints, and the last event unless it
    is a chunk of a choice (a Responses stream's `response.completed`, say)."""
    chunks = [e for e in events if isinstance(e, dict)]
    last = chunks[-1] if chunks else None
    return {
        "finishes": [
            (c.get("index"), c.get("finish_reason"), c.get("stop_reason"))
            for e in chunks
            for c in e.get("choices") or []
            if c.get("finish_reason") is not None
        ],
        "usage": [e["usage"] for e in chunks if e.get("usage")][-1:],
        "fingerprints": [e["system_fingerprint"] for e in chunks if "system_fingerprint" in e],
        "last": None if last is None or last.get("choices") else textless(last),
    }


def both_ways(
    client: httpx.Client, direct_url: str, relayed_url: str, path: str, body: Any
) -> tuple[Seen, Seen]:
    """The same request sent to vLLM directly and through the gateway. A busy vLLM
    sometimes sends two tokens in one chunk (its output lags the engine), so a stream
    that came out cut differently is asked for again, twice at most: a relay that
    changes what it relays differs every time. Streams still cut differently after that
    come back `rejoined`: what they say is compared, not where vLLM cut it."""
    for _ in range(3):
        direct = exchange(client, direct_url, path, body)
        relayed = exchange(client, relayed_url, path, body)
        if direct == relayed or direct.content_type != "text/event-stream":
            return direct, relayed
    return rejoined(direct), rejoined(relayed)


def rejoined(seen: Seen) -> Seen:
    """A stream with each chunk that only carries more text of the chunk before it (same
    choice, same fields, no finish yet) merged into that chunk, the chunk that ends the
    choice too (a busy vLLM sends the last tokens with the finish, or the finish alone);
    their logprobs, one entry a token, follow one another, and what a chunk says of the
    stream so far or of its end (`LATER_KEYS`) is the later chunk's."""
    events: list[Any] = []
    for event in seen.body:
        last = events[-1] if events else None
        if _continues(last, event):
            assert isinstance(last, dict)
            events[-1] = _with_more_text(last, event)
        else:
            events.append(event)
    return Seen(seen.status, seen.content_type, events)


LATER_KEYS = frozenset({"finish_reason", "stop_reason", "usage", "system_fingerprint"})
"""A choice's finish, and the usage (a running count under `continuous_usage_stats`) and
fingerprint vLLM sends with some chunks only (a completion stream's fingerprint with the
finish)."""


def _continues(last: Any, event: Any) -> bool:
    if not (isinstance(last, dict) and isinstance(event, dict)):
        return False
    if len(last.get("choices") or []) != 1 or len(event.get("choices") or []) != 1:
        return False
    if last["choices"][0].get("finish_reason") is not None:
        return False
    return _kind(last) == _kind(event)


def _kind(chunk: dict[str, Any]) -> dict[str, Any]:
    """What a chunk is, whatever text it carries and wherever in its choice it is: vLLM
    sends some empty fields in some chunks only (a completion stream's `prompt_token_ids`
    with the first text), so fields without a value are left out, and `LATER_KEYS`."""
    chunk = _logprobs_shown(textless(chunk))
    return {**_kept(chunk), "choices": [_kept(c) for c in chunk["choices"]]}


def _kept(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if v is not None and k not in LATER_KEYS}


def _logprobs_shown(chunk: dict[str, Any]) -> dict[str, Any]:
    """A chunk with each choice's logprobs cut to whether it has them: a chunk of two
    tokens carries two entries, their values the tokens'."""
    choices = [
        {**c, "logprobs": c["logprobs"] is not None} if "logprobs" in c else c
        for c in chunk["choices"]
    ]
    return {**chunk, "choices": choices}


def _with_more_text(last: dict[str, Any], event: dict[str, Any]) -> dict[str, Any]:
    def joined(before: Any, after: Any, key: str = "") -> Any:
        if key in LATER_KEYS:
            return after
        if isinstance(before, dict) and isinstance(after, dict):  # each field either sent
            both = {k: joined(v, after[k], k) if k in after else v for k, v in before.items()}
            return both | {k: v for k, v in after.items() if k not in before}
        if key == "content" and isinstance(before, list) and isinstance(after, list):
            return before + after  # a choice's logprobs: an entry a token
        if isinstance(before, list) and isinstance(after, list):
            return [joined(a, b) for a, b in zip(before, after, strict=True)]
        if key in TEXT_KEYS and isinstance(before, str) and isinstance(after, str):
            return before + after
        return before

    merged: dict[str, Any] = joined(last, event)
    return merged
