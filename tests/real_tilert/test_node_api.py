"""TileRT's own node and the simulated one, asked the same at their own interfaces: the
control plane (hello, acceptance, each refusal) and the HTTP API (`/capabilities`, the
decode stream and the whole answer, the budget and stop-token rules, each typed refusal,
cancel while waiting for the KV and while decoding, `429`). Each case is run on both
nodes of a release and their answers compared, ids, addresses and times masked.
"""

from __future__ import annotations

import functools
import json
import socket
import struct
import threading
import time
import uuid
from typing import Any

import httpx
import pytest

from tests.real_tilert.conftest import (
    KINDS,
    MAX_SEQ_LEN,
    SENDERS,
    Pair,
    decode_lines,
    prefill,
    vocab,
)

TEXT = "The quick brown fox jumps over the lazy dog"


def both(case: Any, pair: Pair) -> tuple[Any, Any]:
    """`case(kind)` on the real node, then on the simulated one."""
    real, sim = (case(kind) for kind in KINDS)
    return real, sim


# Control plane ---------------------------------------------------------------------------


class Sender:
    """One sender rank's control connection, as TileRT's connector opens it."""

    def __init__(self, node: Any) -> None:
        self.sock = socket.create_connection((node.host, node.ctrl_port), timeout=5)
        self.hello = self.read()

    def send(self, message: dict[str, Any]) -> None:
        data = json.dumps(message).encode()
        self.sock.sendall(struct.pack("!I", len(data)) + data)

    def read(self, timeout_s: float = 5.0) -> dict[str, Any] | None:
        """The next frame; None if the node closes, or writes nothing in `timeout_s`."""
        self.sock.settimeout(timeout_s)
        try:
            header = self._exactly(4)
            if header is None:
                return None
            body = self._exactly(struct.unpack("!I", header)[0])
        except TimeoutError:
            return None
        return None if body is None else json.loads(body)

    def _exactly(self, count: int) -> bytes | None:
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                return None
            data += chunk
        return data

    def request(self, rid: str, rank: int = 0, seq_len: int = 12) -> dict[str, Any] | None:
        self.send(
            {
                "rid": rid,
                "rank": rank,
                "seq_len": seq_len,
                "last_prompt_token": 7,
                "sampling": None,
                "admission_window_s": 3.0,
            }
        )
        return self.read(timeout_s=0.5)

    def close(self) -> None:
        self.sock.close()


HELLO_CONTRACT = {"magic", "layout_version", "transport", "max_seq_len", "busy"}
HELLO_016 = {"protocol_version", "senders"}
REAL_ONLY_HELLO = {"session_id", "kv_base", "pe_base", "ki_base"}  # RDMA: the buffer's addresses
SIM_ONLY_HELLO = {"sim_data_plane"}  # where the simulated connector writes its plan


def masked(message: dict[str, Any] | None) -> dict[str, Any] | None:
    if message is None:
        return None
    return {k: v for k, v in message.items() if k not in REAL_ONLY_HELLO | SIM_ONLY_HELLO}


def release_slot(pair: Pair, kind: str, rid: str) -> None:
    """End `rid`'s transfer on the node the way a gateway would: a decode of it that times
    out (504) releases the receive slot."""
    status, _ = decode_lines(
        pair.node(kind).url, {"rid": rid, "first_token_id": 0, "max_tokens": 1, "timeout_s": 0.3}
    )
    assert status == 504


def test_the_hello(pair: Pair) -> None:
    def hello(kind: str) -> dict[str, Any]:
        sender = Sender(pair.node(kind))
        sender.close()
        assert sender.hello is not None
        return sender.hello

    real, sim = both(hello, pair)
    expected = {
        "magic": "tilert-pd",
        "layout_version": 10,
        "transport": "mooncake",
        "max_seq_len": MAX_SEQ_LEN,
        "busy": False,
    }
    if pair.release == "0.1.6":
        expected |= {"protocol_version": 2, "senders": SENDERS["0.1.6"]}
    assert masked(real) == masked(sim) == expected
    assert REAL_ONLY_HELLO <= set(real)


