"""Tokenizer specs, EOS ids, and the reproducible GLM-style fixture."""

from pathlib import Path

import pytest

from sim.fixtures import make_glm_tokenizer
from sim.tokenizers import GLM_FIXTURE_DIR, load_tokenizer, load_vocab


def test_the_committed_glm_fixture_is_rebuilt_byte_for_byte(tmp_path: Path) -> None:
    written = make_glm_tokenizer.write(tmp_path)
    assert {p.name for p in written} == {
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    }
    for path in written:
        assert path.read_bytes() == (GLM_FIXTURE_DIR / path.name).read_bytes(), path.name


def test_glm_fixture_is_small() -> None:
    assert (GLM_FIXTURE_DIR / "tokenizer.json").stat().st_size < 3_000_000


@pytest.mark.parametrize(
    ("token", "token_id"),
    [
        ("<|endoftext|>", 151329),
        ("[gMASK]", 151331),
        ("<|user|>", 151336),
        ("<|observation|>", 151338),
        ("<think>", 151350),
        ("</think>", 151351),
        ("<tool_call>", 151352),
        ("</tool_call>", 151353),
        ("<arg_key>", 151356),
        ("</arg_value>", 151359),
        ("/nothink", 151360),
    ],
)
def test_glm_special_tokens_have_glm45_ids(token: str, token_id: int) -> None:
    vocab = load_vocab("glm")
    assert vocab.encode(token) == [token_id]
    assert vocab.decode([token_id]) == token


def test_eos_ids_per_family() -> None:
    assert load_vocab("glm").eos_ids == (151329, 151336, 151338)
    deepseek = load_vocab("deepseek")
    assert deepseek.eos_ids == (deepseek.tokenizer.token_to_id("<｜end▁of▁sentence｜>"),)


@pytest.mark.parametrize("as_dir", [True, False])
def test_a_path_spec_loads_the_same_tokenizer(as_dir: bool) -> None:
    spec = str(GLM_FIXTURE_DIR if as_dir else GLM_FIXTURE_DIR / "tokenizer.json")
    assert load_vocab(spec).eos_ids == load_vocab("glm").eos_ids
    assert load_tokenizer(spec).encode("hello").ids == load_tokenizer("glm").encode("hello").ids


def test_unknown_spec_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        load_tokenizer(str(tmp_path / "missing"))


@pytest.mark.parametrize("spec", ["deepseek", "glm"])
def test_deepseek_markers_round_trip(spec: str) -> None:
    vocab = load_vocab(spec)
    text = 'x<｜DSML｜invoke name="f">杭州</｜DSML｜invoke>'
    assert vocab.decode(vocab.encode(text)) == text
