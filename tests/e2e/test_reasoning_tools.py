"""Reasoning and tool calls on the latency path, end to end: the OpenAI SDK (sync and async)
-> the gateway (a real process) -> simulated vLLM prefill and TileRT nodes, for GLM and
DeepSeek models.

The simulated model writes exactly the scripted outputs of docs/output-formats.md; the nodes
put 1, ~3 or 5 ids on each stream line, so markers arrive split across tokens and lines
differently per served name. Every test ends with the gateway holding no slot.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import tokenizers
from openai.types.chat import ChatCompletion

from sim.stack import SimStack
from tests.support.deployment import directive, latency_model, version_args
from tests.support.gateway import GatewayProcess, start_gateway
from tests.support.parser_fixtures import (
    CASES,
    DEEPSEEK,
    DS_THINK,
    DSML_BLOCK,
    DSML_CALLS,
    DSML_CHAT,
    DSML_EXAMPLE,
    GLM5,
    GLM45,
    GLM_TOKENIZER,
    GLM_TWO_CALLS,
    SERVED,
    SPLITS,
    THINK_OFF,
    TOOLS,
    WEATHER,
    Call,
    Case,
    directive_b64,
    dsml_block,
    dsml_invoke,
    dsml_param,
    family_models,
    glm_call,
    ids_to_reach,
    load_tokenizer,
    node_args,
)
from tests.support.stacks import StackPool

pytestmark = pytest.mark.usefixtures("all_slots_free")

# (reasoning, content, [(name, arguments)]): a message as the client reads it, ids aside.
View = tuple[str | None, str | None, list[tuple[str, str]]]


def sim_args(version: str) -> dict[str, list[str]]:
    """0.1.5 nodes put each step's ids on a line (the splits below show); 0.1.6 nodes send
    the first token alone, then batches."""
    args = version_args(version)
    return {
        "node_args": ["--step-ms", "1", *args["node_args"]],
        "prefill_args": ["--itl-ms", "0", "--prefill-ms-per-token", "0", *args["prefill_args"]],
    }


@pytest.fixture(scope="module")
def deepseek_stack(tilert_version: str, sim_stacks: StackPool) -> SimStack:
    names = [DEEPSEEK + s for s in SPLITS]
    return sim_stacks.get(
        nodes=3,
        tokenizer="deepseek",
        model=names,
        instance_args=node_args(3),
        **sim_args(tilert_version),
    )


@pytest.fixture(scope="module")
def glm_stack(tilert_version: str, sim_stacks: StackPool) -> SimStack:
    names = [GLM5 + s for s in SPLITS] + [GLM45]
    return sim_stacks.get(
        nodes=4,
        tokenizer="glm",
        model=names,
        instance_args=node_args(4),
        **sim_args(tilert_version),
    )


@pytest.fixture(scope="module")
def gateway(
    deepseek_stack: SimStack,
    glm_stack: SimStack,
    tilert_version: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    glm, v = str(GLM_TOKENIZER), tilert_version
    models = [
        *family_models(
            deepseek_stack, base=DEEPSEEK, tokenizer="deepseek", parser="deepseek_v32", tilert=v
        ),
        *family_models(glm_stack, base=GLM5, tokenizer=glm, parser="glm47", tilert=v),
        latency_model(
            glm_stack,
            GLM45,
            nodes=[glm_stack.nodes[3]],
            tokenizer=glm,
            output_parser="glm45",
            tilert=v,
        ),
    ]
    with start_gateway(tmp_path_factory, models) as running:
        yield running


@pytest.fixture(scope="module")
def family_tokenizers() -> dict[str, tokenizers.Tokenizer]:
    """The served models' tokenizers, by model family."""
    return {DEEPSEEK: load_tokenizer("deepseek"), GLM5: load_tokenizer(str(GLM_TOKENIZER))}


def request(
    model: str, output: str, *, template: dict[str, Any] | None = None, **extra: Any
) -> dict:
    """Keyword arguments for the SDK: a chat making the model write `output`, with TOOLS."""
    kwargs: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": directive(output)}],
        "tools": TOOLS,
        **extra,
    }
    if template is not None:
        kwargs["extra_body"] = {"chat_template_kwargs": template}
    return kwargs