def test_a_prompt_longer_than_the_node_takes_is_refused(pair: Pair) -> None:
    def refusal(kind: str) -> dict[str, Any] | None:
        sender = Sender(pair.node(kind))
        answer = sender.request("toolong", seq_len=MAX_SEQ_LEN + 1)
        sender.close()
        return answer

    real, sim = both(refusal, pair)
    assert real == sim
    assert real is not None and real["error"] == "seq_len exceeds max_seq_len"


def test_admission_busy_and_duplicate_rank(pair: Pair) -> None:
    """Rank 0 of one rid admitted and done, the transfer incomplete (0.1.6: 7 ranks to go;
    0.1.5 would complete: it stays open instead): another rid is refused as busy, and
    (0.1.6) rank 0 of the same rid again as a duplicate."""

    def exchange(kind: str) -> dict[str, Any]:
        rid, other = uuid.uuid4().hex, uuid.uuid4().hex
        first = Sender(pair.node(kind))
        accepted = first.request(rid)
        if pair.release == "0.1.6":
            assert accepted is not None
            first.send({"done": True, "rid": rid, "rank": 0, "generation": accepted["generation"]})
            first.read(timeout_s=0.5)  # the node closes after a done
        second = Sender(pair.node(kind))
        busy = second.request(other)
        answers = {"accepted": accepted, "busy": busy}
        if pair.release == "0.1.6":
            third = Sender(pair.node(kind))
            answers["duplicate"] = third.request(rid)
            third.close()
        for sender in (first, second):
            sender.close()
        release_slot(pair, kind, rid)
        for answer in answers.values():
            for key in ("rid", "busy_rid"):
                if answer is not None and key in answer:
                    answer[key] = {rid: "first", other: "second"}[answer[key]]
        return answers

    real, sim = both(exchange, pair)
    assert real == sim
    if pair.release == "0.1.6":
        assert real["accepted"] == {
            "accepted": True,
            "rid": "first",
            "rank": 0,
            "generation": real["accepted"]["generation"],
        }
        assert real["busy"]["error"] == "busy"
        assert real["duplicate"] == {
            "accepted": False,
            "error": "duplicate_rank",
            "rid": "first",
            "rank": 0,
        }
    else:
        assert real == {"accepted": None, "busy": {"error": "busy", "busy_rid": "first"}}


def test_a_released_rid_is_refused(pair: Pair) -> None:
    """After its decode gave up (504), a late transfer of the rid: 0.1.6 refuses it as
    `cancelling` (`no_consumer`); 0.1.5 takes it (it becomes an orphan)."""

    def late(kind: str) -> dict[str, Any] | None:
        rid = uuid.uuid4().hex
        release_slot(pair, kind, rid)
        sender = Sender(pair.node(kind))
        answer = sender.request(rid)
        sender.close()
        if answer is not None:
            answer["rid"] = "late"
        if pair.release == "0.1.5":
            release_slot(pair, kind, rid)
        return answer

    real, sim = both(late, pair)
    assert real == sim
    if pair.release == "0.1.6":
        assert real == {
            "accepted": False,
            "error": "cancelling",
            "rid": "late",
            "detail": "no_consumer",
        }
    else:
        assert real is None


# HTTP API --------------------------------------------------------------------------------


def test_capabilities(pair: Pair) -> None:
    def capabilities(kind: str) -> tuple[int, Any]:
        answer = httpx.get(pair.node(kind).url + "/capabilities", timeout=5)
        return answer.status_code, answer.json()

    (real_status, real), (sim_status, sim) = both(capabilities, pair)
    assert real_status == sim_status == (200 if pair.release == "0.1.6" else 404)
    if pair.release == "0.1.5":
        return
    assert set(real) == set(sim) == {"profile", "engine", "capabilities"}
    assert real["profile"] == sim["profile"] == "glm5"
    # The simulator reports `grammar` besides (TileRT's engines refuse every grammar).
    sim_caps = {k: v for k, v in sim["capabilities"].items() if k != "grammar"}
    assert real["capabilities"] == sim_caps


