"""The scripted output every request asks the simulators for: mixed English, CJK and emoji
text of a known length in DeepSeek tokens, so that each answer can be checked."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from router.tokens.tokenizer import tokenizer_path

SENTENCES = [
    "The gateway relays token ids from the decode node to the client as text.",
    "Prefill and decode run on different machines, so the KV cache moves over RDMA.",
    "Café, naïve, façade and Ångström keep their accents 🙂 even when split.",
    "预填充和解码分离以后，首个令牌的延迟明显降低。",
    "流式输出时，多字节字符可能被拆分到两个令牌中，必须完整地输出。",
    "Latency matters: p99 time-to-first-token dropped from 800 ms to 120 ms 🚀.",
    "日本語も少し混ざります：ストリーミング出力のテストです。",
]


@dataclass(frozen=True, slots=True)
class Script:
    """The scripted output, its length in tokens, and the prompt that makes a sim produce it."""

    text: str
    tokens: int
    prompt: str


def make_script(tokens: int) -> Script:
    """Shuffled sentences cut to `tokens` DeepSeek tokens, never inside a character."""
    tokenizer = Tokenizer.from_file(str(tokenizer_path("deepseek", base_dir=Path())))
    rng = random.Random(0)
    text = ""
    while len(tokenizer.encode(text, add_special_tokens=False).ids) < tokens:
        text += rng.choice(SENTENCES) + rng.choice((" ", "\n"))
    ids = tokenizer.encode(text, add_special_tokens=False).ids[:tokens]
    text = tokenizer.decode(ids).rstrip("\ufffd")
    count = len(tokenizer.encode(text, add_special_tokens=False).ids)
    return Script(text, count, f"[[sim-output]]{text}[[/sim-output]]")