def case_request(case: Case, split: str = "", **extra: Any) -> dict:
    return request(SERVED[case.parser] + split, case.output, template=case.template, **extra)


def view(message: Any) -> View:
    """A chat message (SDK object, streamed snapshot included) as the client reads it.

    A stream's first delta carries `content: ""` (as vLLM's does), so its accumulated
    content is "" where a non-streamed answer says null: both read as None here.
    """
    reasoning = (message.model_extra or {}).get("reasoning")
    calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
    return reasoning or None, message.content or None, calls


def expected_view(case: Case) -> View:
    return case.reasoning, case.content, [(c.name, c.arguments_json) for c in case.calls]


def assert_calls_typed(message: Any, calls: tuple[Call, ...]) -> None:
    """Arguments parse as JSON to the schema-typed values; ids are vLLM-style and distinct."""
    got = message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in got] == [
        (c.name, c.arguments) for c in calls
    ]
    ids = [c.id for c in got]
    assert all(i.startswith("chatcmpl-tool-") for i in ids)
    assert len(set(ids)) == len(ids)
    assert all(c.type == "function" for c in got)


async def stream_with_helper(
    aclient: openai.AsyncOpenAI, kwargs: dict
) -> tuple[ChatCompletion, list[tuple[str, str]]]:
    """Stream through the SDK's helper: its final snapshot and the finished tool calls."""
    done: list[tuple[str, str]] = []
    async with aclient.chat.completions.stream(**kwargs) as stream:
        async for event in stream:
            if event.type == "tool_calls.function.arguments.done":
                done.append((event.name, event.arguments))
        try:
            final = await stream.get_final_completion()
        except openai.LengthFinishReasonError as exc:
            final = exc.completion  # the helper refuses to "parse" a cut answer, but keeps it
    return final, done


