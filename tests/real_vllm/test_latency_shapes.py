"""The answers the latency path renders itself, held against a real vLLM's for the same request.

Each case asks the real vLLM twice: once as the latency path's prefill does (the gateway's own
prefill body, one token, its first token's logprob as an id), whose answer the gateway reads
as it does in service (`parse_prefilled`: the response id, the prompt's count, the server's
`system_fingerprint`); and once as a client would, whole or streamed. The gateway's renderers
then render the client's output (the real text, finish and counts) from what the prefill told
them, and the two answers must carry the same fields, in the same order, in the same places:
whole answers equal once ids and times are masked; streams compared chunk kind by chunk kind
(the opening, a token's, the finishing one, the usage one), since the gateway sends the finish
in a chunk of its own (README, "Conformance with vLLM").
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from router.latency.path import answer_facts
from router.latency.sampling import SamplingDefaults, resolve
from router.node import Node
from router.openai.render import (
    AnswerHead,
    ChatRenderer,
    CompletionRenderer,
    Renderer,
    TokenLogprob,
    Usage,
)
from router.openai.requests import ChatRequest, CompletionRequest
from router.openai.responses_render import ResponsesRenderer
from router.parsers import ParsedDelta, ParsedMessage
from router.upstream.vllm import Prefilled, parse_prefilled, prefill_body, tilert_params

pytestmark = pytest.mark.real_vllm

# The node the prefill would push to: a vLLM without the TileRT connector ignores it.
NODE = Node(host="127.0.0.1", ctrl_port=1, http_port=2)
MASKED = {"id", "created", "created_at", "item_id"}
MESSAGES = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def vllm(real_vllm: Any) -> Iterator[Backend]:
    with httpx.Client(base_url=real_vllm.url + "/v1", timeout=120) as client:
        yield Backend(client, real_vllm)


class Backend:
    def __init__(self, client: httpx.Client, real_vllm: Any) -> None:
        self.client = client
        self.model = real_vllm.model
        self.defaults = SamplingDefaults.from_generation_config(real_vllm.model_dir)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        response = self.client.post(path, json={"model": self.model, **body})
        assert response.status_code == 200, response.text
        return response.json()

    def events(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """A stream's data events (without `[DONE]`)."""
        out = []
        body = {"model": self.model, **body, "stream": True}
        with self.client.stream("POST", path, json=body) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    out.append(json.loads(line[len("data: ") :]))
        return out

    def prefill(self, path: str, body: dict[str, Any], endpoint: str) -> Prefilled:
        """The latency path's prefill of `body`, read as the gateway reads it."""
        sent = prefill_body(
            {"model": self.model, **body}, tilert_params(NODE), first_token_of=endpoint
        )
        # In service the prefill servers run with --return-tokens-as-token-ids.
        sent["return_tokens_as_token_ids"] = True
        prefilled = parse_prefilled(self.post(path, sent), endpoint)  # type: ignore[arg-type]
        assert prefilled.system_fingerprint is not None
        assert prefilled.system_fingerprint.startswith("vllm-")
        return prefilled

    def renderer(
        self,
        kind: Callable[..., Renderer] | type[ResponsesRenderer],
        parsed: ChatRequest | CompletionRequest,
        prefilled: Prefilled,
        client_body: dict[str, Any] | None = None,
    ) -> Any:
        facts = answer_facts(parsed, prefilled, resolve(parsed, self.defaults), max_seq_len=2048)
        return kind(
            AnswerHead(
                prefilled.response_id, prefilled.created, self.model, client_body or {}, facts
            )
        )


def masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: "masked" if k in MASKED else masked(v) for k, v in value.items()}
    if isinstance(value, list):
        return [masked(v) for v in value]
    return value


def same_json(gateway: Any, vllm: Any) -> None:
    """Equal, key order included."""
    assert json.dumps(masked(gateway)) == json.dumps(masked(vllm))


def chat_entries(logprobs: Any) -> list[TokenLogprob] | None:
    if logprobs is None:
        return None
    return [
        TokenLogprob(
            e["token"], e["logprob"], tuple((t["token"], t["logprob"]) for t in e["top_logprobs"])
        )
        for e in logprobs["content"]
    ]


def completion_entries(logprobs: Any) -> list[TokenLogprob] | None:
    if logprobs is None:
        return None
    return [
        TokenLogprob(token, logprob, tuple(top.items()))
        for token, logprob, top in zip(
            logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
        )
    ]


