"""Incremental detokenization: a decode node's token ids in, completed text out.

Each push returns only the text its ids complete, at O(1) work per token: a character
split across tokens is held until whole, and the concatenation of all outputs equals
`tokenizer.decode(all_ids)`, which is also what vLLM streams (neither applies
transformers' `clean_up_tokenization_spaces`). Byte-level BPE vocabularies (DeepSeek,
GLM) can use a precomputed id -> bytes table (`ByteLevelVocab`) with an incremental
UTF-8 decoder; otherwise the work is done by `tokenizers.decoders.DecodeStream`.
"""

from __future__ import annotations

from codecs import utf_8_decode
from collections.abc import Iterable, Sequence

import tokenizers
from tokenizers.decoders import ByteLevel, DecodeStream

_REPLACEMENT = "\ufffd"
# vLLM primes its DecodeStream with at most this many prompt tokens.
_PRIME_MAX = 24
_PRIME_MIN = 4


class ByteLevelVocab:
    """Immutable id -> bytes table for a tokenizer whose decoder is plain ByteLevel.

    Building it walks the whole vocabulary (~0.1-0.3 s), so build it once per tokenizer
    at startup and share it between requests.
    """

    __slots__ = ("added", "special_ids", "token_bytes")

    def __init__(
        self,
        token_bytes: dict[int, bytes | None],
        added: dict[int, str],
        special_ids: frozenset[int],
    ) -> None:
        self.token_bytes = token_bytes  # None marks an added token
        self.added = added  # added-token id -> its literal content
        self.special_ids = special_ids

    @classmethod
    def from_tokenizer(cls, tokenizer: tokenizers.Tokenizer) -> ByteLevelVocab | None:
        """The table for `tokenizer`, or None if its decoder is not plain ByteLevel."""
        if not isinstance(tokenizer.decoder, ByteLevel):
            return None
        to_byte = _unicode_to_byte()
        added_tokens = tokenizer.get_added_tokens_decoder()
        added = {i: t.content for i, t in added_tokens.items()}
        special = frozenset(i for i, t in added_tokens.items() if t.special)
        table: dict[int, bytes | None] = dict.fromkeys(added)
        for i in range(tokenizer.get_vocab_size(with_added_tokens=True)):
            if i in added:
                continue
            token = tokenizer.id_to_token(i)
            if token is None:
                continue
            try:
                table[i] = bytes([to_byte[c] for c in token])
            except KeyError:
                # The ByteLevel decoder keeps a token with a char outside its alphabet
                # as that token's own UTF-8 bytes.
                table[i] = token.encode()
        return cls(table, added, special)


