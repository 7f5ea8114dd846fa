"""The gateway's rendering and encoding of chat prompts against real vLLM's.

`latency.prefill_input: token_ids` sends a chat prompt as the ids the gateway rendered and
encoded; that is only right where they equal vLLM's. One vLLM serves a model with a shipped
GLM tokenizer and its chat template (and, trusting request templates, the tiny model's and a
reasoning template over the same tokenizer); many generated chats (multi-turn histories,
system prompts, tools, tool calls and their results, reasoning switched on and off, unicode)
must give the same ids at its `/tokenize` as in the gateway. Then the latency path with
`token_ids` against this vLLM as prefill answers as with `text`.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.latency.prompt_ids import PromptIds, rendered_chat
from router.tokens.prompt_tokens import PromptCounter
from router.tokens.tokenizer import load_tokenizer
from sim.stack import SimStack
from tests.real_vllm.compare import exchange, stream_ending, textless
from tests.real_vllm.conftest import connector_args, require_vllm
from tests.real_vllm.server import VllmServer
from tests.support.deployment import node_entry
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.tiny_model import CHAT_TEMPLATE, MAX_MODEL_LEN, write_model

ROOT = Path(__file__).resolve().parents[2]
GLM = ROOT / "sim" / "fixtures" / "glm"
CHATS = 60

REASONING_TEMPLATE = (
    "{% if tools %}<|system|>{% for tool in tools %}{{ tool | tojson }}{% endfor %}{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    "{{ m.content }}"
    "{% for call in m.tool_calls or [] %}"
    "<call>{{ call.function.name }}:{{ call.function.arguments | tojson }}</call>"
    "{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>"
    "{% if enable_thinking is defined and not enable_thinking %}<think></think>{% endif %}"
    "{% endif %}"
)
TEMPLATES = {"glm": None, "tiny": CHAT_TEMPLATE, "reasoning": REASONING_TEMPLATE}

WORDS = [
    "river", "bridge", "Paris", "café", "naïve", "速度", "🌍", "weather", "story", "\n",
    "  spaced  ", "tab\there", "quote\"s", "{json}", "<|user|>", "</s>", "ünïcödé", "42",
]  # fmt: skip
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {"type": "function", "function": {"name": "now"}},
    {
        "type": "function",
        "function": {"name": "search", "parameters": {"type": "object"}, "strict": True},
    },
]


def _text(rng: random.Random) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 12)))


def generated_chat(rng: random.Random) -> dict[str, Any]:
    """One chat as a client may send it."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": _text(rng)})
    for turn in range(rng.randint(1, 4)):
        messages.append({"role": "user", "content": _text(rng)})
        if turn and rng.random() < 0.2:
            break
        kind = rng.random()
        if kind < 0.3:
            args = rng.choice(['{"city": "Paris"}', "", "not json", "[1]", '{"a": {"b": [1, 2]}}'])
            call = {"id": f"call_{turn}", "type": "function"}
            call["function"] = {"name": rng.choice(["get_weather", "now"]), "arguments": args}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": _text(rng)})
        else:
            answer: dict[str, Any] = {"role": "assistant", "content": _text(rng)}
            if kind > 0.8:
                answer["reasoning"] = _text(rng)
            messages.append(answer)
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": _text(rng)})
    body: dict[str, Any] = {"messages": messages}
    if rng.random() < 0.4:
        body["tools"] = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
    if rng.random() < 0.5:
        body["chat_template_kwargs"] = {"enable_thinking": rng.random() < 0.5}
    return body


@pytest.fixture(scope="module")
def glm_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_model(tmp_path_factory.mktemp("glm-model"), tokenizer_dir=GLM)