@pytest.mark.parametrize(
    "extra",
    [{}, {"logprobs": True, "top_logprobs": 2}, {"stop": ["a", "e", "o"]}],
    ids=["plain", "logprobs", "stop"],
)
def test_a_whole_chat_answer_is_vllms(vllm: Backend, extra: dict[str, Any]) -> None:
    body = {"messages": MESSAGES, "max_tokens": 4, **extra}
    real = vllm.post("/chat/completions", body)
    prefilled = vllm.prefill("/chat/completions", body, "chat")
    parsed = ChatRequest.model_validate({"model": vllm.model, **body})
    choice = real["choices"][0]
    usage = real["usage"]
    assert usage["prompt_tokens"] == prefilled.prompt_tokens
    gateway = vllm.renderer(ChatRenderer, parsed, prefilled).response(
        ParsedMessage(None, choice["message"]["content"], []),
        choice["finish_reason"],
        choice["stop_reason"],
        Usage(prefilled.prompt_tokens, usage["completion_tokens"], prefilled.cached_tokens),
        chat_entries(choice["logprobs"]),
    )
    same_json(gateway, real)


@pytest.mark.parametrize(
    "extra", [{}, {"logprobs": 2}, {"stop": ["a", "e", "o"]}], ids=["plain", "logprobs", "stop"]
)
def test_a_whole_completion_is_vllms(vllm: Backend, extra: dict[str, Any]) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 4, **extra}
    real = vllm.post("/completions", body)
    prefilled = vllm.prefill("/completions", body, "completions")
    parsed = CompletionRequest.model_validate({"model": vllm.model, **body})
    choice = real["choices"][0]
    gateway = vllm.renderer(CompletionRenderer, parsed, prefilled).response(
        ParsedMessage(None, choice["text"], []),
        choice["finish_reason"],
        choice["stop_reason"],
        Usage(prefilled.prompt_tokens, real["usage"]["completion_tokens"]),
        completion_entries(choice["logprobs"]),
    )
    same_json(gateway, real)


def kind_of(chunk: dict[str, Any]) -> str:
    if not chunk["choices"]:
        return "usage"
    choice = chunk["choices"][0]
    if choice["finish_reason"] is not None:
        return "finishing"
    return "opening" if "role" in choice.get("delta", {}) else "token"


def chunk_shapes(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind of chunk: its fields in order, its choice's (without the text it carries),
    its usage's, and the fingerprint it names."""
    out: dict[str, Any] = {}
    for chunk in chunks:
        choice = chunk["choices"][0] if chunk["choices"] else {}
        out[kind_of(chunk)] = (
            list(chunk),
            [k for k in choice if k not in ("delta", "text")],
            list(chunk.get("usage") or {}),
            chunk.get("system_fingerprint"),
        )
    return out


def gateway_stream(
    renderer: Any, real: list[dict[str, Any]], text_of: Callable[[dict[str, Any]], str], p: int
) -> list[dict[str, Any]]:
    """The gateway's chunks for the real stream's output: its text, then its finish, then
    its usage if the real stream had a usage chunk; running counts if it had them."""
    continuous = any(c.get("usage") for c in real if c["choices"])
    out = [renderer.start(Usage(p, 0) if continuous else None)]
    produced = 0
    finish: dict[str, Any] = {}
    for chunk in real:
        if not chunk["choices"] or kind_of(chunk) == "opening":
            continue
        choice = chunk["choices"][0]
        produced = chunk["usage"]["completion_tokens"] if continuous else produced + 1
        running = Usage(p, produced) if continuous else None
        out.append(renderer.delta(ParsedDelta(content=text_of(choice)), running))
        if choice["finish_reason"] is not None:
            finish = choice
    running = Usage(p, produced) if continuous else None
    out.append(renderer.finish(finish["finish_reason"], finish["stop_reason"], running))
    usage = [c["usage"] for c in real if not c["choices"]]
    if usage:
        out.append(renderer.usage(Usage(p, usage[0]["completion_tokens"])))
    return [json.loads(c.removeprefix(b"data: ")) for c in out if c]


STREAM_OPTIONS = [
    {},
    {"stream_options": {"include_usage": True}},
    {"stream_options": {"include_usage": True, "continuous_usage_stats": True}},
]
STREAM_IDS = ["no usage", "usage", "continuous usage"]


@pytest.mark.parametrize("extra", STREAM_OPTIONS, ids=STREAM_IDS)
def test_a_chat_stream_has_vllms_chunks(vllm: Backend, extra: dict[str, Any]) -> None:
    body = {"messages": MESSAGES, "max_tokens": 4, **extra}
    real = vllm.events("/chat/completions", body)
    prefilled = vllm.prefill("/chat/completions", body, "chat")
    parsed = ChatRequest.model_validate({"model": vllm.model, **body, "stream": True})
    renderer = vllm.renderer(ChatRenderer, parsed, prefilled)
    ours = gateway_stream(
        renderer, real, lambda c: c["delta"].get("content") or "", prefilled.prompt_tokens
    )
    assert chunk_shapes(ours) == chunk_shapes(real)
    opening = [c for c in ours if kind_of(c) == "opening"]
    assert [c["choices"][0]["delta"] for c in opening] == [{"role": "assistant", "content": ""}]


@pytest.mark.parametrize("extra", STREAM_OPTIONS, ids=STREAM_IDS)
def test_a_completion_stream_has_vllms_chunks(vllm: Backend, extra: dict[str, Any]) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 4, **extra}
    real = vllm.events("/completions", body)
    prefilled = vllm.prefill("/completions", body, "completions")
    parsed = CompletionRequest.model_validate({"model": vllm.model, **body, "stream": True})
    renderer = vllm.renderer(CompletionRenderer, parsed, prefilled)
    ours = gateway_stream(renderer, real, lambda c: c["text"], prefilled.prompt_tokens)
    assert chunk_shapes(ours) == chunk_shapes(real)