STREAM_CASES = [
    pytest.param(case, split, id=f"{case.id}{split or '-t3'}")
    for case in CASES
    for split in (SPLITS if case.parser != "glm45" else [""])
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_message(client: openai.OpenAI, case: Case) -> None:
    reply = client.chat.completions.create(**case_request(case))
    choice = reply.choices[0]
    assert view(choice.message) == expected_view(case)
    assert choice.message.content == case.content  # null, never "", when there is none
    assert_calls_typed(choice.message, case.calls)
    assert choice.finish_reason == case.finish_reason


@pytest.mark.parametrize(("case", "split"), STREAM_CASES)
async def test_stream_equals_non_stream(
    aclient: openai.AsyncOpenAI, case: Case, split: str
) -> None:
    kwargs = case_request(case, split)
    whole = await aclient.chat.completions.create(**kwargs)
    final, done = await stream_with_helper(
        aclient, {**kwargs, "stream_options": {"include_usage": True}}
    )
    streamed = final.choices[0]
    assert view(streamed.message) == view(whole.choices[0].message) == expected_view(case)
    assert done == expected_view(case)[2]
    assert streamed.finish_reason == whole.choices[0].finish_reason == case.finish_reason
    assert final.usage is not None and whole.usage is not None
    assert final.usage.completion_tokens == whole.usage.completion_tokens


async def test_concurrent_streams_keep_their_own_state(aclient: openai.AsyncOpenAI) -> None:
    # Every case at once, spread over the nodes (queueing for busy ones): each answer is
    # parsed by its own request's parser, with its own tools and thinking mode.
    splits = list(SPLITS)
    cases = [
        (case, "" if case.parser == "glm45" else splits[i % len(splits)])
        for i, case in enumerate(CASES)
    ]
    results = await asyncio.gather(
        *(stream_with_helper(aclient, case_request(c, s)) for c, s in cases)
    )
    for (case, _), (final, _) in zip(cases, results, strict=True):
        assert view(final.choices[0].message) == expected_view(case), case.id
        assert final.choices[0].finish_reason == case.finish_reason


def test_sync_stream_helper(client: openai.OpenAI) -> None:
    case = next(c for c in CASES if c.id == "dsv32-example-thinking")
    with client.chat.completions.stream(**case_request(case, "-t1")) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_completion()
    assert view(final.choices[0].message) == expected_view(case)
    assert events.count("tool_calls.function.arguments.done") == len(case.calls)
    assert final.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("model", [GLM5, DEEPSEEK])
def test_calls_and_results_go_back_as_history(client: openai.OpenAI, model: str) -> None:
    # The usual agent loop: append the SDK's own assistant message and one tool result per
    # call, then ask again. The first turn's script is base64 so that the simulator takes
    # the second turn's (plain) script, which sits in the tool results.
    output = GLM_TWO_CALLS if model == GLM5 else DSML_EXAMPLE
    template = None if model == GLM5 else DS_THINK
    first = request(model, output, template=template)
    first["messages"] = [{"role": "user", "content": directive_b64(output)}]
    message = client.chat.completions.create(**first).choices[0].message
    assert len(message.tool_calls or []) == 2
    answer = "Both done.</think>Sunny in Beijing; the café is open."
    results = [
        {"role": "tool", "tool_call_id": call.id, "content": directive(answer)}
        for call in message.tool_calls or []
    ]
    second = client.chat.completions.create(
        **{**first, "messages": [*first["messages"], message, *results]}
    )
    choice = second.choices[0]
    assert view(choice.message) == ("Both done.", "Sunny in Beijing; the café is open.", [])
    assert choice.finish_reason == "stop"


@pytest.mark.parametrize("model", [GLM5 + "-t5", DEEPSEEK + "-t1"])
def test_tool_call_chunks(client: openai.OpenAI, model: str) -> None:
    # Each call opens with one delta carrying index, id, type and the whole name; later
    # deltas add argument fragments only, and calls never interleave.
    output = GLM_TWO_CALLS if model.startswith(GLM5) else DSML_EXAMPLE
    template = None if model.startswith(GLM5) else DS_THINK
    stream = client.chat.completions.create(
        **request(model, output, template=template), stream=True
    )
    calls: list[dict[str, str]] = []
    finishes = []
    for chunk in stream:
        for choice in chunk.choices:
            finishes.append(choice.finish_reason)
            for piece in choice.delta.tool_calls or []:
                if piece.id is not None:
                    assert piece.index == len(calls)
                    assert piece.type == "function" and piece.function is not None
                    assert piece.function.name
                    calls.append({"name": piece.function.name, "arguments": ""})
                else:
                    assert piece.index == len(calls) - 1
                    assert piece.function is not None and piece.function.name is None
                calls[piece.index]["arguments"] += piece.function.arguments or ""
    whole = client.chat.completions.create(**request(model, output, template=template))
    assert [(c["name"], c["arguments"]) for c in calls] == view(whole.choices[0].message)[2]
    assert len(calls) == 2
    assert finishes[-1] == "tool_calls" and set(finishes[:-1]) == {None}


def test_dsml_markers_span_several_ids(family_tokenizers: dict[str, tokenizers.Tokenizer]) -> None:
    # The premise of the split tests: on DeepSeek's tokenizer the DSML markers are several
    # ids, so a node sending one id per line splits every one of them across lines.
    tokenizer = family_tokenizers[DEEPSEEK]
    ids = tokenizer.encode(DSML_BLOCK, add_special_tokens=False).ids
    pieces = [tokenizer.decode([i], skip_special_tokens=False) for i in ids]
    for marker in ("<｜DSML｜function_calls>", "<｜DSML｜invoke", "</｜DSML｜parameter>"):
        assert marker in DSML_BLOCK
        assert not any(marker in piece for piece in pieces)
    assert "｜DSML｜" in pieces


TRUNCATIONS = [
    # (model, output, template, budget field, cut once this text is out, message kept)
    pytest.param(
        GLM5 + "-t1",
        GLM_TWO_CALLS,
        None,
        "max_tokens",
        '{"tags": ["a"',
        ("Need two lookups.", None, (WEATHER, Call("search", {"query": 'café "best"'}))),
        id="glm-mid-value",
    ),
    pytest.param(
        DEEPSEEK + "-t5",
        DSML_EXAMPLE,
        DS_THINK,
        "max_completion_tokens",
        'name="safe"',
        (
            "I should check.",
            "Checking now.\n\n",
            (DSML_CALLS[0], Call("search", {"filters": DSML_CALLS[1].arguments["filters"]})),
        ),
        id="dsml-mid-tag",
    ),
    pytest.param(
        DEEPSEEK,
        DSML_EXAMPLE,
        DS_THINK,
        "max_tokens",
        "I should",
        ("I should", None, ()),
        id="dsml-in-reasoning",
    ),
]


@pytest.mark.parametrize(
    ("model", "output", "template", "field", "anchor", "expected"), TRUNCATIONS
)
async def test_cut_by_max_tokens(
    aclient: openai.AsyncOpenAI,
    family_tokenizers: dict[str, tokenizers.Tokenizer],
    model: str,
    output: str,
    template: dict[str, Any] | None,
    field: str,
    anchor: str,
    expected: tuple[str | None, str | None, tuple[Call, ...]],
) -> None:
    # A call cut off keeps only its complete arguments, and the finish stays "length".
    tokenizer = family_tokenizers[DEEPSEEK if model.startswith(DEEPSEEK) else GLM5]
    budget = ids_to_reach(tokenizer, output, anchor)
    kwargs = request(model, output, template=template, **{field: budget})
    whole = await aclient.chat.completions.create(**kwargs)
    final, _ = await stream_with_helper(aclient, kwargs)
    reasoning, content, calls = expected
    for choice in (whole.choices[0], final.choices[0]):
        assert view(choice.message) == (
            reasoning,
            content,
            [(c.name, c.arguments_json) for c in calls],
        )
        assert choice.finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == budget


NO_CALLS = [
    # (model, output, template, request options, reasoning, content)
    pytest.param(
        GLM5,
        GLM_TWO_CALLS,
        None,
        {"tool_choice": "none"},
        "Need two lookups.",
        None,
        id="glm-tool-choice-none",
    ),
    pytest.param(
        GLM45,
        "Sure. " + glm_call("get_weather", ("city", "Oslo")) + " Done.",
        THINK_OFF,
        {"tools": None},
        None,
        "Sure.  Done.",
        id="glm45-no-tools",
    ),
    pytest.param(
        DEEPSEEK + "-t1",
        DSML_CHAT,
        None,
        {"tool_choice": "none"},
        None,
        DSML_CHAT,
        id="dsml-tool-choice-none",
    ),
]


@pytest.mark.parametrize(
    ("model", "output", "template", "options", "reasoning", "content"), NO_CALLS
)
async def test_no_calls_without_tools(
    aclient: openai.AsyncOpenAI,
    model: str,
    output: str,
    template: dict[str, Any] | None,
    options: dict[str, Any],
    reasoning: str | None,
    content: str | None,
) -> None:
    # As vLLM with tool_choice "none" (or no tools): no call is made; GLM's call markup is
    # left out of the content, DeepSeek's stays in it.
    kwargs = request(model, output, template=template, **options)
    if kwargs["tools"] is None:
        del kwargs["tools"]
    whole = await aclient.chat.completions.create(**kwargs)
    final, done = await stream_with_helper(aclient, kwargs)
    assert view(whole.choices[0].message) == view(final.choices[0].message)
    assert view(whole.choices[0].message) == (reasoning, content, [])
    assert done == []
    assert whole.choices[0].finish_reason == final.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_weather"}}],
    ids=["required", "named"],
)
@pytest.mark.parametrize("model", [GLM5, DEEPSEEK])
def test_forced_tool_choice_needs_the_throughput_path(
    client: openai.OpenAI, model: str, tool_choice: Any
) -> None:
    # The latency path cannot constrain decoding, so the guard sends a forced tool_choice to
    # throughput; these models have none, so the answer is a 400 naming the reason.
    output = GLM_TWO_CALLS if model == GLM5 else DSML_EXAMPLE
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**request(model, output, tool_choice=tool_choice))
    error = caught.value
    assert error.status_code == 400
    assert error.param == "tool_choice"
    assert error.code == "no_throughput_path"
    assert "throughput" in error.message
    assert error.response.headers["x-pd-reroute-reason"] == "tool_choice"