@pytest.fixture(scope="module")
def prefill(glm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    require_vllm()
    log = tmp_path_factory.mktemp("rendering") / "vllm.log"
    args = [*connector_args("0.1.6"), "--trust-request-chat-template"]
    server = VllmServer(glm_model, log, args, env={"PYTHONPATH": str(ROOT)})
    try:
        yield server.start()
    finally:
        server.stop()


def _prompt_ids(model_dir: Path, template: str | None, where: Path) -> PromptIds:
    """The gateway's rendering for `model_dir`'s tokenizer with `template` (its own: None)."""
    if template is not None:
        where.mkdir()
        shutil.copyfile(model_dir / "tokenizer.json", where / "tokenizer.json")
        config = json.loads((model_dir / "tokenizer_config.json").read_text())
        (where / "tokenizer_config.json").write_text(
            json.dumps({**config, "chat_template": template})
        )
        model_dir = where
    tokenizer = load_tokenizer(str(model_dir), base_dir=model_dir)
    return PromptIds(PromptCounter(tokenizer, model_dir / "tokenizer.json"))


@pytest.mark.parametrize("template", TEMPLATES)
def test_the_gateways_ids_are_vllms(
    template: str, prefill: VllmServer, glm_model: Path, tmp_path: Path
) -> None:
    source = TEMPLATES[template]
    prompt_ids = _prompt_ids(glm_model, source, tmp_path / "tokenizer")
    rng = random.Random(f"rendering-{template}")
    compared = 0
    with httpx.Client(timeout=60) as client:
        for _ in range(CHATS):
            chat = generated_chat(rng)
            rendered = rendered_chat(chat)
            assert rendered is not None, chat
            ours = prompt_ids.ids_now(rendered)
            body = {"model": prefill.model, **chat}
            if source is not None:
                body["chat_template"] = source
            answer = client.post(f"{prefill.url}/tokenize", json=body)
            assert answer.status_code == 200, answer.text
            assert ours == answer.json()["tokens"], chat
            compared += 1
    assert compared == CHATS


def test_requests_rendered_otherwise_get_no_ids() -> None:
    user = {"role": "user", "content": "hi"}
    for body in [
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        {"messages": [user], "chat_template": "{{ messages }}"},
        {"messages": [user], "documents": [{"text": "d"}]},
        {"messages": [user], "reasoning_effort": "low"},
        {"messages": [user], "tools": TOOLS, "tool_choice": "none"},
        {"messages": [user], "continue_final_message": True, "add_generation_prompt": False},
        {"messages": [{"role": "developer", "content": "be brief"}, user]},
        {"messages": [user], "truncate_prompt_tokens": 10},
    ]:
        assert rendered_chat(body) is None, body


@pytest.fixture(scope="module")
def node(glm_model: Path) -> Iterator[SimStack]:
    node_args = ["--no-data-plane", "--senders", "1", "--max-seq-len", str(MAX_MODEL_LEN)]
    with SimStack(nodes=1, prefills=0, tokenizer=str(glm_model), node_args=node_args) as stack:
        yield stack


@pytest.fixture(scope="module")
def gateways(
    prefill: VllmServer, node: SimStack, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, GatewayProcess]]:
    def model(prefill_input: str) -> dict[str, Any]:
        return {
            "name": prefill.model,
            "tokenizer": str(prefill.model_dir),
            "latency": {
                "tilert": "0.1.6",
                "prefill": [prefill.url],
                "nodes": [node_entry(n) for n in node.nodes],
                "max_seq_len": MAX_MODEL_LEN,
                "prefill_input": prefill_input,
            },
        }

    # The node serves one decode at a time: each gateway's own pool holds it in turn.
    with start_gateway(tmp_path_factory, [model("text")]) as text:
        with start_gateway(tmp_path_factory, [model("token_ids")]) as token_ids:
            yield {"text": text, "token_ids": token_ids}


def _metric(client: httpx.Client, gateway: GatewayProcess, name: str) -> dict[str, float]:
    page = client.get(f"{gateway.url}/metrics").text
    found = re.findall(rf"^{name}_total\{{(.*)\}} (\S+)$", page, flags=re.MULTILINE)
    return {labels: float(value) for labels, value in found}


def test_token_ids_answer_as_text(gateways: dict[str, GatewayProcess]) -> None:
    rng = random.Random("end-to-end")
    cases = [generated_chat(rng) for _ in range(4)]
    with httpx.Client(timeout=120) as client:
        ids_gateway = gateways["token_ids"]
        # The first request has the prefill server proven, in the background.
        first = {"model": "tiny", **cases[0], "max_tokens": 4, "temperature": 0}
        assert exchange(client, ids_gateway.url, "/v1/chat/completions", first).status == 200
        deadline = time.monotonic() + 60
        while not _metric(client, ids_gateway, "pd_gateway_prefill_token_ids_proofs"):
            assert time.monotonic() < deadline, "the prefill server was never proven"
            time.sleep(0.2)  # the proof runs inside the gateway's process
        verdicts = _metric(client, ids_gateway, "pd_gateway_prefill_token_ids_proofs")
        assert [labels for labels in verdicts if 'verdict="identical"' in labels], verdicts
        for chat in cases:
            for stream in (False, True):
                # One token: the prefill's own, so the whole answer is vLLM's prefill's (the
                # node's tokens after it follow each request's own id).
                body = {"model": "tiny", **chat, "max_tokens": 1, "temperature": 0}
                body["stream"] = stream
                if stream:
                    body["stream_options"] = {"include_usage": True}
                text = exchange(client, gateways["text"].url, "/v1/chat/completions", body)
                ids = exchange(client, ids_gateway.url, "/v1/chat/completions", body)
                assert text.status == ids.status == 200, (text.body, ids.body)
                assert ids.body == text.body
                longer = {**body, "max_tokens": 6}
                text = exchange(client, gateways["text"].url, "/v1/chat/completions", longer)
                ids = exchange(client, ids_gateway.url, "/v1/chat/completions", longer)
                assert text.status == ids.status == 200, (text.body, ids.body)
                if stream:
                    assert stream_ending(ids.body) == stream_ending(text.body)
                else:
                    assert textless(ids.body) == textless(text.body)
        inputs = _metric(client, ids_gateway, "pd_gateway_prefill_inputs")
    assert inputs.get('input="token_ids",model="tiny"') == 4 * len(cases), inputs


def test_vllm_prefills_the_ids_it_is_given(prefill: VllmServer) -> None:
    """The prefill takes the ids in `kv_transfer_params` instead of rendering the messages:
    its prompt is as long as the ids, not as the messages. (Last in the module: its
    transfer parameters name no node, which the TileRT connector is not meant to see.)"""
    chat = {"model": prefill.model, "messages": [{"role": "user", "content": "Hello there."}]}
    with httpx.Client(timeout=60) as client:
        rendered = client.post(f"{prefill.url}/tokenize", json=chat).json()["tokens"]
        ids = rendered * 3
        answer = client.post(
            f"{prefill.url}/v1/chat/completions",
            json={**chat, "max_tokens": 1, "kv_transfer_params": {"prompt_token_ids": ids}},
        )
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["prompt_tokens"] == len(ids) != len(rendered)