def stream_shape(lines: list[Any]) -> dict[str, Any]:
    """What a client of the stream relies on: the first line's fields, every id in order,
    the final line's keys and values (times masked). Not how many ids a line holds: a node
    that falls behind its engine (a loaded machine) sends the ids it has in one line."""
    tokens = [line for line in lines if "t" in line]
    final = lines[-1]
    return {
        "first": sorted(tokens[0]) if tokens else None,
        "ids": [i for line in tokens for i in line["t"]],
        "final": {k: v for k, v in final.items() if k != "timing_ms"},
        "timing": sorted(final.get("timing_ms", {})),
        "kinds": ["t" if "t" in line else "final" for line in lines][-2:],
    }


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_decode(pair: Pair, stream: bool) -> None:
    def decode(kind: str) -> tuple[int, Any]:
        transfer = prefill(pair, kind, TEXT)
        body = {
            "rid": transfer.rid,
            "first_token_id": transfer.first_token_id,
            "max_tokens": 64,
            "stream": stream,
            "timeout_s": 10,
        }
        status, lines = decode_lines(pair.node(kind).url, body)
        if not stream:
            lines[0]["rid"] = "masked"
            lines[0]["timing_ms"] = sorted(lines[0]["timing_ms"])
            return status, lines
        return status, stream_shape(lines)

    real, sim = both(decode, pair)
    assert real == sim
    ids = vocab().encode(TEXT)
    if stream:
        assert real[1]["first"] == ["t"] and real[1]["ids"] == ids
        assert real[1]["final"]["finish_reason"] == "stop" and real[1]["final"]["n"] == len(ids)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
def test_a_budget_of_none_and_a_stop_token_first(pair: Pair, stream: bool) -> None:
    """`max_tokens: 0` gives the first token alone, ended by `length`; a stop token as first
    token is streamed, then the output ends with nothing counted."""

    def decode(kind: str, max_tokens: int, first: int | None) -> Any:
        transfer = prefill(pair, kind, TEXT)
        body = {
            "rid": transfer.rid,
            "max_tokens": max_tokens,
            "stream": stream,
            "timeout_s": 10,
            "first_token_id": transfer.first_token_id if first is None else first,
        }
        status, lines = decode_lines(pair.node(kind).url, body)
        return status, stream_shape(lines) if stream else {
            k: v for k, v in lines[0].items() if k not in ("rid", "timing_ms")
        } | {"finish_reason": lines[0]["timing_ms"].get("finish_reason")}

    eos = vocab().eos_ids[0]
    for max_tokens, first in ((0, None), (16, eos)):
        real, sim = both(functools.partial(decode, max_tokens=max_tokens, first=first), pair)
        assert real == sim, (max_tokens, first)


REFUSALS_016 = [
    ({"sampling": {"n": 2}}, 501, "capability_unavailable"),
    ({"sampling": {"temperature": "hot"}}, 400, "invalid_parameter"),
    ({"sampling": {"ignore_eos": 1}}, 400, "invalid_parameter"),
    ({"sampling": {"seed": 7, "temperature": 0.7}}, 501, "capability_unavailable"),
    ({"sampling": {"seed": 7, "temperature": 0.0}}, 200, None),
    ({"sampling": {"repetition_penalty": 1.1}}, 501, "capability_unavailable"),
    ({"sampling": {"top_k": 2.5}}, 400, "invalid_parameter"),
    ({"top_logprobs": 2}, 501, "logprobs_unavailable"),
    ({"grammar_spec": {"type": "json_object", "value": None}}, 501, "grammar_unsupported"),
]


