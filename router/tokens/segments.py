"""Encodes prompts piece by piece, the ids of each piece cached, so that a conversation's
earlier messages are not encoded again every turn.

A `tokenizers` Tokenizer splits its input at added tokens before it normalises and
pre-tokenises it, and encodes each piece between them on its own: the ids of a text are
those of its pieces, in order, with each added token's id between them. Chat templates
put special tokens at every message boundary, so a conversation's text splits into pieces
that come back unchanged turn after turn; only the new ones are encoded.

That equality needs added tokens that do not reach into their neighbours (`lstrip`,
`rstrip`, `single_word`), an identity normaliser where tokens are matched in normalised
text (and none of those able to take the place of another token), a pre-tokeniser whose
splits do not depend on where in the text they are, and a deterministic model. A
tokenizer without all of these is encoded as one text, as before.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import tokenizers

# Long texts are encoded a slice at a time, a few slices per call: the tokenizer's memory
# stays bounded (a whole 8 MB prompt took over 2 GB), and counting stops at the cap. Slices
# end at whitespace where they can, so a slice boundary splits a token rarely (by at most
# one token per slice when it does).
SLICE_CHARS = 64 * 1024
SLICES_PER_CALL = 4
BATCH_CHARS = SLICES_PER_CALL * SLICE_CHARS

# The cache's bound, in token ids (4 bytes each in the cache), each entry charged
# ENTRY_COST more for its key, array and slot (some 220 bytes): about 16 MB per
# tokenizer when full, whether its pieces are short or long.
MAX_CACHED_TOKENS = 4_000_000
ENTRY_COST = 64

# Pieces looked up per encoding call at most, so that a prompt of many small pieces is
# encoded (and a count checked against its cap) as it goes.
WINDOW_PIECES = 4096
# Characters scanned for added tokens per regex call.
SCAN_CHARS = 64 * 1024

# Pre-tokenisers that split every piece the same wherever it stands in the text.
_POSITION_FREE = frozenset(
    {"Split", "Digits", "Whitespace", "WhitespaceSplit", "Punctuation", "BertPreTokenizer"}
)
_MODELS = frozenset({"BPE", "WordPiece", "WordLevel", "Unigram"})


class SegmentCache:
    """Piece digest -> token ids, least recently used first out, bounded by the ids it holds.
    Safe to share between threads."""

    def __init__(self, max_tokens: int = MAX_CACHED_TOKENS) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[bytes, array[int]] = OrderedDict()
        self._charged = 0
        self._lock = threading.Lock()

    def get(self, key: bytes) -> array[int] | None:
        with self._lock:
            ids = self._entries.get(key)
            if ids is not None:
                self._entries.move_to_end(key)
            return ids

    def put(self, key: bytes, ids: array[int]) -> None:
        cost = len(ids) + ENTRY_COST
        if cost > self.max_tokens:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._charged -= len(old) + ENTRY_COST
            self._entries[key] = ids
            self._charged += cost
            while self._charged > self.max_tokens:
                _, evicted = self._entries.popitem(last=False)
                self._charged -= len(evicted) + ENTRY_COST

    @property
    def charged(self) -> int:
        """The ids held plus ENTRY_COST per entry: never above `max_tokens`."""
        return self._charged

    def __len__(self) -> int:
        return len(self._entries)


def split_is_exact(tokenizer: tokenizers.Tokenizer) -> bool:
    """Whether encoding a text equals encoding its pieces between added tokens."""
    added = list(tokenizer.get_added_tokens_decoder().values())
    if any(t.lstrip or t.rstrip or t.single_word for t in added):
        return False
    normaliser = _state(tokenizer.normalizer)
    if any(t.normalized for t in added) and not _is_identity(normaliser):
        return False
    normalised = [t.content for t in added if t.normalized]
    if normalised and pre_empts(normalised, [t.content for t in added if not t.normalized]):
        return False
    if not _position_free(_state(tokenizer.pre_tokenizer)):
        return False
    # (the model's own state would serialise its whole vocabulary)
    model = tokenizer.model
    if type(model).__name__ not in _MODELS or getattr(model, "dropout", None) is not None:
        return False
    return tokenizer.truncation is None and tokenizer.padding is None


def _state(component: Any) -> dict[str, Any] | None:
    if component is None:
        return None
    state: dict[str, Any] = json.loads(component.__getstate__())
    return state


def _is_identity(normaliser: dict[str, Any] | None) -> bool:
    if normaliser is None:
        return True
    return normaliser.get("type") == "Sequence" and all(
        _is_identity(n) for n in normaliser.get("normalizers", [])
    )


def _position_free(pre_tokeniser: dict[str, Any] | None) -> bool:
    if pre_tokeniser is None:
        return True
    kind = pre_tokeniser.get("type")
    if kind == "Sequence":
        return all(_position_free(p) for p in pre_tokeniser.get("pretokenizers", []))
    if kind == "ByteLevel":  # its optional prefix space is a per-piece choice; keep it off
        return not pre_tokeniser.get("add_prefix_space", False)
    return kind in _POSITION_FREE


class Splitter:
    """Cuts a text at its added tokens as the tokenizer does, and the text between them
    into slices of at most SLICE_CHARS (as `slices` cuts it).

    The tokenizer matches the tokens marked `normalized` in the pieces left between the
    others (leftmost-longest, each pass); where none of them can pre-empt one of the
    others (`pre_empts`), that is the leftmost-longest match of all of them in one pass,
    which this does. The text is scanned SCAN_CHARS at a time: a regex holds the GIL
    while it runs, and a count that reaches its cap stops scanning too.
    """

    def __init__(self, tokenizer: tokenizers.Tokenizer) -> None:
        added = list(tokenizer.get_added_tokens_decoder().items())
        self._ids = {token.content: token_id for token_id, token in added if token.content}
        self._longest = max(map(len, self._ids), default=0)
        self._matcher = _matcher(list(self._ids))

    def pieces(self, text: str) -> Iterator[str | int]:
        """The text between added tokens in slices (never empty), and each token's id."""
        matcher, end = self._matcher, len(text)
        start = scanned = 0  # the text from `start` holds no token before `scanned`
        while matcher is not None and scanned < end:
            window = min(end, scanned + SCAN_CHARS)
            # Every token starting in the window ends before `window + longest`.
            match = matcher.search(text, scanned, min(end, window + self._longest))
            if match is None or match.start() >= window:
                scanned = window
                while scanned - start > SLICE_CHARS:  # the piece goes on past this slice
                    stop = _slice_end(text, start, scanned)
                    yield text[start:stop]
                    start = stop
                continue
            yield from _slices(text, start, match.start())
            yield self._ids[match.group()]
            start = scanned = match.end()
        yield from _slices(text, start, end)