def _unicode_to_byte() -> dict[str, int]:
    """Inverse of byte-level BPE's byte -> printable character map (GPT-2's alphabet)."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    shifted = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + shifted)
            shifted += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


class IncrementalDetokenizer:
    """O(1) work per token: never re-decodes a growing window of the output.

    With `vocab` (a `ByteLevelVocab` of the same tokenizer) the table path is used,
    about twice as fast; without it, `tokenizers.decoders.DecodeStream`. Both produce
    exactly `tokenizer.decode(all_ids, skip_special_tokens=...)` when concatenated.

    `prompt_ids` gives decoders that strip a leading space (Metaspace) the context vLLM
    gives them, so the first token keeps its space as in vLLM's output (and unlike a
    one-shot decode of the output alone); a byte-level decoder is concatenative and
    ignores it.
    """

    __slots__ = ()

    def __new__(
        cls,
        tokenizer: tokenizers.Tokenizer,
        *,
        skip_special_tokens: bool,
        prompt_ids: Sequence[int] | None = None,
        vocab: ByteLevelVocab | None = None,
    ) -> IncrementalDetokenizer:
        # Like pathlib.Path, construction picks the implementation, so the hot path
        # pays no delegation call.
        if cls is IncrementalDetokenizer:
            cls = _TableDetokenizer if vocab is not None else _StreamDetokenizer
        return object.__new__(cls)

    def push(self, ids: Iterable[int]) -> str:
        """Text newly completed by `ids` (empty while a character is still split)."""
        raise NotImplementedError

    def flush(self) -> str:
        """At the end: any text still held, a dangling partial character as U+FFFD."""
        raise NotImplementedError


class _TableDetokenizer(IncrementalDetokenizer):
    """Byte-level path: table lookups plus an incremental UTF-8 decode.

    Mirrors `tokenizers`' decode: bytes of consecutive regular tokens are joined and
    decoded with U+FFFD for invalid sequences; an added token ends that run (a partial
    character before it becomes U+FFFD) and contributes its literal content; skipped
    special tokens vanish without ending the run; unknown ids produce nothing.
    """

    __slots__ = ("_added", "_bytes", "_skip", "_special", "_tail")

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        skip_special_tokens: bool,
        prompt_ids: Sequence[int] | None = None,
        vocab: ByteLevelVocab | None = None,
    ) -> None:
        assert vocab is not None
        self._bytes = vocab.token_bytes
        self._added = vocab.added
        self._special = vocab.special_ids
        self._skip = skip_special_tokens
        self._tail = b""  # an incomplete UTF-8 sequence awaiting its next bytes

    def push(self, ids: Iterable[int]) -> str:
        if type(ids) is not list:
            ids = list(ids)
        get = self._bytes.get
        try:
            # An added token is None in the table: join raises, and the slow path takes it.
            data = b"".join([get(i, b"") for i in ids])  # type: ignore[misc]
        except TypeError:  # an added token (None in the table) is among the ids
            return self._push_with_added(ids)
        if self._tail:
            data = self._tail + data
        text, used = utf_8_decode(data, "replace", False)
        self._tail = data[used:]
        return text

    def flush(self) -> str:
        return self._decode(b"", final=True)

    def _push_with_added(self, ids: list[int]) -> str:
        get = self._bytes.get
        parts: list[str] = []
        run: list[bytes] = []
        for i in ids:
            content = self._added.get(i)
            if content is None:
                run.append(get(i) or b"")
            elif not (self._skip and i in self._special):
                parts.append(self._decode(b"".join(run), final=True))
                parts.append(content)
                run = []
        parts.append(self._decode(b"".join(run), final=False))
        return "".join(parts)

    def _decode(self, data: bytes, *, final: bool) -> str:
        if self._tail:
            data = self._tail + data
        text, used = utf_8_decode(data, "replace", final)
        self._tail = data[used:]
        return text


class _StreamDetokenizer(IncrementalDetokenizer):
    """Generic path over `DecodeStream`, which decodes only the last emitted chunk's ids
    plus the new ones, and holds text while it ends in U+FFFD (a split character).

    Held ids pile up only while the text ends in U+FFFD or gains nothing (a split
    character, skipped special tokens, a run of invalid bytes), as in vLLM.
    """

    __slots__ = ("_context", "_held", "_skip", "_stream", "_tokenizer")

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        skip_special_tokens: bool,
        prompt_ids: Sequence[int] | None = None,
        vocab: ByteLevelVocab | None = None,
    ) -> None:
        skip = skip_special_tokens
        self._tokenizer = tokenizer
        self._skip = skip
        # Mirror of DecodeStream's window: ids of the last chunk that produced text
        # (`_context`) and ids pushed since (`_held`); flush needs both.
        self._context = _prime_ids(tokenizer, prompt_ids) if prompt_ids else []
        self._held: list[int] = []
        self._stream = DecodeStream(ids=self._context, skip_special_tokens=skip)

    def push(self, ids: Iterable[int]) -> str:
        if type(ids) is not list:
            ids = list(ids)
        if not ids:
            return ""
        self._held += ids
        try:
            text = self._stream.step(self._tokenizer, ids)
        except Exception as exc:
            if "Invalid prefix" not in str(exc):
                raise
            # A decoder whose output is not monotonic in its input (vLLM issue 17448)
            # breaks the stream's invariant; restart it from the held ids, as vLLM does.
            self._stream = DecodeStream(skip_special_tokens=self._skip)
            self._context = []
            text = self._stream.step(self._tokenizer, self._held)
        if text is None:
            return ""
        self._context, self._held = self._held, []
        return text

    def flush(self) -> str:
        if not self._held:
            return ""
        decode = self._tokenizer.decode
        before = decode(self._context, skip_special_tokens=self._skip)
        after = decode(self._context + self._held, skip_special_tokens=self._skip)
        self._context, self._held = self._context + self._held, []
        self._stream = DecodeStream(ids=self._context, skip_special_tokens=self._skip)
        return after[len(before) :] if after.startswith(before) else after


def _prime_ids(tokenizer: tokenizers.Tokenizer, prompt_ids: Sequence[int]) -> list[int]:
    """The shortest prompt suffix (4-24 tokens) that decodes to whole characters.

    vLLM primes with the same kind of suffix; when none is clean we start without
    context rather than let the output's first bytes join a partial prompt character.
    """
    ids = list(prompt_ids)
    if len(ids) <= _PRIME_MIN:
        return ids if _REPLACEMENT not in tokenizer.decode(ids) else []
    for n in range(_PRIME_MIN, min(len(ids), _PRIME_MAX) + 1):
        suffix = ids[-n:]
        if _REPLACEMENT not in tokenizer.decode(suffix):
            return suffix
    return []