# As vLLM: GLM drops a call to a tool the request did not declare, DeepSeek keeps it.
UNKNOWN_TOOL = [
    # (model, output, template, (reasoning, content, calls kept), finish_reason)
    pytest.param(
        GLM5 + "-t1",
        "Cleaning up.</think>"
        + glm_call("delete_everything", ("path", "/"))
        + glm_call("get_weather", ("city", "Beijing")),
        None,
        ("Cleaning up.", None, (WEATHER,)),
        "tool_calls",
        id="glm-unknown-then-known",
    ),
    pytest.param(
        GLM5,
        glm_call("delete_everything", ("path", "/")),
        THINK_OFF,
        (None, None, ()),
        "stop",
        id="glm-only-unknown",
    ),
    pytest.param(
        DEEPSEEK + "-t1",
        dsml_block(
            dsml_invoke("delete_everything", dsml_param("path", "/", string=True)),
            dsml_invoke("get_weather", dsml_param("city", "Beijing", string=True)),
        ),
        None,
        (None, None, (Call("delete_everything", {"path": "/"}), WEATHER)),
        "tool_calls",
        id="dsml-unknown-then-known",
    ),
    pytest.param(
        DEEPSEEK + "-t5",
        "On it." + dsml_block(dsml_invoke("rm", dsml_param("path", "/", string=True))),
        None,
        (None, "On it.", (Call("rm", {"path": "/"}),)),
        "tool_calls",
        id="dsml-only-unknown",
    ),
]


