"""Engine steps of the vLLM simulator: EOS, length, stop strings, stop token ids."""

import pytest

from sim.tokenizers import Vocab, load_vocab
from sim.vllm.engine import generate


@pytest.fixture(scope="module")
def vocab() -> Vocab:
    return load_vocab("deepseek")


def _ids(vocab: Vocab, text: str) -> list[int]:
    return [*vocab.encode(text), vocab.eos_ids[0]]


def test_eos_ends_with_stop_and_counts_as_a_token(vocab: Vocab) -> None:
    ids = _ids(vocab, "Hi café 🙂")
    steps = generate(vocab, ids, None)
    assert [s.token_id for s in steps] == ids
    assert "".join(s.text for s in steps) == "Hi café 🙂"
    assert steps[-1].finish_reason == "stop" and steps[-1].text == ""
    assert all(s.finish_reason is None for s in steps[:-1])


def test_max_tokens_ends_with_length(vocab: Vocab) -> None:
    ids = _ids(vocab, "one two three four")
    steps = generate(vocab, ids, 2)
    assert len(steps) == 2
    assert steps[-1].finish_reason == "length"
    assert "".join(s.text for s in steps) == vocab.decode(ids[:2])


@pytest.mark.parametrize(
    ("stop", "expected"),
    [(["three"], "one two "), (["o t"], "one tw"), (["x", " f"], "one two three"), (["zzz"], None)],
)
def test_stop_strings_cut_the_text(vocab: Vocab, stop: list[str], expected: str | None) -> None:
    text = "one two three four"
    steps = generate(vocab, _ids(vocab, text), None, stop)
    assert "".join(s.text for s in steps) == (expected if expected is not None else text)
    assert steps[-1].finish_reason == "stop"
    assert steps[-1].stop_reason == (
        None if expected is None else next(s for s in stop if s in text)
    )


def test_stop_token_ids(vocab: Vocab) -> None:
    ids = _ids(vocab, "alpha beta gamma")
    steps = generate(vocab, ids, None, (), [ids[1]])
    assert steps[-1].stop_reason == ids[1]
    assert "".join(s.text for s in steps) == vocab.decode(ids[:1])