def pre_empts(normalised: Iterable[str], raw: Iterable[str]) -> bool:
    """Whether a token of `normalised` can start at or before one of `raw` and overlap it
    (contain it, or end inside it), taking its place in one leftmost-longest pass where
    the tokenizer would have matched the raw token first. A raw token starting first
    wins either way."""
    normalised, raw = [t for t in normalised if t], [t for t in raw if t]
    prefixes = {t[:k] for t in raw for k in range(1, len(t))}
    if any(t[-k:] in prefixes for t in normalised for k in range(1, len(t))):
        return True
    return any(r in n for n in normalised for r in raw)


def _matcher(contents: list[str]) -> re.Pattern[str] | None:
    """A regex matching the leftmost-longest of `contents`, as a trie: one alternation of
    a thousand literals costs seconds per 100k characters, the trie milliseconds."""
    contents = [c for c in contents if c]
    if not contents:
        return None
    trie: dict[str, Any] = {}
    for content in contents:
        node = trie
        for char in content:
            node = node.setdefault(char, {})
        node[""] = {}
    return re.compile(_trie_pattern(trie))


def _trie_pattern(node: dict[str, Any]) -> str:
    branches = [re.escape(char) + _trie_pattern(child) for char, child in node.items() if char]
    if not branches:
        return ""
    body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
    # A token ending here that a longer one extends: the longer first (greedy), as the
    # tokenizer's leftmost-longest matching does.
    return f"(?:{body})?" if "" in node else body