@pytest.mark.parametrize(("model", "output", "template", "expected", "finish"), UNKNOWN_TOOL)
async def test_unknown_tool(
    aclient: openai.AsyncOpenAI,
    model: str,
    output: str,
    template: dict[str, Any] | None,
    expected: tuple[str | None, str | None, tuple[Call, ...]],
    finish: str,
) -> None:
    kwargs = request(model, output, template=template)
    whole = await aclient.chat.completions.create(**kwargs)
    final, done = await stream_with_helper(aclient, kwargs)
    reasoning, content, kept = expected
    calls = [(c.name, c.arguments_json) for c in kept]
    assert view(whole.choices[0].message) == view(final.choices[0].message)
    assert view(whole.choices[0].message) == (reasoning, content, calls)
    assert done == calls
    assert whole.choices[0].finish_reason == final.choices[0].finish_reason == finish


NON_ASCII = {"city": "Zürich 🙂", "location": "杭州市 — 西湖"}


@pytest.mark.parametrize(
    ("model", "output"),
    [
        pytest.param(
            GLM5 + "-t1",
            glm_call("get_weather", *NON_ASCII.items()),
            id="glm",
        ),
        pytest.param(
            DEEPSEEK + "-t1",
            dsml_block(
                dsml_invoke(
                    "get_weather", *(dsml_param(k, v, string=True) for k, v in NON_ASCII.items())
                )
            ),
            id="dsml",
        ),
    ],
)
async def test_non_ascii_arguments_are_not_escaped(
    aclient: openai.AsyncOpenAI, model: str, output: str
) -> None:
    kwargs = request(model, output, template=THINK_OFF)
    raw = await aclient.chat.completions.with_raw_response.create(**kwargs)
    whole: ChatCompletion = raw.parse()
    final, _ = await stream_with_helper(aclient, kwargs)
    for message in (whole.choices[0].message, final.choices[0].message):
        (call,) = message.tool_calls or []
        assert call.function.arguments == json.dumps(NON_ASCII, ensure_ascii=False)
        assert "\\u" not in call.function.arguments
    # On the wire too: the JSON string holding the arguments escapes only its quotes.
    body = json.loads(raw.http_response.content)
    arguments = body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
    assert json.dumps(arguments, ensure_ascii=False).encode() in raw.http_response.content


@pytest.mark.parametrize("model", [GLM5, DEEPSEEK])
def test_parallel_tool_calls_false_keeps_only_the_first_call(
    client: openai.OpenAI, model: str
) -> None:
    """As vLLM: two calls in the output, one reaches the client, streamed or not."""
    output = GLM_TWO_CALLS if model == GLM5 else DSML_EXAMPLE
    template = None if model == GLM5 else DS_THINK
    body = {**request(model, output, template=template), "parallel_tool_calls": False}
    both = view(
        client.chat.completions.create(**request(model, output, template=template))
        .choices[0]
        .message
    )[2]
    whole = client.chat.completions.create(**body).choices[0]
    assert view(whole.message)[2] == both[:1]
    assert whole.finish_reason == "tool_calls"
    streamed_indexes = {
        piece.index
        for chunk in client.chat.completions.create(**body, stream=True)
        for choice in chunk.choices
        for piece in choice.delta.tool_calls or []
    }
    assert streamed_indexes == {0}
