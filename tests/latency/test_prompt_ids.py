"""Chat prompts as token ids: the conversation as vLLM hands it to the template, which
requests go as text, and the proof that a prefill server renders as the gateway does."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from router.cli import main
from router.config import UpstreamsConfig
from router.latency.prompt_ids import PromptIds, rendered_chat
from router.latency.token_ids_proof import CANARIES, TokenIdsProof
from router.telemetry.metrics import Metrics
from router.tokens.prompt_tokens import PromptCounter
from router.tokens.tokenizer import load_tokenizer
from router.upstream import Upstreams
from router.upstream.httpx_transport import HttpxTransport
from router.upstream.timeouts import Timeouts
from router.upstream.vllm import prefill_body
from tests.support.tiny_model import write_model

USER = {"role": "user", "content": "hi"}


def test_the_conversation_is_rebuilt_as_vllm_rebuilds_it() -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    body = {
        "model": "m",
        "temperature": 0,
        "messages": [
            {"role": "system", "content": "s", "name": "boss"},
            USER,
            {"role": "assistant", "content": None, "tool_calls": [call], "reasoning": "r"},
            {"role": "tool", "tool_call_id": "c", "content": "4"},
            {"role": "assistant", "content": "x", "tool_calls": []},
        ],
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "chat_template_kwargs": {"enable_thinking": False, "effort": None, "mode": "auto"},
    }
    assert rendered_chat(body) == {
        "messages": [
            {"role": "system", "content": "s", "name": "boss"},
            USER,
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{**call, "function": {"name": "f", "arguments": {"a": 1}}}],
                "reasoning": "r",
                "reasoning_content": "r",
            },
            {"role": "tool", "content": "4", "tool_call_id": "c"},
            {"role": "assistant", "content": "x"},
        ],
        "tools": [
            {"type": "function", "function": {"name": "f", "description": None, "parameters": None}}
        ],
        "chat_template_kwargs": {"enable_thinking": False},
    }


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [("not json", {}), ("[1, 2]", {}), ("", {}), (None, {}), ({"b": 2}, {"b": 2})],
)
def test_tool_call_arguments_become_an_object(arguments: Any, expected: Any) -> None:
    call = {"type": "function", "function": {"name": "f", "arguments": arguments}}
    rendered = rendered_chat({"messages": [{"role": "assistant", "tool_calls": [call]}, USER]})
    assert rendered is not None
    assert rendered["messages"][0]["tool_calls"][0]["function"]["arguments"] == expected


@pytest.mark.parametrize(
    "body",
    [
        {"messages": []},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
        {"messages": [{"role": "user", "content": "hi", "audio": {}}]},
        {"messages": [{"role": "developer", "content": "hi"}]},
        {"messages": [USER], "chat_template": "x"},
        {"messages": [USER], "reasoning_effort": "high"},
        {"messages": [USER], "echo": True},
        {"messages": [USER], "add_generation_prompt": False},
        {"messages": [USER], "add_special_tokens": True},
        {
            "messages": [USER],
            "tools": [{"type": "function", "function": {"name": "f"}}],
            "tool_choice": "none",
        },
        {"messages": [USER], "tools": [{"type": "function", "function": {"name": "f", "x": 1}}]},
        {"messages": [USER], "chat_template_kwargs": "yes"},
        {"messages": [{"role": "user", "content": "hi", "tool_calls": []}]},
    ],
)
def test_requests_rendered_otherwise_go_as_text(body: dict[str, Any]) -> None:
    assert rendered_chat(body) is None


def test_the_ids_ride_in_the_prefills_transfer_parameters() -> None:
    body = prefill_body({"messages": [USER]}, {"tilert_host": "n"}, prompt_token_ids=[1, 2])
    assert body["messages"] == [USER]
    assert body["kv_transfer_params"] == {"tilert_host": "n", "prompt_token_ids": [1, 2]}
    assert "prompt_token_ids" not in prefill_body({}, {"tilert_host": "n"})["kv_transfer_params"]


@pytest.fixture(scope="module")
def prompt_ids(tmp_path_factory: pytest.TempPathFactory) -> PromptIds:
    directory = write_model(tmp_path_factory.mktemp("tiny"))
    tokenizer = load_tokenizer(str(directory), base_dir=directory)
    return PromptIds(PromptCounter(tokenizer, directory / "tokenizer.json"))


async def test_ids_are_the_templates_rendering_encoded(prompt_ids: PromptIds) -> None:
    ids = await prompt_ids.ids({"model": "m", "messages": [USER]})
    assert ids is not None and ids[0] == 0  # the template's BOS, as vLLM renders it
    assert await prompt_ids.ids({"messages": [USER], "chat_template": "x"}) is None


async def test_without_a_template_nothing_is_sent_as_ids(tmp_path: Path) -> None:
    directory = write_model(tmp_path)
    config = json.loads((directory / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = load_tokenizer(str(directory), base_dir=directory)
    ids = PromptIds(PromptCounter(tokenizer, directory / "tokenizer.json"))
    assert not ids.exact
    assert await ids.ids({"messages": [USER]}) is None


def _proof(prompt_ids: PromptIds, answer: Any) -> tuple[TokenIdsProof, list[Any]]:
    seen: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return answer(seen[-1])

    transport = HttpxTransport(httpx.MockTransport(handler))
    upstreams = Upstreams(UpstreamsConfig(), Timeouts(), transport=transport)
    return TokenIdsProof("m", prompt_ids, upstreams, Metrics()), seen


async def test_a_server_rendering_alike_is_proven(prompt_ids: PromptIds) -> None:
    def tokenize(body: dict[str, Any]) -> httpx.Response:
        rendered = rendered_chat({k: v for k, v in body.items() if k != "add_generation_prompt"})
        assert rendered is not None
        return httpx.Response(200, json={"tokens": prompt_ids.ids_now(rendered)})

    proof, seen = _proof(prompt_ids, tokenize)
    assert await proof.prove("http://p")
    assert proof.proven("http://p")
    assert [s["messages"] for s in seen] == [c["messages"] for _, c in CANARIES]
    # Unknown, a server is asked in the background and gets text meanwhile.
    assert not proof.proven("http://q")
    await asyncio.wait([proof._proving["http://q"]])
    assert proof.proven("http://q")


@pytest.mark.parametrize(
    "answer",
    [
        lambda body: httpx.Response(404, json={"detail": "Not Found"}),
        lambda body: httpx.Response(200, json={"tokens": [1, 2, 3]}),
    ],
)
async def test_a_server_rendering_otherwise_gets_text(prompt_ids: PromptIds, answer: Any) -> None:
    proof, _ = _proof(prompt_ids, answer)
    assert not await proof.prove("http://p")
    assert not proof.proven("http://p")
    assert proof.verdicts() == {"http://p": False}


async def test_a_silent_server_stays_unproven(prompt_ids: PromptIds) -> None:
    def refuse(body: dict[str, Any]) -> httpx.Response:
        raise httpx.ConnectError("refused")

    proof, _ = _proof(prompt_ids, refuse)
    assert not await proof.prove("http://p")
    assert proof.verdicts() == {}  # asked again later, not judged


@pytest.mark.parametrize("template", [True, False])
def test_check_refuses_token_ids_without_the_models_template(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], template: bool
) -> None:
    directory = write_model(tmp_path / "model")
    if not template:
        config = json.loads((directory / "tokenizer_config.json").read_text())
        del config["chat_template"]
        (directory / "tokenizer_config.json").write_text(json.dumps(config))
    router_yaml = tmp_path / "router.yaml"
    router_yaml.write_text(
        f"""
models:
  - name: m
    tokenizer: {directory}
    latency:
      prefill: [http://127.0.0.1:9]
      nodes: [{{host: 127.0.0.1, ctrl_port: 9, http_port: 9}}]
      prefill_input: token_ids
"""
    )
    assert main(["check", "--config", str(router_yaml)]) == (0 if template else 2)
    err = capsys.readouterr().err
    if not template:
        field = "models[0] (m).latency.prefill_input"
        assert err.startswith(f"error: {router_yaml}: {field}: token_ids ")
        assert "has no chat_template" in err