class SegmentEncoder:
    """A tokenizer's encodings of texts, each text's pieces between added tokens cached."""

    def __init__(
        self,
        tokenizer: tokenizers.Tokenizer,
        *,
        max_cached_tokens: int = MAX_CACHED_TOKENS,
        cached: bool = True,
    ) -> None:
        """`cached=False` encodes every text whole, as for a tokenizer that cannot be
        split (for comparison)."""
        self._tokenizer = tokenizer
        self.exact = split_is_exact(tokenizer)
        self._splitter = Splitter(tokenizer) if self.exact and cached else None
        self.cache = SegmentCache(max_cached_tokens)
        self.encoded_chars = 0  # characters given to the tokenizer so far (a statistic)

    def ids(self, texts: Iterable[str]) -> list[int]:
        """The ids of the texts one after the other, each encoded on its own."""
        ids: list[int] = []
        for encoded in self._encoded(texts):
            ids.extend(encoded)
        return ids

    def count(self, texts: Iterable[str], cap: int | None = None) -> int:
        """How many ids `ids` would return, or a count of at least `cap` once it reaches
        it: nothing more is encoded then."""
        total = 0
        for encoded in self._encoded(texts):
            total += len(encoded)
            if cap is not None and total >= cap:
                return total
        return total

    def _encoded(self, texts: Iterable[str]) -> Iterator[Sequence[int]]:
        if self._splitter is None:
            for text in texts:
                yield from self._encoded_whole(text)
            return
        window: list[Sequence[int] | None] = []
        missing: dict[bytes, tuple[str, list[int]]] = {}  # digest -> (piece, its places)
        missing_chars = 0
        for piece in self._pieces(texts):
            if isinstance(piece, int):
                window.append((piece,))
            else:
                key = hashlib.blake2b(
                    piece.encode("utf-8", "surrogatepass"), digest_size=16
                ).digest()
                cached = self.cache.get(key)
                if cached is None:
                    if key not in missing:
                        missing[key] = (piece, [])
                        missing_chars += len(piece)
                    missing[key][1].append(len(window))
                window.append(cached)
            # Encoded once another slice might not fit in BATCH_CHARS.
            if missing_chars > BATCH_CHARS - SLICE_CHARS or len(window) >= WINDOW_PIECES:
                yield from self._completed(window, missing)
                window, missing, missing_chars = [], {}, 0
        if window:
            yield from self._completed(window, missing)

    def _completed(
        self, window: list[Sequence[int] | None], missing: dict[bytes, tuple[str, list[int]]]
    ) -> Iterator[Sequence[int]]:
        if missing:
            # encode_batch releases the GIL while it works; encode holds it for the whole
            # text (half a second for 200k tokens), which would stall the event loop
            # despite the thread.
            texts = [piece for piece, _ in missing.values()]
            self.encoded_chars += sum(map(len, texts))
            encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
            for (key, (_, places)), encoding in zip(missing.items(), encodings, strict=True):
                ids = array("i", encoding.ids)
                self.cache.put(key, ids)
                for place in places:
                    window[place] = ids
        for encoded in window:
            assert encoded is not None
            yield encoded

    def _pieces(self, texts: Iterable[str]) -> Iterator[str | int]:
        assert self._splitter is not None
        for text in texts:
            yield from self._splitter.pieces(text)

    def _encoded_whole(self, text: str) -> Iterator[Sequence[int]]:
        pieces = [text] if len(text) <= SLICE_CHARS else list(slices(text))
        for start in range(0, len(pieces), SLICES_PER_CALL):
            batch = pieces[start : start + SLICES_PER_CALL]
            self.encoded_chars += sum(map(len, batch))
            for encoding in self._tokenizer.encode_batch(batch, add_special_tokens=False):
                yield encoding.ids


def slices(text: str) -> Iterator[str]:
    return _slices(text, 0, len(text))


def _slices(text: str, start: int, end: int) -> Iterator[str]:
    while start < end:
        stop = _slice_end(text, start, end)
        yield text[start:stop]
        start = stop


def _slice_end(text: str, start: int, end: int) -> int:
    stop = min(start + SLICE_CHARS, end)
    if stop < end:
        space = text.rfind(" ", start + SLICE_CHARS // 2, stop)
        stop = space if space > start else stop
    return stop
