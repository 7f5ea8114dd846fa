"""A native answer whose decode server dies mid-stream goes on on another, unseen: the real
OpenAI SDK -> the gateway (a real process) -> simulated vLLM servers (real processes; two
decode servers running DeepSeek-V3.2's reasoning and tool-call parsers) whose model
continues a context greedily, so the continued answer is held to an uninterrupted one.

The decode leg asks for its chunks' ids (`return_token_ids`) and the client never sees
them; the server that goes on is sent the prompt and the output so far as ids, with what is
left of the budget. Both decode servers are armed to die once, so an answer breaks twice:
`ds-pull` and `ds-push` go on twice (`continuations: 2`), `ds-once` once, then ends with
an error event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from demo.plan import parser_flags
from sim.stack import SimStack
from tests.support.deployment import directive, sim_get, sim_post
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.parser_fixtures import CASES, DEEPSEEK, TOOLS, Case, load_tokenizer
from tests.support.stacks import StackPool

pytestmark = pytest.mark.usefixtures("fresh_sims")

TEXT = "Hello, wörld! 你好世界 🌍🚀 — naïve café. Done, and then some more words to go on."
DS_CASES = [case for case in CASES if case.parser == "deepseek_v32"]
FAST = ["--itl-ms", "0", "--prefill-ms-per-token", "0"]


@pytest.fixture(scope="module")
def stack(sim_stacks: StackPool) -> SimStack:
    parsers = parser_flags("deepseek_v32")
    return sim_stacks.get(
        nodes=0,
        prefills=1,
        decodes=2,
        tokenizer="deepseek",
        model=["ds-pull", "ds-push", "ds-once", DEEPSEEK],
        prefill_args=FAST,
        decode_args=FAST,
        instance_args={"decode-0": parsers, "decode-1": parsers},
    )


@pytest.fixture(scope="module")
def gateway(stack: SimStack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    prefill = stack.prefills[0]
    decode = [server.url for server in stack.decodes]
    engine = {
        "url": prefill.url,
        "engine_id": prefill.engine_id,
        "side_channel_host": prefill.side_channel_host,
        "side_channel_port": prefill.side_channel_port,
    }
    pull = {"mode": "pull", "prefill": [prefill.url], "decode": decode}

    def model(name: str, throughput: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": name,
            "tokenizer": "deepseek",
            "output_parser": "deepseek_v32",
            "throughput": throughput,
        }

    models = [
        model("ds-pull", {**pull, "continuations": 2}),
        model(DEEPSEEK, {**pull, "continuations": 2}),
        model(
            "ds-push", {"mode": "push", "prefill": [engine], "decode": decode, "continuations": 2}
        ),
        model("ds-once", pull),
    ]
    with start_gateway(tmp_path_factory, models) as running:
        yield running


@pytest.fixture
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.base_url, api_key="sk-test", max_retries=0)


def die_on_every_decode(stack: SimStack, after: int) -> None:
    for server in stack.decodes:
        sim_post(server.url, "/sim/faults", {"die_after": after, "count": 1})


def continuations(stack: SimStack) -> list[dict[str, Any]]:
    """What the decode servers were asked to go on with (completions requests of ids), the
    first first."""
    seen = [r for s in stack.decodes for r in sim_get(s.url, "/sim/requests")["requests"]]
    bodies = [r["body"] for r in seen if isinstance(r["body"].get("prompt"), list)]
    return sorted(bodies, key=lambda body: len(body["prompt"]))


def chat(client: openai.OpenAI, model: str, **body: Any) -> tuple[str, str | None, Any, list]:
    chunks = list(
        client.chat.completions.create(
            model=model,
            stream=True,
            stream_options={"include_usage": True},
            **body,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert len(finishes) == 1, finishes
    return text, finishes[0], chunks[-1].usage, chunks


@pytest.mark.parametrize("model", ["ds-pull", "ds-push"])
@pytest.mark.parametrize("after", [3, 11])
def test_a_chat_stream_whose_decode_server_dies_goes_on_as_if_it_had_not(
    client: openai.OpenAI, stack: SimStack, model: str, after: int
) -> None:
    body = {"messages": [{"role": "user", "content": directive(TEXT)}], "max_tokens": 200}
    expected = chat(client, model, **body)
    die_on_every_decode(stack, after)

    text, finish, usage, chunks = chat(client, model, **body)

    assert (text, finish) == expected[:2]
    assert usage.model_dump() == expected[2].model_dump()
    assert len({c.id for c in chunks}) == 1
    [first, second] = continuations(stack)
    assert first["return_token_ids"] and first["stream"]
    assert second["prompt"][: len(first["prompt"])] == first["prompt"]  # and what it made
    assert first["max_tokens"] == 200 - (len(first["prompt"]) - usage.prompt_tokens)


@pytest.mark.parametrize("model", ["ds-pull", "ds-push"])
def test_a_completions_stream_goes_on_too(
    client: openai.OpenAI, stack: SimStack, model: str
) -> None:
    def text() -> tuple[str, Any]:
        chunks = list(
            client.completions.create(
                model=model,
                prompt=directive(TEXT),
                max_tokens=200,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        return "".join(c.choices[0].text for c in chunks if c.choices), chunks[-1].usage

    expected = text()
    die_on_every_decode(stack, 5)
    assert text() == expected
    assert len(continuations(stack)) == 2


def test_without_a_budget_it_goes_on_within_the_models_context(
    client: openai.OpenAI, stack: SimStack
) -> None:
    body = {"messages": [{"role": "user", "content": directive(TEXT)}]}
    expected = chat(client, "ds-pull", **body)
    die_on_every_decode(stack, 4)
    assert chat(client, "ds-pull", **body)[:2] == expected[:2]
    max_model_len = sim_get(stack.decodes[0].url, "/v1/models")["data"][0]["max_model_len"]
    first = continuations(stack)[0]
    assert first["max_tokens"] == max_model_len - len(first["prompt"])


def test_a_stop_string_across_the_seam_is_found(client: openai.OpenAI, stack: SimStack) -> None:
    body = {
        "messages": [{"role": "user", "content": directive(TEXT)}],
        "max_tokens": 200,
        "stop": ["naïve café"],
    }
    expected = chat(client, "ds-pull", **body)
    assert expected[0].endswith("— ") and expected[1] == "stop"
    # The server dies after the stop string's first token, which it held back (the role
    # chunk is the stream's first event).
    ids = load_tokenizer("deepseek").encode(TEXT, add_special_tokens=False).ids
    shown = next(n for n in range(len(ids)) if "naïve" in _decoded(ids[: n + 1]))
    die_on_every_decode(stack, 1 + shown)
    assert chat(client, "ds-pull", **body)[:2] == expected[:2]


def _decoded(ids: list[int]) -> str:
    return str(load_tokenizer("deepseek").decode(ids))


def parsed(client: openai.OpenAI, case: Case) -> tuple[str | None, str | None, list, str]:
    extra = {} if case.template is None else {"chat_template_kwargs": case.template}
    reasoning, content, finish = "", "", None
    calls: dict[int, dict[str, str]] = {}
    stream = client.chat.completions.create(
        model=DEEPSEEK,
        messages=[{"role": "user", "content": directive(case.output)}],
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=512,
        stream=True,
        extra_body=extra,
    )
    for chunk in stream:
        delta = chunk.choices[0].delta
        reasoning += getattr(delta, "reasoning", None) or ""
        content += delta.content or ""
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"name": "", "arguments": ""})
            assert part.function is not None
            call["name"] += part.function.name or ""
            call["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish is not None
    tools = [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)]
    return reasoning or None, content or None, tools, finish


@pytest.mark.parametrize("case", DS_CASES, ids=[c.id for c in DS_CASES])
@pytest.mark.parametrize("after", [2, 6, 20])
def test_a_seam_inside_reasoning_or_a_tool_call_is_invisible(
    client: openai.OpenAI, stack: SimStack, case: Case, after: int
) -> None:
    expected = (
        case.reasoning,
        case.content,
        [(c.name, c.arguments) for c in case.calls],
        case.finish_reason,
    )
    assert parsed(client, case) == expected
    die_on_every_decode(stack, after)
    assert parsed(client, case) == expected


def test_past_its_continuations_the_stream_ends_with_an_error_event(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    body = {
        "model": "ds-once",
        "messages": [{"role": "user", "content": directive(TEXT)}],
        "max_tokens": 200,
        "stream": True,
    }
    die_on_every_decode(stack, 4)
    with httpx.Client(timeout=30) as http:
        answer = http.post(gateway.base_url + "/chat/completions", json=body)
    events = [e for e in answer.text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    error = json.loads(events[-2].removeprefix("data: "))["error"]
    assert "mid-stream" in error["message"]
    assert len(continuations(stack)) == 1


def test_the_client_sees_no_ids_it_did_not_ask_for(
    gateway: GatewayProcess, stack: SimStack
) -> None:
    body = {
        "model": "ds-pull",
        "messages": [{"role": "user", "content": directive(TEXT)}],
        "max_tokens": 20,
        "stream": True,
    }
    with httpx.Client(timeout=30) as http:
        plain = http.post(gateway.base_url + "/chat/completions", json=body).text
        asked = http.post(
            gateway.base_url + "/chat/completions", json={**body, "return_token_ids": True}
        ).text
    assert '"token_ids":[' not in plain and '"prompt_token_ids":[' not in plain
    assert '"token_ids":[' in asked and '"prompt_token_ids":[' in asked
    decoded = [json.loads(e[6:]) for e in plain.split("\n\n") if e.startswith("data: {")]
    # No chunk of the stream is there for its ids alone.
    assert all(c["choices"][0]["delta"] or c["choices"][0]["finish_reason"] for c in decoded)


@pytest.mark.parametrize("model", ["ds-pull", "ds-push"])
def test_an_answer_not_streamed_is_served_again_unseen(
    client: openai.OpenAI, stack: SimStack, model: str
) -> None:
    body = {"messages": [{"role": "user", "content": directive(TEXT)}], "max_tokens": 200}
    expected = client.chat.completions.create(model=model, **body)  # type: ignore[call-overload]
    die_on_every_decode(stack, 5)

    answer = client.chat.completions.create(model=model, **body)  # type: ignore[call-overload]

    assert answer.choices[0].message.content == expected.choices[0].message.content == TEXT
    assert answer.usage.model_dump() == expected.usage.model_dump()
    # Both decode servers broke once; the third try, whole, was the answer.
    whole = [
        r
        for s in stack.decodes
        for r in sim_get(s.url, "/sim/requests")["requests"]
        if "kv_transfer_params" not in r["body"]
    ]
    assert len(whole) == 2


def test_past_its_continuations_an_answer_not_streamed_is_a_502(
    client: openai.OpenAI, stack: SimStack
) -> None:
    die_on_every_decode(stack, 5)
    with pytest.raises(openai.APIStatusError) as failed:
        client.chat.completions.create(
            model="ds-once",
            messages=[{"role": "user", "content": directive(TEXT)}],
            max_tokens=200,
        )
    assert failed.value.status_code == 502


def test_usage_on_every_chunk_goes_on_counting(client: openai.OpenAI, stack: SimStack) -> None:
    def counts() -> list[tuple[str, int]]:
        chunks = client.chat.completions.create(
            model="ds-pull",
            messages=[{"role": "user", "content": directive(TEXT)}],
            max_tokens=200,
            stream=True,
            stream_options={"include_usage": True, "continuous_usage_stats": True},  # type: ignore[typeddict-unknown-key]
        )
        text, running = "", []
        for chunk in chunks:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
            assert chunk.usage is not None
            running.append(chunk.usage.completion_tokens)
        return [(text, running[-1])], running

    expected, _ = counts()
    die_on_every_decode(stack, 6)
    got, running = counts()
    assert got == expected
    # Counted on every chunk, across both seams, up to the whole answer's count.
    assert running == sorted(running) and running[0] == 0 and len(set(running)) > 10