# Greedy, so that the output is the same every time: three tokens without an end, a cut.
RESPONSES_BODY = {"input": "Say something.", "max_output_tokens": 3, "temperature": 0}


def responses_parsed(vllm: Backend) -> ChatRequest:
    """The chat request the latency path serves a Responses call as (its prefill's)."""
    return ChatRequest.model_validate(
        {
            "model": vllm.model,
            "messages": [{"role": "user", "content": "Say something."}],
            "max_tokens": RESPONSES_BODY["max_output_tokens"],
            "temperature": RESPONSES_BODY["temperature"],
        }
    )


def test_a_whole_response_is_vllms(vllm: Backend) -> None:
    real = vllm.post("/responses", RESPONSES_BODY)
    parsed = responses_parsed(vllm)
    prefilled = vllm.prefill("/chat/completions", parsed.model_dump(exclude_none=True), "chat")
    assert real["usage"]["input_tokens"] == prefilled.prompt_tokens
    text = real["output"][0]["content"][0]["text"]
    gateway = vllm.renderer(ResponsesRenderer, parsed, prefilled, RESPONSES_BODY).response(
        ParsedMessage(None, text, []),
        "length",
        None,
        Usage(prefilled.prompt_tokens, real["usage"]["output_tokens"]),
    )
    assert real["status"] == "incomplete"
    same_json(gateway, real)


def test_a_cut_response_stream_is_vllms(vllm: Backend) -> None:
    real = vllm.events("/responses", RESPONSES_BODY)
    parsed = responses_parsed(vllm)
    prefilled = vllm.prefill("/chat/completions", parsed.model_dump(exclude_none=True), "chat")
    renderer = vllm.renderer(ResponsesRenderer, parsed, prefilled, RESPONSES_BODY)
    out = renderer.start() or b""
    for event in real:
        if event["type"] == "response.output_text.delta":
            out += renderer.delta(ParsedDelta(content=event["delta"])) or b""
    final = real[-1]["response"]
    out += renderer.finish("length", None)
    out += renderer.usage(Usage(prefilled.prompt_tokens, final["usage"]["output_tokens"]))
    ours = [
        json.loads(block.split(b"\n")[1].removeprefix(b"data: "))
        for block in out.split(b"\n\n")
        if block
    ]
    # The same events, in the same order, each with the same fields in the same order.
    assert [(e["type"], list(e)) for e in ours] == [(e["type"], list(e)) for e in real]
    assert real[-1]["type"] == "response.completed" and final["status"] == "incomplete"
    for mine, theirs in zip(ours, real, strict=True):
        same_json(mine, theirs)