@pytest.mark.parametrize(("extra", "status", "error_type"), REFUSALS_016)
def test_what_the_node_refuses(
    pair: Pair, extra: dict[str, Any], status: int, error_type: str | None
) -> None:
    """0.1.6 checks the request against its engine before decoding (the production
    engines' capabilities: `ignore_eos` alone); 0.1.5 ignores what it cannot apply. Either
    way the node is idle again at once."""

    def decode(kind: str) -> tuple[int, Any, str]:
        transfer = prefill(pair, kind, TEXT)
        body = {
            "rid": transfer.rid,
            "first_token_id": transfer.first_token_id,
            "max_tokens": 8,
            "timeout_s": 10,
            **extra,
        }
        code, lines = decode_lines(pair.node(kind).url, body)
        state = httpx.get(pair.node(kind).url + "/decode_status", timeout=5).json()["status"]
        answer = lines[0]
        return code, sorted(answer) if code != 200 else answer.get("error_type"), state

    real, sim = both(decode, pair)
    assert real == sim
    if pair.release == "0.1.6":
        assert real[0] == status
        if error_type is not None:
            assert real[1] == ["error", "error_type"]
    else:
        assert real[0] == 200
    assert real[2] == "idle"


def test_a_cancel_while_waiting_for_the_kv(pair: Pair) -> None:
    """0.1.6 takes it (the decode answers 499); 0.1.5 does not know the rid yet (404) and
    its decode waits out its `timeout_s` (504)."""

    def cancel(kind: str) -> tuple[int, int, Any]:
        rid = uuid.uuid4().hex
        url = pair.node(kind).url
        result: dict[str, Any] = {}
        body = {"rid": rid, "first_token_id": 0, "max_tokens": 4, "timeout_s": 1.0}
        waiting = threading.Thread(target=lambda: result.update(answer=decode_lines(url, body)))
        waiting.start()
        deadline = time.monotonic() + 5
        while httpx.get(url + "/decode_status", timeout=5).json()["current_rid"] != rid:
            assert time.monotonic() < deadline
            time.sleep(0.02)  # polling the node's state: it gives no other sign
        cancelled = httpx.post(url + "/pd/cancel", json={"rid": rid}, timeout=5)
        waiting.join()
        status, lines = result["answer"]
        answer = {k: v for k, v in lines[0].items() if k != "rid"}
        return cancelled.status_code, status, answer

    real, sim = both(cancel, pair)
    assert real == sim
    expected = (200, 499) if pair.release == "0.1.6" else (404, 504)
    assert real[:2] == expected


def test_a_cancel_while_decoding_and_a_second_decode(pair: Pair) -> None:
    """A long decode: a second `/pd/decode` meanwhile is `429`; `/pd/cancel` ends the stream
    at the next step with `cancelled`, and frees the node."""

    def decode(kind: str) -> tuple[Any, ...]:
        transfer = prefill(pair, kind, TEXT)
        url = pair.node(kind).url
        if kind == "real":  # slow enough to cancel: a token every 20 ms
            httpx.post(url + "/stub/engine", json={"token_interval_ms": 20}).raise_for_status()
        else:  # silent after 3 tokens until cancelled
            httpx.post(url + "/sim/faults", json={"stall_after": 3, "count": 1}).raise_for_status()
        body = {
            "rid": transfer.rid,
            "first_token_id": transfer.first_token_id,
            "max_tokens": 400,
            "stream": True,
            "timeout_s": 10,
            "sampling": {"ignore_eos": True},
        }
        with httpx.stream("POST", url + "/pd/decode", json=body, timeout=30) as answer:
            lines = answer.iter_lines()
            first = json.loads(next(lines))
            other = httpx.post(url + "/pd/decode", json={**body, "rid": "other"}, timeout=5)
            cancelled = httpx.post(url + "/pd/cancel", json={"rid": transfer.rid}, timeout=5)
            rest = [json.loads(line) for line in lines if line]
        if kind == "real":
            httpx.post(url + "/stub/engine", json={"token_interval_ms": 1}).raise_for_status()
        state = httpx.get(url + "/decode_status", timeout=5).json()
        busy = {k: v for k, v in other.json().items() if k != "current_rid"}
        final = {k: v for k, v in rest[-1].items() if k not in ("n", "timing_ms")}
        return (
            first == {"t": [transfer.first_token_id]},
            other.status_code,
            busy,
            cancelled.json() == {"cancelled": transfer.rid},
            final,
            state,
        )

    real, sim = both(decode, pair)
    assert real == sim
    assert real[1] == 429 and real[4]["finish_reason"] == "cancelled"
